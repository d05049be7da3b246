//! Start and stop: the wiring of everything `wasmjobs run` does around the
//! jobs. No protocol lives here: the job source owns it.
//!
//! Start: connect to Redis (or start the embedded server), load the plugins
//! (compiling off the async threads), open the job source, write the first
//! heartbeat (which registers the process), recover orphans, then start the
//! outcome writer, the fetch loop, the scheduled poller, the cron poller,
//! orphan recovery, the reloader, the monitor and the heartbeat.
//!
//! Every background service is spawned through [`supervise`]: named, a
//! panic or an early end logged as an error, counted and the service made
//! again (the heartbeat among them).
//!
//! Shutdown is a tree of cancellation tokens: `done` (heartbeat, monitor)
//! → `stop` (pollers, reloader, orphan recovery) → `quiet` (the fetch loop).
//! SIGTSTP (or TSTP from the Web UI) cancels `quiet` only; "quiet" is
//! logged once the fetch loop has stopped. SIGTERM, SIGINT, TERM from the
//! Web UI or `--exit-when-empty` run [`shut_down`]: quiet, wait up to the
//! shutdown timeout for the jobs in flight (their task tracker), stop the
//! rest (each goes back to its queue through the writer), let the writer
//! record every outcome, have the job source requeue what it still holds,
//! remove the heartbeat, and stop the embedded Redis if we were its last
//! user. The signal handlers are installed before anything else, so a
//! signal during start-up is acted on as soon as start-up is done.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cancel::Cancels;
use super::cron::{CronPoller, PluginSchedules};
use super::fetched::Fetched;
use super::heartbeat::{About, Command, Heartbeat, Identity, Parts};
use super::inflight::InFlightTable;
use super::limiter::Limiter;
use super::manager::Manager;
use super::neighbours::Neighbours;
use super::outcome::{self, Counters};
use super::processor::Processor;
use super::reloader::{self, Reloader};
use super::scheduled::Poller;
use super::source::paused::Paused;
use super::source::{self, JobSource, Settings};
use super::summary::Clock;
use super::supervise;
use super::{RunOptions, RunSummary, control, fetch, monitor, os_limits};
use crate::host::sql::Databases;
use crate::metrics::Metrics;
use crate::plugin::Catalog;
use crate::redis::connect;
use crate::sandbox::{EngineConfig, Executor};

