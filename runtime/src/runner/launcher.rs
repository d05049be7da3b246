//! Start and stop: everything `wasmjobs run` does around the jobs.
//!
//! Start: connect to Redis (or start the embedded server), load the plugins
//! (compiling off the async threads), write the first heartbeat, recover
//! orphans, then start the outcome writer, the fetch loop, the scheduled
//! poller, orphan recovery and the heartbeat.
//!
//! Stop (SIGTERM, SIGINT, or TERM from the Web UI): go quiet (no new
//! fetches), wait up to the shutdown timeout for jobs in flight, stop the
//! rest, let the writer record every outcome, push every job still in this
//! process's in-progress list back to the front of its queue, remove the
//! heartbeat, and stop the embedded Redis if we were its last user. SIGTSTP
//! (or TSTP from the Web UI) only goes quiet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::fetch::{Burier, FetchMode, Fetched, Fetcher, MAX_BATCH, Requeuer};
use super::heartbeat::{Command, Heartbeat, Identity};
use super::manager::{InFlightTable, Manager};
use super::orphans::OrphanRecovery;
use super::outcome::{self, Counters};
use super::reloader::{self, Reloader};
use super::scheduled::Poller;
use super::{RunOptions, RunSummary, monitor, os_limits};
use crate::host::sql::Databases;
use crate::metrics::Metrics;
use crate::plugin::{Catalog, CompileCache};
use crate::redis::payload::Payload;
use crate::redis::{Redis, connect, keys};
use crate::sandbox::{EngineConfig, Executor};

