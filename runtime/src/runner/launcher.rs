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
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::by_shard::ByShard;
use super::cancel::Cancels;
use super::cron::{CronPoller, PluginSchedules, QueueFilter};
use super::fetched::{CompletionSender, Fetched};
use super::heartbeat::{About, Command, Heartbeat, Identity, Parts};
use super::inflight::InFlightTable;
use super::limiter::Limiter;
use super::manager::Manager;
use super::outcome::{self, Counters};
use super::processor::Processor;
use super::reloader::{self, Reloader};
use super::scheduled::Poller;
use super::shard::{self, Shard};
use super::source::sharded::{Part, Sharded};
use super::source::{self, JobSource, Settings};
use super::summary::Clock;
use super::supervise;
use super::{RunOptions, RunSummary, control, fetch, monitor, os_limits};
use crate::host::sql::Databases;
use crate::metrics::Metrics;
use crate::plugin::Catalog;
use crate::redis::Redis;
use crate::sandbox::{EngineConfig, Executor};

/// Runs until told to stop; returns what happened.
pub async fn run(options: RunOptions) -> Result<RunSummary> {
    let mut clock = Clock::start();
    // First of all, so that a signal during start-up (compiling plugins can
    // take seconds) is a stop once started rather than the signal's
    // default action, death.
    let mut signals = Signals::install()?;
    os_limits::prepare_for(options.concurrency);
    let metrics = Arc::new(Metrics::new(options.metrics));
    let shards = shard::open(&options.shards, &options.queues, &metrics).await?;
    let sharded = options.shards.is_sharded();
    // What is the process's rather than a queue's lives on the default shard.
    let redis = shards[0].redis.clone();
    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    match &options.store {
        source::Store::Redis => {
            tracing::info!(redis = %redis.location, shards = shards.len(), fetch = ?options.fetch, queues = %options.queues, concurrency = options.concurrency, threads, "starting");
        }
        source::Store::Postgres { pg, lease } => {
            tracing::info!(source = %pg.location, lease = ?lease, redis = %redis.location, queues = %options.queues, concurrency = options.concurrency, threads, "starting");
        }
    }

    let (executor, catalog) = load_plugins(&options).await?;
    let catalog = reloader::live(catalog);
    let identity = Identity::current();
    // A job source per shard holding some of our queues; several are
    // composed into one for the fetch loop.
    let parts: Vec<Part> = shards
        .iter()
        .filter_map(|shard| {
            let queues = shard.queues.clone()?;
            let settings = Settings {
                mode: options.fetch,
                queues,
                identity: identity.identity.clone(),
                max_recoveries: options.max_recoveries,
                max_payload: options.max_payload,
                dead: options.dead,
                sidekiq_cancels: options.sidekiq_cancels,
            };
            Some(Part {
                shard: shard.index,
                name: shard.name.clone(),
                source: source::open(&options.store, shard.redis.clone(), settings, shard.paused.clone()),
            })
        })
        .collect();
    let part_sources: Vec<(u16, Arc<dyn JobSource>)> = parts.iter().map(|p| (p.shard, p.source.clone())).collect();
    let source: Arc<dyn JobSource> = match (sharded, parts.first()) {
        (false, Some(only)) => only.source.clone(),
        _ => {
            let routes = options.shards.routes.clone();
            Arc::new(Sharded::new(parts, options.queues.clone(), move |queue| {
                u16::try_from(routes.shard_of(queue)).unwrap_or(0)
            }))
        }
    };
    let counters = Arc::new(Counters::default());
    let inflight = Arc::new(InFlightTable::default());
    // An outcome writer per shard with a source: a batch is one
    // transaction, on one Redis.
    let mut writers: Vec<Option<CompletionSender>> = vec![None; shards.len()];
    let mut writer_tasks = Vec::new();
    for (shard, part) in &part_sources {
        let (completions, writer) = outcome::spawn(
            part.clone(),
            counters.clone(),
            inflight.clone(),
            metrics.clone(),
            options.concurrency as usize * 2,
        );
        writers[usize::from(*shard)] = Some(completions);
        writer_tasks.push((*shard, writer));
    }
    let by_shard = |f: &dyn Fn(&Shard) -> Redis| ByShard::new(f(&shards[0]), shards[1..].iter().map(f));
    let limiter = Limiter::new(redis.clone(), &identity.identity);
    let turns = limiter.turns();
    let processor = Processor {
        executor: executor.clone(),
        catalog: catalog.clone(),
        metrics: metrics.clone(),
        limiter: limiter.clone(),
        redis: by_shard(&|shard| shard.redis.clone()),
        tracing: options.tracing.clone(),
        neighbours: ByShard::new(
            shards[0].neighbours.clone(),
            shards[1..].iter().map(|shard| shard.neighbours.clone()),
        ),
    };
    let cancels = Cancels::new(
        by_shard(&|shard| shard.redis.clone()).all().to_vec(),
        &identity.identity,
    );
    if options.sidekiq_cancels {
        cancels.fetch_finds_sidekiq_cancels();
    }
    let manager = Manager::new(
        Arc::new(processor),
        options.concurrency,
        writers,
        inflight.clone(),
        cancels.clone(),
    );

    let done = CancellationToken::new();
    let stop = done.child_token();
    let quiet = stop.child_token();
    // A heartbeat in each shard served, and in the default shard, where
    // the process's own figures and leases are written.
    let mut heartbeats: Vec<(Arc<Heartbeat>, &Shard)> = Vec::new();
    for shard in &shards {
        let part = part_sources.iter().find(|(index, _)| *index == shard.index);
        if part.is_none() && shard.index != 0 {
            continue;
        }
        let mut heartbeat = Heartbeat::new(
            shard.redis.clone(),
            identity.clone(),
            About {
                queues: shard.queue_names(),
                tag: options.tag.clone(),
                concurrency: options.concurrency,
                store: options.store.location(),
            },
            Parts {
                inflight: inflight.clone(),
                source: part.map(|(_, source)| source.clone()),
                catalog: catalog.clone(),
                quiet: quiet.clone(),
                counters: counters.clone(),
            },
        )
        .with_metrics(metrics.clone());
        if sharded {
            heartbeat = heartbeat.on_shard(shard.index, &shard.name);
        }
        if shard.index == 0 {
            heartbeat = heartbeat.with_limiter(limiter.clone());
            heartbeat.beat().await.context("writing the first heartbeat")?;
        } else if let Err(err) = heartbeat.beat().await {
            tracing::warn!(shard = %shard.name, "{err:#}; its queues wait until it answers");
        }
        heartbeats.push((Arc::new(heartbeat), shard));
    }
    match source.recover_orphans().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "recovered jobs left by processes that died"),
        Err(err) => tracing::warn!("orphan recovery: {err:#}"),
    }

    if let source::Store::Postgres { pg, .. } = &options.store {
        warn_of_jobs_left_in_redis(&shards, &pg.location).await;
    }

    let tasks = TaskTracker::new();
    // Every background service is named and supervised: a panic or an
    // early end is logged and counted, and the service made again.
    let supervised = |name: &'static str, stop: &CancellationToken, make: supervise::Maker| {
        supervise::spawn(&tasks, name, metrics.clone(), stop.clone(), make);
    };
    // A service of one shard: named after it when there are several.
    let of_shard = |name: &'static str, shard: &Shard| -> &'static str {
        match sharded {
            true => Box::leak(format!("{name} ({})", shard.name).into_boxed_str()),
            false => name,
        }
    };
    // With several shards, what a shard's services log names the shard.
    let span_of = |shard: &Shard| sharded.then(|| tracing::info_span!("shard", shard = %shard.name));
    let mut pollers = Vec::new();
    for shard in &shards {
        let poller = Arc::new(Poller::new(
            shard.redis.clone(),
            options.poll_interval,
            options.dead,
            options.max_payload,
            turns.clone(),
        ));
        supervised(of_shard("scheduled poller", shard), &stop, {
            let (poller, stop, span) = (poller.clone(), stop.clone(), span_of(shard));
            Box::new(move || in_span(&span, poller.clone().run(stop.clone())))
        });
        pollers.push(poller);
    }
    // What the reloader tells the cron pollers and the unserved release;
    // their receivers outlive a restart of either.
    let (served_tx, served) = mpsc::unbounded_channel();
    let served = Arc::new(tokio::sync::Mutex::new(served));
    let store = match &options.store {
        source::Store::Postgres { pg, .. } => Some((**pg).clone()),
        source::Store::Redis => None,
    };
    let mut schedule_senders = Vec::new();
    for shard in &shards {
        let (schedules_tx, schedules) = mpsc::unbounded_channel();
        schedule_senders.push(schedules_tx);
        let schedules = Arc::new(tokio::sync::Mutex::new(schedules));
        let ours: Option<QueueFilter> = sharded.then(|| {
            let (routes, index) = (options.shards.routes.clone(), usize::from(shard.index));
            Arc::new(move |queue: &str| routes.shard_of(queue) == index) as QueueFilter
        });
        supervised(of_shard("cron", shard), &stop, {
            let (redis, metrics, catalog, stop) = (shard.redis.clone(), metrics.clone(), catalog.clone(), stop.clone());
            let (store, span) = (store.clone(), span_of(shard));
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
                let (schedules, stop, span) = (schedules.clone(), stop.clone(), span.clone());
                let mut poller = CronPoller::new(redis.clone(), metrics.clone()).with_store(store.clone());
                if let Some(ours) = &ours {
                    poller = poller.with_queues(ours.clone());
                }
                in_span(&span, async move {
                    poller.run(loaded, &mut *schedules.lock().await, stop).await
                })
            })
        });
    }
    supervised("reloader", &stop, {
        let (dir, executor, cache) = (options.plugins.clone(), executor.clone(), options.cache.clone());
        let (catalog, metrics, stop) = (catalog.clone(), metrics.clone(), stop.clone());
        let reloaded: Vec<Arc<Notify>> = heartbeats.iter().map(|(heartbeat, _)| heartbeat.reloaded()).collect();
        Box::new(move || {
            let mut reloader = Reloader::new(dir.clone(), executor.clone(), cache.clone(), catalog.clone())
                .on_new_classes(served_tx.clone())
                .with_metrics(metrics.clone());
            for notify in &reloaded {
                reloader = reloader.on_change(notify.clone());
            }
            for schedules in &schedule_senders {
                reloader = reloader.on_schedules(schedules.clone());
            }
            Box::pin(reloader.run(stop.clone()))
        })
    });
    supervised("unserved release", &stop, {
        let (pollers, store) = (pollers.clone(), store.clone());
        Box::new(move || Box::pin(release_unserved(pollers.clone(), store.clone(), served.clone())))
    });
    supervised("orphan recovery", &stop, {
        let (source, stop) = (source.clone(), stop.clone());
        Box::new(move || Box::pin(source::recover_orphans_periodically(source.clone(), stop.clone())))
    });
    supervised("cancel sweep", &stop, {
        let (cancels, stop) = (cancels.clone(), stop.clone());
        Box::new(move || Box::pin(cancels.clone().run(stop.clone())))
    });
    for shard in shards.iter().filter(|shard| shard.queues.is_some()) {
        supervised(of_shard("paused poller", shard), &stop, {
            let (paused, redis, stop, span) = (shard.paused.clone(), shard.redis.clone(), stop.clone(), span_of(shard));
            Box::new(move || in_span(&span, paused.clone().run(redis.clone(), stop.clone())))
        });
        supervised(of_shard("ruby neighbours", shard), &stop, {
            let (neighbours, redis, stop, span) = (
                shard.neighbours.clone(),
                shard.redis.clone(),
                stop.clone(),
                span_of(shard),
            );
            Box::new(move || in_span(&span, neighbours.clone().run(redis.clone(), stop.clone())))
        });
        supervised(of_shard("control", shard), &stop, {
            let (redis, index, paused, stop) = (shard.redis.clone(), shard.index, shard.paused.clone(), stop.clone());
            let (cancels, span) = (cancels.clone(), span_of(shard));
            Box::new(move || {
                in_span(
                    &span,
                    control::listen(redis.clone(), index, cancels.clone(), paused.clone(), stop.clone()),
                )
            })
        });
    }
    let (commands_tx, mut commands) = mpsc::channel(4);
    for (heartbeat, shard) in &heartbeats {
        supervised(of_shard("heartbeat", shard), &done, {
            let (heartbeat, done, commands_tx) = (heartbeat.clone(), done.clone(), commands_tx.clone());
            let span = span_of(shard);
            Box::new(move || in_span(&span, heartbeat.clone().run(commands_tx.clone(), done.clone())))
        });
    }
    if redis.is_embedded() {
        supervised("embedded redis keeper", &done, {
            let (redis, done) = (redis.clone(), done.clone());
            Box::new(move || Box::pin(redis.clone().keep_embedded_up(done.clone())))
        });
    }
    drop(commands_tx);
    let watching = monitor::start(
        metrics.clone(),
        executor,
        inflight.clone(),
        options.concurrency,
        options.metrics_addr,
        done.clone(),
    )
    .await?;
    for (name, make) in watching {
        supervised(name, &done, make);
    }
    if let Some((addr, access)) = options.web.clone() {
        let jobs = match &options.store {
            source::Store::Postgres { pg, .. } => crate::web::JobStore::Postgres(pg.clone(), Default::default()),
            source::Store::Redis => crate::web::JobStore::Redis,
        };
        let sites = shards
            .iter()
            .map(|shard| crate::web::Site {
                name: shard.name.clone(),
                conn: shard.redis.conn(),
                location: shard.redis.location.clone(),
            })
            .collect();
        let dashboard = crate::web::bind(addr, sites, jobs, access, done.clone()).await?;
        crate::web::announce(dashboard.bound());
        supervised("dashboard", &done, Box::new(move || Box::pin(dashboard.serve())));
    }
    let startup = clock.fetching();
    tracing::info!(identity = %identity.identity, startup_ms = startup.as_millis() as u64, "running");
    let mut fetching = Fetching::start(
        source.clone(),
        manager.clone(),
        inflight.clone(),
        quiet,
        Some(metrics.clone()),
    );
    let drained = options
        .exit_when_empty
        .then(|| monitor::drained(by_shard(&|shard| shard.redis.clone()), source.clone(), inflight.clone()));
    wait_for_stop(&mut signals, &mut commands, &mut fetching, drained).await?;

    // A second SIGINT or SIGTERM while jobs finish stops them at once.
    let again = async {
        tokio::select! {
            _ = signals.int.recv() => "a second SIGINT",
            _ = signals.term.recv() => "a second SIGTERM",
        }
    };
    let stopped = shut_down(
        options.shutdown_timeout,
        Running {
            source: source.as_ref(),
            manager: &manager,
            fetching,
            stop: &stop,
            writers: writer_tasks,
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
    for (heartbeat, _) in &heartbeats {
        if let Err(err) = heartbeat.clear().await {
            tracing::warn!("{err:#}");
        }
    }
    if stopped.requeued.is_some() {
        source.unregister_except(&stopped.stuck).await;
    }
    for shard in shards {
        shard.redis.close().await?;
    }

    let summary = RunSummary {
        jobs: counters.jobs(),
        requeued: stopped.requeued.unwrap_or(0) + counters.requeued.load(Ordering::Relaxed),
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

/// `service` in `span` (a shard's), if any.
fn in_span(span: &Option<tracing::Span>, service: impl Future<Output = ()> + Send + 'static) -> supervise::Loop {
    match span {
        Some(span) => Box::pin(service.instrument(span.clone())),
        None => Box::pin(service),
    }
}

/// The fetch loop and the jobs it took but did not start.
pub(crate) struct Fetching {
    task: Option<JoinHandle<Vec<Fetched>>>,
    leftovers: Vec<Fetched>,
    quiet: CancellationToken,
}

impl Fetching {
    /// Starts the fetch loop; it runs until `quiet`, a vital service
    /// ([`supervise::vital`]): restarted after a panic, the jobs the dead
    /// loop took and never started put back by the reconcile that the
    /// source's doubt brings, and the heartbeat held meanwhile.
    pub(crate) fn start(
        source: Arc<dyn JobSource>,
        manager: Arc<Manager>,
        inflight: Arc<InFlightTable>,
        quiet: CancellationToken,
        metrics: Option<Arc<crate::metrics::Metrics>>,
    ) -> Self {
        let stop = quiet.clone();
        let task = tokio::spawn(async move {
            let make = || fetch::run(source.clone(), manager.clone(), inflight.clone(), stop.clone());
            let restarted = || {
                if let Some(metrics) = &metrics {
                    metrics.process.service_restarted("fetch loop");
                }
                source.doubt();
            };
            supervise::vital("fetch loop", &stop, make, restarted)
                .await
                .unwrap_or_default()
        });
        Self {
            task: Some(task),
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
    /// The outcome writers, one per shard served, with its shard.
    pub(crate) writers: Vec<(u16, JoinHandle<()>)>,
}

/// How a shutdown ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Jobs the source requeued; `None` if no shard's outcomes could all
    /// be recorded (then unfinished jobs stay held for recovery).
    pub(crate) requeued: Option<u64>,
    /// The shards whose outcomes could not all be recorded: their jobs
    /// stay held for recovery, and the process stays registered there.
    pub(crate) stuck: Vec<u16>,
}

/// Quiet, drain, stop what is left, record, requeue (on every shard whose
/// outcomes could all be recorded: one shard that is down does not leave
/// the others' jobs held).
pub(crate) async fn shut_down(
    timeout: Duration,
    running: Running<'_>,
    again: impl Future<Output = &'static str>,
) -> Stopped {
    let Running {
        source,
        manager,
        mut fetching,
        stop,
        writers,
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
    let mut writers = writers;
    let _ = tokio::time::timeout(
        timeout.max(Duration::from_secs(10)),
        futures_util::future::join_all(writers.iter_mut().map(|(_, writer)| writer)),
    )
    .await;
    let stuck: Vec<u16> = writers
        .iter()
        .filter(|(_, writer)| !writer.is_finished())
        .map(|(shard, _)| *shard)
        .collect();
    if !stuck.is_empty() {
        tracing::error!(
            ?stuck,
            "could not record every outcome (is Redis reachable?); unfinished jobs stay held for this process and are recovered when it is seen dead"
        );
        if stuck.len() == writers.len() {
            return Stopped { requeued: None, stuck };
        }
    }
    let requeued = source.requeue_all_except(leftovers, &stuck).await;
    if requeued > 0 {
        tracing::info!(jobs = requeued, "pushed unfinished jobs back to their queues");
    }
    Stopped {
        requeued: Some(requeued),
        stuck,
    }
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
    let store = match &options.store {
        super::source::Store::Postgres { pg, .. } => Some(&**pg),
        super::source::Store::Redis => None,
    };
    let protected = super::protected_env(
        options.shards.iter().map(|(_, _, target)| target),
        store,
        &options.databases,
    );
    let config = EngineConfig {
        concurrency: options.concurrency,
        limits: options.limits,
        disk: options.disk,
        fuel: options.fuel,
        keep_resident: options.keep_resident,
        ..EngineConfig::default()
    };
    let (executor, catalog) = tokio::task::spawn_blocking(move || -> Result<(Executor, Catalog)> {
        let executor = Executor::new(&config)?.with_databases(shared).protect_env(protected);
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

/// Enqueues the jobs waiting in `retry` for a plugin (on every shard) as
/// soon as a reload brings one for their class.
async fn release_unserved(
    pollers: Vec<Arc<Poller>>,
    store: Option<crate::pg::Pg>,
    served: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Vec<String>>>>,
) {
    let mut served = served.lock().await;
    while let Some(classes) = served.recv().await {
        for poller in &pollers {
            release_unserved_on(poller, &classes).await;
        }
        // Jobs kept in PostgreSQL wait for their retry there.
        if let Some(pg) = &store {
            match source::postgres::release_unserved(pg, &classes).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(jobs = n, ?classes, "enqueued jobs that were waiting for a plugin"),
                Err(err) => tracing::warn!(
                    ?classes,
                    "cannot release jobs waiting for a plugin (they run at their retry time): {err:#}"
                ),
            }
        }
    }
}

/// [`release_unserved`] of `classes` on one shard.
async fn release_unserved_on(poller: &Poller, classes: &[String]) {
    match poller.release_unserved(classes).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, ?classes, "enqueued jobs that were waiting for a plugin"),
        Err(err) => tracing::warn!(
            ?classes,
            "cannot release jobs waiting for a plugin (they run at their retry time): {err:#}"
        ),
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

/// On the PostgreSQL store, says once at start which of the queues this
/// runner serves hold jobs in Redis, where it does not look (pushed the
/// usual way, by a client that was not moved to the store).
async fn warn_of_jobs_left_in_redis(shards: &[Shard], store: &str) {
    for shard in shards {
        let queues = shard.queue_names();
        match crate::redis::stranded::waiting(&mut shard.redis.conn(), &queues).await {
            Ok(left) => {
                for (queue, jobs) in left {
                    tracing::warn!(
                        queue = %queue,
                        jobs,
                        "queue {queue} holds {jobs} jobs in Redis ({}) that this runner does not read: it reads the PostgreSQL store {store}. Enqueue into the store (wasmjobs enqueue --source URL, or its wasmjobs.enqueue function); the dashboard and wasmjobs stats list such jobs",
                        shard.redis.location
                    );
                }
            }
            Err(err) => tracing::debug!("cannot look for jobs left in Redis: {err:#}"),
        }
    }
}