/// Runs until told to stop; returns what happened.
pub async fn run(options: RunOptions) -> Result<RunSummary> {
    let mut clock = Clock::start();
    // First of all, so that a signal during start-up (compiling plugins can
    // take seconds) is a stop once started rather than the signal's
    // default action, death.
    let mut signals = Signals::install()?;
    os_limits::prepare_for(options.concurrency);
    let redis = connect(&options.redis).await?;
    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    match &options.store {
        source::Store::Redis => {
            tracing::info!(redis = %redis.location, fetch = ?options.fetch, queues = %options.queues, concurrency = options.concurrency, threads, "starting");
        }
        source::Store::Postgres { pg, lease } => {
            tracing::info!(source = %pg.location, lease = ?lease, redis = %redis.location, queues = %options.queues, concurrency = options.concurrency, threads, "starting");
        }
    }

    let (executor, catalog) = load_plugins(&options).await?;
    let catalog = reloader::live(catalog);
    let metrics = Arc::new(Metrics::new(options.metrics));
    let identity = Identity::current();
    let paused = Paused::new(options.queues.names(), Some(metrics.clone()));
    if let Err(err) = paused.refresh(&redis).await {
        tracing::warn!("{err:#}; fetching from every queue until the paused set can be read");
    }
    let neighbours = Neighbours::new(options.queues.names(), paused.clone(), metrics.clone());
    if let Err(err) = neighbours.refresh(&redis).await {
        tracing::warn!("{err:#}; cannot tell yet whether a Ruby Sidekiq process shares our queues");
    }
    let source = source::open(
        &options.store,
        redis.clone(),
        Settings {
            mode: options.fetch,
            queues: options.queues.clone(),
            identity: identity.identity.clone(),
            max_recoveries: options.max_recoveries,
            max_payload: options.max_payload,
            dead: options.dead,
        },
        paused.clone(),
    );
    let counters = Arc::new(Counters::default());
    let inflight = Arc::new(InFlightTable::default());
    let (completions, writer) = outcome::spawn(
        source.clone(),
        counters.clone(),
        inflight.clone(),
        metrics.clone(),
        options.concurrency as usize * 2,
    );
    let limiter = Limiter::new(redis.clone(), &identity.identity);
    let turns = limiter.turns();
    let processor = Processor {
        executor: executor.clone(),
        catalog: catalog.clone(),
        metrics: metrics.clone(),
        limiter: limiter.clone(),
        redis: redis.clone(),
        tracing: options.tracing.clone(),
        neighbours: neighbours.clone(),
    };
    let cancels = Cancels::new(Some(redis.clone()), &identity.identity);
    let manager = Manager::new(
        Arc::new(processor),
        options.concurrency,
        completions,
        inflight.clone(),
        cancels.clone(),
    );

    let done = CancellationToken::new();
    let stop = done.child_token();
    let quiet = stop.child_token();
    let heartbeat = Heartbeat::new(
        redis.clone(),
        identity.clone(),
        About {
            queues: options.queues.names(),
            tag: options.tag.clone(),
            concurrency: options.concurrency,
        },
        Parts {
            inflight: inflight.clone(),
            source: source.clone(),
            catalog: catalog.clone(),
            quiet: quiet.clone(),
            counters: counters.clone(),
        },
    )
    .with_metrics(metrics.clone())
    .with_limiter(limiter);
    heartbeat.beat().await.context("writing the first heartbeat")?;
    match source.recover_orphans().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "recovered jobs left by processes that died"),
        Err(err) => tracing::warn!("orphan recovery: {err:#}"),
    }

    let tasks = TaskTracker::new();
    // Every background service is named and supervised: a panic or an
    // early end is logged and counted, and the service made again.
    let supervised = |name: &'static str, stop: &CancellationToken, make: supervise::Maker| {
        supervise::spawn(&tasks, name, metrics.clone(), stop.clone(), make);
    };
    let poller = Arc::new(Poller::new(
        redis.clone(),
        options.poll_interval,
        options.dead,
        options.max_payload,
        turns,
    ));
    supervised("scheduled poller", &stop, {
        let (poller, stop) = (poller.clone(), stop.clone());
        Box::new(move || Box::pin(poller.clone().run(stop.clone())))
    });
    // What the reloader tells the cron poller and the unserved release;
    // their receivers outlive a restart of either.
    let (served_tx, served) = mpsc::unbounded_channel();
    let served = Arc::new(tokio::sync::Mutex::new(served));
    let (schedules_tx, schedules) = mpsc::unbounded_channel();
    let schedules = Arc::new(tokio::sync::Mutex::new(schedules));
    let store = match &options.store {
        source::Store::Postgres { pg, .. } => Some((**pg).clone()),
        source::Store::Redis => None,
    };
    supervised("cron", &stop, {
        let (redis, metrics, catalog, stop) = (redis.clone(), metrics.clone(), catalog.clone(), stop.clone());
        Box::new(move || {
            // The schedules of the plugins loaded now; later changes come
            // down the channel.
            let loaded = catalog
                .load()
                .plugins()
                .iter()
                .map(|plugin| PluginSchedules::Loaded {
                    plugin: plugin.name.clone(),
                    schedules: plugin.manifest.schedules.clone(),
                })
                .collect();
            let (schedules, stop) = (schedules.clone(), stop.clone());
            let poller = CronPoller::new(redis.clone(), metrics.clone()).with_store(store.clone());
            Box::pin(async move { poller.run(loaded, &mut *schedules.lock().await, stop).await })
        })
    });
    let heartbeat = Arc::new(heartbeat);
    supervised("reloader", &stop, {
        let (dir, executor, cache) = (options.plugins.clone(), executor.clone(), options.cache.clone());
        let (catalog, reloaded, metrics, stop) = (catalog.clone(), heartbeat.reloaded(), metrics.clone(), stop.clone());
        Box::new(move || {
            let reloader = Reloader::new(dir.clone(), executor.clone(), cache.clone(), catalog.clone())
                .on_change(reloaded.clone())
                .on_new_classes(served_tx.clone())
                .on_schedules(schedules_tx.clone())
                .with_metrics(metrics.clone());
            Box::pin(reloader.run(stop.clone()))
        })
    });
    supervised("unserved release", &stop, {
        let poller = poller.clone();
        Box::new(move || Box::pin(release_unserved(poller.clone(), served.clone())))
    });
    supervised("orphan recovery", &stop, {
        let (source, stop) = (source.clone(), stop.clone());
        Box::new(move || Box::pin(source::recover_orphans_periodically(source.clone(), stop.clone())))
    });
    supervised("paused poller", &stop, {
        let (paused, redis, stop) = (paused.clone(), redis.clone(), stop.clone());
        Box::new(move || Box::pin(paused.clone().run(redis.clone(), stop.clone())))
    });
    supervised("ruby neighbours", &stop, {
        let (neighbours, redis, stop) = (neighbours.clone(), redis.clone(), stop.clone());
        Box::new(move || Box::pin(neighbours.clone().run(redis.clone(), stop.clone())))
    });
    supervised("cancel sweep", &stop, {
        let (cancels, stop) = (cancels.clone(), stop.clone());
        Box::new(move || Box::pin(cancels.clone().run(stop.clone())))
    });
    supervised("control", &stop, {
        let (redis, paused, stop) = (redis.clone(), paused.clone(), stop.clone());
        Box::new(move || {
            Box::pin(control::listen(
                redis.clone(),
                cancels.clone(),
                paused.clone(),
                stop.clone(),
            ))
        })
    });
    let (commands_tx, mut commands) = mpsc::channel(4);
    supervised("heartbeat", &done, {
        let (heartbeat, done) = (heartbeat.clone(), done.clone());
        Box::new(move || Box::pin(heartbeat.clone().run(commands_tx.clone(), done.clone())))
    });
    monitor::start(
        metrics.clone(),
        executor,
        inflight.clone(),
        options.concurrency,
        options.metrics_addr,
        done.clone(),
    )
    .await?;
    if let Some((addr, access)) = options.web.clone() {
        let jobs = match &options.store {
            source::Store::Postgres { pg, .. } => crate::web::JobStore::Postgres(pg.clone(), Default::default()),
            source::Store::Redis => crate::web::JobStore::Redis,
        };
        let dashboard =
            crate::web::bind(addr, redis.conn(), redis.location.clone(), jobs, access, done.clone()).await?;
        crate::web::announce(dashboard.bound());
        supervised("dashboard", &done, Box::new(move || Box::pin(dashboard.serve())));
    }
    let startup = clock.fetching();
    tracing::info!(identity = %identity.identity, startup_ms = startup.as_millis() as u64, "running");
    let mut fetching = Fetching::start(source.clone(), manager.clone(), inflight.clone(), quiet);
    let drained = options
        .exit_when_empty
        .then(|| monitor::drained(redis.clone(), source.clone(), inflight.clone()));
    wait_for_stop(&mut signals, &mut commands, &mut fetching, drained).await?;

    // A second SIGINT or SIGTERM while jobs finish stops them at once.
    let again = async {
        tokio::select! {
            _ = signals.int.recv() => "a second SIGINT",
            _ = signals.term.recv() => "a second SIGTERM",
        }
    };
    let requeued = shut_down(
        options.shutdown_timeout,
        Running {
            source: source.as_ref(),
            manager: &manager,
            fetching,
            stop: &stop,
            writer,
        },
        again,
    )
    .await;
    done.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks did not stop within 10 s");
    }
    if let Err(err) = heartbeat.clear().await {
        tracing::warn!("{err:#}");
    }
    if requeued.is_some() {
        source.unregister().await;
    }
    redis.close().await?;

    let summary = RunSummary {
        jobs: counters.jobs(),
        requeued: requeued.unwrap_or(0) + counters.requeued.load(Ordering::Relaxed),
        rescheduled: counters.rescheduled.load(Ordering::Relaxed),
        ..RunSummary::default()
    }
    .with_clock(&clock)
    .with_busy(inflight.busy())
    .with_metrics(&metrics);
    tracing::info!(
        processed = summary.jobs.processed,
        failed = summary.jobs.failed,
        "stopped"
    );
    Ok(summary)
}