/// Runs until told to stop; returns what happened.
pub async fn run(options: RunOptions) -> Result<RunSummary> {
    let started = Instant::now();
    os_limits::prepare_for(options.concurrency);
    let redis = connect(&options.redis).await?;
    tracing::info!(redis = %redis.location, fetch = ?options.fetch, queues = %options.queues, concurrency = options.concurrency, "starting");

    let (executor, catalog) = load_plugins(&options).await?;
    let metrics = Arc::new(Metrics::new(options.metrics));
    let identity = Identity::current();
    let counters = Arc::new(Counters::default());
    let fetcher = Fetcher::new(options.fetch, redis.clone(), options.queues.clone(), &identity.identity);
    let inprogress = fetcher.inprogress_key().to_owned();
    let inflight = Arc::new(InFlightTable::default());
    let (completions, writer) = outcome::spawn(
        redis.clone(),
        options.fetch,
        inprogress.clone(),
        counters.clone(),
        inflight.clone(),
        metrics.clone(),
        options.concurrency as usize * 2,
    );
    let catalog = reloader::live(catalog);
    let manager = Manager::new(
        metrics.clone(),
        executor.clone(),
        catalog.clone(),
        options.concurrency,
        completions,
        inflight.clone(),
    );
    let quiet = Arc::new(AtomicBool::new(false));
    let heartbeat = Heartbeat::new(
        redis.clone(),
        identity.clone(),
        options.queues.names(),
        &options.tag,
        manager.clone(),
        catalog.clone(),
        quiet.clone(),
    )
    .with_metrics(metrics.clone());
    heartbeat.beat().await.context("writing the first heartbeat")?;
    if options.fetch == FetchMode::Reliable {
        ::redis::cmd("SADD")
            .arg(keys::INPROGRESS_OWNERS)
            .arg(&identity.identity)
            .query_async::<()>(&mut redis.conn())
            .await
            .context("registering the in-progress list")?;
        let recovery = OrphanRecovery::new(redis.clone(), identity.clone(), options.max_recoveries);
        match recovery.sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(jobs = n, "recovered jobs left by processes that died"),
            Err(err) => tracing::warn!("orphan recovery: {err:#}"),
        }
    }
    tracing::info!(identity = %identity.identity, "running");

    let (stop_tx, stop_rx) = watch::channel(false);
    let (quiet_tx, quiet_rx) = watch::channel(false);
    tokio::spawn(Poller::new(redis.clone(), options.poll_interval).run(stop_rx.clone()));
    let (served_tx, served) = mpsc::unbounded_channel();
    tokio::spawn(
        Reloader::new(
            options.plugins.clone(),
            executor.clone(),
            cache(&options),
            catalog.clone(),
        )
        .on_new_classes(served_tx)
        .with_metrics(metrics.clone())
        .run(stop_rx.clone()),
    );
    tokio::spawn(release_unserved(
        Poller::new(redis.clone(), options.poll_interval),
        served,
    ));
    if options.fetch == FetchMode::Reliable {
        let recovery = OrphanRecovery::new(redis.clone(), identity.clone(), options.max_recoveries);
        tokio::spawn(recovery.run(stop_rx.clone()));
    }
    let (commands_tx, mut commands) = mpsc::channel(4);
    let heartbeat = Arc::new(heartbeat);
    let beating = tokio::spawn({
        let heartbeat = heartbeat.clone();
        async move { heartbeat.run(commands_tx).await }
    });
    let fetching = tokio::spawn(fetch_loop(fetcher, manager.clone(), inflight.clone(), quiet_rx));

    monitor::start(
        metrics.clone(),
        executor,
        inflight.clone(),
        options.concurrency,
        options.metrics_addr,
        stop_rx.clone(),
    )
    .await?;
    let drained = options
        .exit_when_empty
        .then(|| monitor::drained(redis.clone(), options.queues.names(), inflight.clone()));
    wait_for_stop(&mut commands, &quiet, &quiet_tx, drained).await?;

    // Shutdown.
    tracing::info!(
        "shutting down: no new jobs; waiting up to {:?} for {} in flight",
        options.shutdown_timeout,
        manager.busy()
    );
    quiet.store(true, Ordering::Relaxed);
    let _ = quiet_tx.send(true);
    let mut leftovers = fetching.await.unwrap_or_default();
    let _ = stop_tx.send(true);
    if !manager.drain(options.shutdown_timeout).await {
        let stopped = manager.abort_all();
        tracing::warn!(
            jobs = stopped.len(),
            "shutdown timeout reached: stopping jobs still running and requeueing them"
        );
        leftovers.extend(stopped);
    }
    manager.close();
    drop(commands);
    let _ = beating.await;
    let recorded = tokio::time::timeout(options.shutdown_timeout.max(Duration::from_secs(10)), writer)
        .await
        .is_ok();
    let requeued = if recorded {
        requeue(&redis, options.fetch, &inprogress, leftovers).await
    } else {
        tracing::error!(
            "could not record every outcome (is Redis reachable?); unfinished jobs stay in {inprogress} for recovery"
        );
        0
    };
    if let Err(err) = heartbeat.clear().await {
        tracing::warn!("{err:#}");
    }
    if options.fetch == FetchMode::Reliable && recorded {
        let forget = ::redis::pipe()
            .atomic()
            .cmd("SREM")
            .arg(keys::INPROGRESS_OWNERS)
            .arg(&identity.identity)
            .ignore()
            .cmd("LLEN")
            .arg(&inprogress)
            .query_async::<(u64,)>(&mut redis.conn())
            .await;
        match forget {
            Ok((0,)) => {}
            Ok((left,)) => tracing::error!("{left} jobs are still in {inprogress}; they will be recovered as orphans"),
            Err(err) => tracing::warn!("{err:#}"),
        }
    }
    redis.close().await?;

    let summary = RunSummary {
        processed: counters.processed.load(Ordering::Relaxed),
        failed: counters.failed.load(Ordering::Relaxed),
        retried: counters.retried.load(Ordering::Relaxed),
        dead: counters.dead.load(Ordering::Relaxed),
        discarded: counters.discarded.load(Ordering::Relaxed),
        requeued,
        wall: started.elapsed(),
        ..RunSummary::default()
    }
    .with_metrics(&metrics);
    tracing::info!(processed = summary.processed, failed = summary.failed, "stopped");
    Ok(summary)
}