/// The fetch loop and the jobs it took but did not start.
pub(crate) struct Fetching {
    task: Option<JoinHandle<Vec<Fetched>>>,
    leftovers: Vec<Fetched>,
    quiet: CancellationToken,
}

impl Fetching {
    /// Starts the fetch loop; it runs until `quiet`.
    pub(crate) fn start(
        source: Arc<dyn JobSource>,
        manager: Arc<Manager>,
        inflight: Arc<InFlightTable>,
        quiet: CancellationToken,
    ) -> Self {
        Self {
            task: Some(tokio::spawn(fetch::run(source, manager, inflight, quiet.clone()))),
            leftovers: Vec::new(),
            quiet,
        }
    }

    /// Goes quiet and waits until the fetch loop has stopped (no job is
    /// taken after this returns).
    pub(crate) async fn quiet(&mut self) {
        self.quiet.cancel();
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(leftovers) => self.leftovers.extend(leftovers),
                Err(err) => tracing::error!("the fetch loop failed: {err}"),
            }
        }
    }
}

/// What shutdown stops.
pub(crate) struct Running<'a> {
    pub(crate) source: &'a dyn JobSource,
    pub(crate) manager: &'a Arc<Manager>,
    pub(crate) fetching: Fetching,
    pub(crate) stop: &'a CancellationToken,
    pub(crate) writer: JoinHandle<()>,
}

/// Quiet, drain, stop what is left, record, requeue. Returns how many jobs
/// the source requeued, or `None` if not every outcome could be recorded
/// (then unfinished jobs stay held for recovery).
pub(crate) async fn shut_down(
    timeout: Duration,
    running: Running<'_>,
    again: impl Future<Output = &'static str>,
) -> Option<u64> {
    let Running {
        source,
        manager,
        mut fetching,
        stop,
        writer,
    } = running;
    fetching.quiet().await;
    stop.cancel();
    tracing::info!(
        "shutting down: no new jobs; waiting up to {:?} for {} in flight (Ctrl-C again stops them now and requeues them)",
        timeout,
        manager.busy()
    );
    let mut leftovers = fetching.leftovers;
    let drained = tokio::select! {
        biased;
        drained = drain_counting_down(manager, timeout) => drained,
        why = again => {
            tracing::warn!(jobs = manager.busy(), "{why}: stopping the jobs in flight now and requeueing them");
            false
        }
    };
    if !drained {
        if manager.busy() > 0 {
            tracing::warn!(
                jobs = manager.busy(),
                "stopping the jobs still running and requeueing them"
            );
        }
        leftovers.extend(manager.stop_all(Duration::from_secs(5)).await);
    }
    manager.close();
    let recorded = tokio::time::timeout(timeout.max(Duration::from_secs(10)), writer)
        .await
        .is_ok();
    if !recorded {
        tracing::error!(
            "could not record every outcome (is Redis reachable?); unfinished jobs stay held for this process and are recovered when it is seen dead"
        );
        return None;
    }
    let requeued = source.requeue_all(leftovers).await;
    if requeued > 0 {
        tracing::info!(jobs = requeued, "pushed unfinished jobs back to their queues");
    }
    Some(requeued)
}

/// Waits up to `timeout` for the jobs in flight to end, saying every
/// [`COUNTDOWN_EVERY`] how many are left and for how long; whether they
/// all ended.
async fn drain_counting_down(manager: &Manager, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    let drained = manager.drain(timeout);
    tokio::pin!(drained);
    let mut tick = tokio::time::interval_at(
        deadline.min(tokio::time::Instant::now() + COUNTDOWN_EVERY),
        COUNTDOWN_EVERY,
    );
    loop {
        tokio::select! {
            biased;
            drained = &mut drained => return drained,
            _ = tick.tick() => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                tracing::info!(
                    "waiting for {} in flight: {} s left (Ctrl-C again stops them now and requeues them)",
                    manager.busy(),
                    left.as_secs_f64().round()
                );
            }
        }
    }
}

/// How often a shutdown says how long it still waits.
const COUNTDOWN_EVERY: Duration = Duration::from_secs(5);