/// Opens the databases and loads the plugins on a blocking thread
/// (compiling is CPU-heavy, opening SQLite files blocks).
async fn load_plugins(options: &RunOptions) -> Result<(Arc<Executor>, Catalog)> {
    let plugins = options.plugins.clone();
    let databases = Databases::open_async(options.databases.clone(), options.data_dir.clone()).await?;
    databases.warm_up(options.concurrency as usize).await;
    let shared = databases.clone();
    let cache = cache(options);
    let protected = super::protected_env(Some(&options.redis), &options.databases);
    let config = EngineConfig {
        concurrency: options.concurrency,
        limits: options.limits,
        disk: options.disk,
        fuel: options.fuel,
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
        let unknown = |name: &&String| !databases.names().any(|d| d == name.as_str());
        for name in plugin.manifest.sql.iter().filter(unknown) {
            tracing::warn!(plugin = %plugin.name, "the manifest grants database {name:?}, which this runner does not have (--db {name}=URL): its queries will fail");
        }
    }
    if catalog.plugins().is_empty() {
        tracing::warn!(dir = %options.plugins.display(), "no plugin loaded yet: jobs will retry until a plugin serves their class");
    }
    Ok((Arc::new(executor), catalog))
}

/// Enqueues the jobs waiting in `retry` for a plugin as soon as a reload
/// brings one for their class.
async fn release_unserved(poller: Poller, mut served: mpsc::UnboundedReceiver<Vec<String>>) {
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

/// The compilation cache of this runner (shared with reloads).
fn cache(options: &RunOptions) -> CompileCache {
    if options.no_cache {
        CompileCache::disabled()
    } else {
        CompileCache::new(options.data_dir.join("cache"))
    }
}

/// Waits for SIGTERM/SIGINT or a Stop from the Web UI; SIGTSTP or Quiet
/// from the Web UI only stop fetching.
async fn wait_for_stop(
    commands: &mut mpsc::Receiver<Command>,
    quiet: &AtomicBool,
    quiet_tx: &watch::Sender<bool>,
    drained: Option<impl Future<Output = ()>>,
) -> Result<()> {
    let drained = async {
        match drained {
            Some(drained) => drained.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(drained);
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut tstp = signal(SignalKind::from_raw(20)).context("installing the SIGTSTP handler")?;
    loop {
        let go_quiet = tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM"); return Ok(()) }
            () = &mut drained => { tracing::info!("every queue is empty: stopping (--exit-when-empty)"); return Ok(()) }
            _ = int.recv() => { tracing::info!("SIGINT"); return Ok(()) }
            _ = tstp.recv() => { tracing::info!("SIGTSTP: quiet"); true }
            command = commands.recv() => match command {
                Some(Command::Stop) => { tracing::info!("TERM from the Web UI"); return Ok(()) }
                Some(Command::Quiet) => { tracing::info!("TSTP from the Web UI: quiet"); true }
                None => return Ok(()),
            },
        };
        if go_quiet {
            quiet.store(true, Ordering::Relaxed);
            let _ = quiet_tx.send(true);
        }
    }
}

/// Takes jobs while there are free slots, until told to go quiet. Returns
/// jobs it took but did not start (to be requeued).
async fn fetch_loop(
    fetcher: Fetcher,
    manager: Arc<Manager>,
    inflight: Arc<InFlightTable>,
    mut quiet: watch::Receiver<bool>,
) -> Vec<Fetched> {
    let (found_tx, mut found) = mpsc::channel(64);
    let (armed_tx, armed_rx) = watch::channel(false);
    let waiters = fetcher.spawn_waiters(armed_rx, found_tx);
    let mut leftovers = Vec::new();
    let mut known = std::collections::HashSet::new();
    let mut backoff = Duration::from_millis(50);
    'fetching: loop {
        if *quiet.borrow() {
            break;
        }
        let permits = tokio::select! {
            permits = manager.slots(MAX_BATCH) => permits,
            _ = quiet.wait_for(|&q| q) => break,
        };
        let mut permits = permits.into_iter();
        // Jobs the blocking waiters found go first.
        while let Ok(job) = found.try_recv() {
            match permits.next() {
                Some(permit) => leftovers.extend(manager.start(job, permit)),
                None => {
                    leftovers.push(job);
                    continue 'fetching;
                }
            }
        }
        let mut permits: Vec<_> = permits.collect();
        if permits.is_empty() {
            continue;
        }
        let jobs = match fetcher.fetch(permits.len()).await {
            Ok(jobs) => {
                backoff = Duration::from_millis(50);
                if fetcher.take_doubt() {
                    // A reply was lost while Redis was away: jobs may sit in
                    // our in-progress list that nobody here knows about.
                    for job in &jobs {
                        known.insert(job.raw.clone());
                    }
                    known.extend(inflight.raws());
                    match fetcher.reconcile(&known).await {
                        Ok(0) => {}
                        Ok(n) => tracing::warn!(
                            jobs = n,
                            "requeued jobs whose fetch reply was lost while Redis was away"
                        ),
                        Err(err) => {
                            tracing::warn!("{err:#}; will check again");
                            fetcher.doubt();
                        }
                    }
                    known.clear();
                }
                jobs
            }
            Err(err) => {
                // The script may have run and only its reply been lost (the
                // connection broke mid-call): its jobs would then sit in our
                // in-progress list with nobody running them.
                fetcher.doubt();
                tracing::warn!("{err:#}; retrying in {backoff:?}");
                drop(permits);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = quiet.wait_for(|&q| q) => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if jobs.is_empty() {
            // Every queue is empty: wait in Redis, holding one slot.
            permits.truncate(1);
            let _ = armed_tx.send(true);
            let job = tokio::select! {
                job = found.recv() => job,
                _ = quiet.wait_for(|&q| q) => None,
            };
            let _ = armed_tx.send(false);
            match (job, permits.pop()) {
                (Some(job), Some(permit)) => leftovers.extend(manager.start(job, permit)),
                (Some(job), None) => leftovers.push(job),
                (None, _) => {}
            }
            continue;
        }
        for (job, permit) in jobs.into_iter().zip(permits) {
            leftovers.extend(manager.start(job, permit));
        }
    }
    let _ = armed_tx.send(false);
    found.close();
    waiters.stop().await;
    while let Some(job) = found.recv().await {
        leftovers.push(job);
    }
    leftovers
}

/// Pushes jobs back to the front of their queues at shutdown: the ones
/// given, and (reliable) anything else still in our in-progress list.
async fn requeue(redis: &Redis, mode: FetchMode, inprogress: &str, jobs: Vec<Fetched>) -> u64 {
    let requeuer = Requeuer::default();
    let mut requeued = 0;
    let mut jobs = jobs;
    if mode == FetchMode::Reliable {
        let rest: Result<Vec<Vec<u8>>, _> = ::redis::cmd("LRANGE")
            .arg(inprogress)
            .arg(0)
            .arg(-1)
            .query_async(&mut redis.conn())
            .await;
        match rest {
            Ok(rest) => {
                let given: std::collections::HashSet<String> = jobs.iter().map(|j| j.raw.clone()).collect();
                for raw in rest {
                    let raw = match String::from_utf8(raw) {
                        Ok(raw) => raw,
                        Err(err) => {
                            if let Err(err) = Burier::default()
                                .bury(redis, Some(inprogress), err.as_bytes(), "default")
                                .await
                            {
                                tracing::error!("{err:#}; it will be recovered later");
                            }
                            continue;
                        }
                    };
                    if !given.contains(&raw) {
                        let queue = Payload::parse(&raw)
                            .map(|p| p.queue().to_owned())
                            .unwrap_or_else(|_| "default".into());
                        jobs.push(Fetched { raw, queue });
                    }
                }
            }
            Err(err) => tracing::error!("cannot read {inprogress}: {err:#}; its jobs will be recovered later"),
        }
    }
    for job in jobs {
        let result = match mode {
            FetchMode::Reliable => {
                requeuer
                    .requeue(redis, inprogress, &job.raw, &job.queue, &job.raw)
                    .await
            }
            FetchMode::Basic => ::redis::cmd("RPUSH")
                .arg(keys::queue(&job.queue))
                .arg(&job.raw)
                .query_async::<()>(&mut redis.conn())
                .await
                .map(|()| true)
                .map_err(anyhow::Error::from),
        };
        match result {
            Ok(true) => requeued += 1,
            Ok(false) => {}
            Err(err) => tracing::error!(queue = %job.queue, "cannot requeue a job: {err:#}"),
        }
    }
    if requeued > 0 {
        tracing::info!(jobs = requeued, "pushed unfinished jobs back to their queues");
    }
    requeued
}