/// Opens the databases and loads the plugins on a blocking thread
/// (compiling is CPU-heavy, opening SQLite files blocks).
async fn load_plugins(options: &RunOptions) -> Result<(Arc<Executor>, Catalog)> {
    let plugins = options.plugins.clone();
    let databases = Databases::open_async(options.databases.clone(), options.data_dir.clone()).await?;
    databases.warm_up(options.concurrency as usize).await;
    let shared = databases.clone();
    let cache = options.cache.clone();
    let protected = super::protected_env(Some(&options.redis), &options.databases);
    let config = EngineConfig {
        concurrency: options.concurrency,
        limits: options.limits,
        disk: options.disk,
        fuel: options.fuel,
        keep_resident: options.keep_resident,
        ..EngineConfig::default()
    };
    let (executor, catalog) = tokio::task::spawn_blocking(move || -> Result<(Executor, Catalog)> {
        let executor = Executor::new(&config)?
            .with_databases(shared)
            .protect_env_values(protected);
        let catalog = Catalog::load(&plugins, &executor, &cache)?;
        Ok((executor, catalog))
    })
    .await
    .context("plugin loading panicked")??;
    for plugin in catalog.plugins() {
        tracing::info!(plugin = %plugin.name, version = %plugin.version, classes = ?plugin.manifest.classes, "plugin loaded");
    }
    for broken in catalog.broken() {
        tracing::error!("plugin refused: {}", broken.error);
    }
    for plugin in catalog.plugins() {
        for name in plugin
            .manifest
            .sql
            .iter()
            .filter(|name| !databases.has(name, &plugin.name))
        {
            tracing::warn!(plugin = %plugin.name, "the manifest grants database {name:?}, which this runner does not have (--db {name}=URL): its queries will fail");
        }
    }
    for (name, owner) in databases.own() {
        if !catalog.plugins().iter().any(|plugin| plugin.name == owner) {
            tracing::warn!(
                "--db {name}@{owner}: no plugin named {owner:?} is loaded (the name of its directory); it applies to a plugin of that name once one loads"
            );
        }
    }
    if catalog.plugins().is_empty() {
        tracing::warn!(dir = %options.plugins.display(), "no plugin loaded yet: jobs will retry until a plugin serves their class");
    }
    Ok((Arc::new(executor), catalog))
}

/// Enqueues the jobs waiting in `retry` for a plugin as soon as a reload
/// brings one for their class.
async fn release_unserved(poller: Arc<Poller>, served: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Vec<String>>>>) {
    let mut served = served.lock().await;
    while let Some(classes) = served.recv().await {
        match poller.release_unserved(&classes).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(jobs = n, ?classes, "enqueued jobs that were waiting for a plugin"),
            Err(err) => tracing::warn!(
                ?classes,
                "cannot release jobs waiting for a plugin (they run at their retry time): {err:#}"
            ),
        }
    }
}

/// The signals `run` answers, listened to from the start of `run`: one
/// that arrives before [`wait_for_stop`] polls is kept and acted on then.
struct Signals {
    term: Signal,
    int: Signal,
    tstp: Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            tstp: signal(SignalKind::from_raw(20)).context("installing the SIGTSTP handler")?,
        })
    }
}

/// Waits for SIGTERM/SIGINT, a Stop from the Web UI, or (with
/// `--exit-when-empty`) empty queues; SIGTSTP or Quiet from the Web UI only
/// stop fetching.
async fn wait_for_stop(
    signals: &mut Signals,
    commands: &mut mpsc::Receiver<Command>,
    fetching: &mut Fetching,
    drained: Option<impl Future<Output = ()>>,
) -> Result<()> {
    let drained = async {
        match drained {
            Some(drained) => drained.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(drained);
    loop {
        let why = tokio::select! {
            _ = signals.term.recv() => { tracing::info!("SIGTERM"); return Ok(()) }
            () = &mut drained => { tracing::info!("every queue is empty: stopping (--exit-when-empty)"); return Ok(()) }
            _ = signals.int.recv() => { tracing::info!("SIGINT"); return Ok(()) }
            _ = signals.tstp.recv() => "SIGTSTP: quiet",
            command = commands.recv() => match command {
                Some(Command::Stop) => { tracing::info!("TERM from the Web UI"); return Ok(()) }
                Some(Command::Quiet) => "TSTP from the Web UI: quiet",
                None => return Ok(()),
            },
        };
        fetching.quiet().await;
        tracing::info!("{why}");
    }
}
