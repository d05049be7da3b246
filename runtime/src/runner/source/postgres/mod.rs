//! The PostgreSQL job source (`--source postgres://…`): the same work
//! protocol as the Redis sources, on the `wasmjobs.jobs` table
//! ([`crate::pg`] owns the schema). The runner sees [`JobSource`] and
//! nothing else; the payload is the same Sidekiq JSON, so parsing, the
//! retry policy and the ActiveJob unwrapping are shared.
//!
//! | call | what it does here |
//! |---|---|
//! | [`fetch`](JobSource::fetch) | one `UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)` claims up to *n* due jobs, in queue order, with a lease |
//! | [`wait`](JobSource::wait) | sleeps until the `LISTEN` connection hears of a job ([`wake`]), the next `run_at`, or a poll |
//! | [`record`](JobSource::record) | one transaction per batch, fenced on each job's claim ([`complete`]) |
//! | [`recover_orphans`](JobSource::recover_orphans) | the lease sweep ([`lease`]) |
//! | [`requeue_all`](JobSource::requeue_all) | releases every claim this process holds |
//!
//! Leases are renewed by this source's own task, not the Redis heartbeat.
//! Counters (`stat:processed`, …) still go to Redis after each batch, where
//! `stats`, the dashboard and Sidekiq's Web UI read them.

mod complete;
pub mod lease;
mod sql;
mod wake;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::paused::Paused;
use super::{JobSource, Settings, Stats, record};
use crate::pg::Pg;
use crate::redis::{Redis, now_f64};
use crate::runner::fetched::{Completion, Fetched, Known, Receipt};
use crate::runner::supervise;

/// The PostgreSQL job source of one process.
pub(crate) struct Postgres {
    pg: Pg,
    redis: Redis,
    settings: Settings,
    lease: Duration,
    paused: Arc<Paused>,
    wake: Arc<wake::Wake>,
    /// Jobs a waiter claimed after its caller stopped waiting; the next
    /// fetch hands them out first.
    found: Arc<Mutex<Vec<Fetched>>>,
    doubt: std::sync::atomic::AtomicBool,
    /// Stops the waiters for good (at shutdown, while leases still renew).
    quit: CancellationToken,
    /// Stops the listener and the lease loop.
    stop: CancellationToken,
    /// Until when the counters are not sent to Redis, after a failure
    /// ([`COUNTERS_REST`]).
    counters_rest: Mutex<Option<std::time::Instant>>,
}

/// The longest an outcome batch waits for its counters in Redis (the
/// control plane): the jobs are recorded in PostgreSQL already.
const COUNTERS_WAIT: Duration = Duration::from_millis(500);
/// After the counters failed, batches skip them for this long: a Redis
/// that is down or hangs slows no outcome (those batches' counts are
/// lost, and said so once).
const COUNTERS_REST: Duration = Duration::from_secs(5);

impl Postgres {
    /// The source for `settings` on `pg`; starts its listener and lease
    /// loop. Counters go to `redis`.
    pub(crate) fn new(pg: Pg, redis: Redis, settings: Settings, paused: Arc<Paused>, lease: Duration) -> Self {
        let stop = CancellationToken::new();
        let wake = Arc::new(wake::Wake::default());
        // Both vital: without the lease keeper this process's claims run
        // out under its running jobs; without the listener it hears of no
        // job for a poll interval.
        let (listen_pg, queues, listen_wake, listen_stop) =
            (pg.clone(), settings.queues.names(), wake.clone(), stop.clone());
        tokio::spawn(async move {
            let make = || {
                wake::listen(
                    listen_pg.clone(),
                    queues.clone(),
                    listen_wake.clone(),
                    listen_stop.clone(),
                )
            };
            supervise::vital("PostgreSQL wake listener", &listen_stop, make, || {}).await;
        });
        let (keep_pg, identity, recoveries, keep_stop) = (
            pg.clone(),
            settings.identity.clone(),
            settings.max_recoveries,
            stop.clone(),
        );
        tokio::spawn(async move {
            let make = || lease::keep(keep_pg.clone(), identity.clone(), lease, recoveries, keep_stop.clone());
            supervise::vital("PostgreSQL lease keeper", &keep_stop, make, || {}).await;
        });
        Self {
            pg,
            redis,
            settings,
            lease,
            paused,
            wake,
            found: Arc::default(),
            doubt: Default::default(),
            quit: stop.child_token(),
            stop,
            counters_rest: Mutex::default(),
        }
    }

    /// Adds `batch` (and `stats`) to the counters in Redis, waiting at most
    /// [`COUNTERS_WAIT`], and not at all while they rest after a failure.
    async fn count(&self, batch: &[Completion], stats: &Stats) {
        let now = std::time::Instant::now();
        let rest = || self.counters_rest.lock().unwrap_or_else(PoisonError::into_inner);
        if rest().is_some_and(|until| now < until) {
            return;
        }
        let sent = tokio::time::timeout(
            COUNTERS_WAIT,
            record::send(record::counters(batch, stats, now_f64()), &self.redis),
        )
        .await;
        let failed = match sent {
            Ok(Ok(())) => {
                rest().take();
                return;
            }
            Ok(Err(err)) => format!("{err:#}"),
            Err(_) => format!("Redis did not answer within {COUNTERS_WAIT:?}"),
        };
        if rest().replace(now + COUNTERS_REST).is_none() {
            tracing::warn!(
                "could not add ended jobs to the counters in Redis: {failed}; the jobs are recorded in PostgreSQL, and their counts are left out until Redis answers"
            );
        }
    }

    /// The queues to claim from now, in this fetch's order, without the
    /// paused ones.
    fn queue_order(&self) -> Vec<String> {
        let names = self.settings.queues.names();
        let paused = self.paused.current();
        self.settings
            .queues
            .fetch_order()
            .into_iter()
            .filter_map(|i| names.get(i))
            .filter(|name| !paused.contains(*name))
            .cloned()
            .collect()
    }

    fn take_found(&self, max: usize) -> Vec<Fetched> {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        let n = max.min(found.len());
        found.drain(..n).collect()
    }

    /// Waits for a notification, the next due job, or a poll; returns
    /// early when stopped.
    async fn sleep(&self, notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) {
        let mut pause = self.wake.poll();
        let queues = self.settings.queues.names();
        if let Ok(Some(due)) = next_due(&self.pg, &queues).await {
            pause = pause.min(Duration::from_secs_f64(due.clamp(0.0, 3600.0)));
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(pause) => {}
            () = self.quit.cancelled() => {}
        }
    }
}

/// Claims up to `max` jobs from `queues` for `owner`.
async fn claim(
    pg: &Pg,
    queues: &[String],
    max: usize,
    owner: &str,
    lease: Duration,
    max_payload: usize,
) -> Result<Vec<Fetched>> {
    if queues.is_empty() || max == 0 {
        return Ok(Vec::new());
    }
    let client = pg.client().await?;
    let statement = client.prepare_cached(sql::CLAIM).await.context("claiming jobs")?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let max_bytes = i64::try_from(max_payload).unwrap_or(i64::MAX);
    let rows = client
        .query(&statement, &[&queues, &limit, &owner, &lease.as_secs_f64(), &max_bytes])
        .await
        .context("claiming jobs")?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut oversized = Oversized::default();
    for row in rows {
        let receipt = Receipt {
            row: row.get(0),
            claim: row.get(1),
        };
        let queue: String = row.get(2);
        let Some(raw) = row.get::<_, Option<String>>(3) else {
            oversized.add(receipt, &queue, row.get(4), max_payload);
            continue;
        };
        let mut job = Fetched::new(raw, queue);
        job.receipt = Some(receipt);
        jobs.push(job);
    }
    if !oversized.rows.is_empty() {
        let statement = client.prepare_cached(sql::BURY_OVERSIZED).await?;
        client
            .execute(
                &statement,
                &[
                    &oversized.rows,
                    &oversized.claims,
                    &owner,
                    &oversized.why,
                    &oversized.sizes,
                ],
            )
            .await
            .context("burying jobs over --max-payload")?;
    }
    Ok(jobs)
}

/// The claimed jobs over `--max-payload`, to bury unread.
#[derive(Default)]
struct Oversized {
    rows: Vec<i64>,
    claims: Vec<i32>,
    why: Vec<String>,
    sizes: Vec<i64>,
}

impl Oversized {
    fn add(&mut self, receipt: Receipt, queue: &str, size: i32, max_payload: usize) {
        // The reason Redis writes (the fetch script's), word for word.
        let why = format!(
            "payload of {size} bytes is larger than the {max_payload} a job may have (wasmjobs run --max-payload); not run, kept whole"
        );
        tracing::warn!(queue = %queue, "a job over --max-payload was sent to the dead set unrun (kept whole there): {why}");
        self.rows.push(receipt.row);
        self.claims.push(receipt.claim);
        self.why.push(why);
        self.sizes.push(i64::from(size));
    }
}

/// Most "no plugin" retries looked at by one [`release_unserved`].
const UNSERVED_BATCH: i64 = 10_000;

/// Makes due now the jobs in the store that wait for a retry only because
/// no plugin served their class, for those of `classes` (a reload brought
/// their plugin): as the Redis store's poller does with its `retry` set.
/// Returns how many.
pub(crate) async fn release_unserved(pg: &Pg, classes: &[String]) -> Result<u64> {
    let client = pg.client().await?;
    let rows = client
        .query(sql::UNSERVED, &[&UNSERVED_BATCH])
        .await
        .context("reading the jobs waiting for a plugin")?;
    let ids: Vec<i64> = rows
        .iter()
        .filter(|row| {
            let text: &str = row.get(1);
            crate::redis::payload::Payload::parse(text).is_ok_and(|job| classes.iter().any(|c| c == job.job_class()))
        })
        .map(|row| row.get(0))
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    client
        .execute(sql::RELEASE_UNSERVED, &[&ids])
        .await
        .context("releasing the jobs waiting for a plugin")
}

/// Seconds until a job of `queues` falls due, if any waits.
async fn next_due(pg: &Pg, queues: &[String]) -> Result<Option<f64>> {
    let client = pg.client().await?;
    let statement = client.prepare_cached(sql::NEXT_DUE).await?;
    Ok(client.query_one(&statement, &[&queues]).await?.get(0))
}

impl JobSource for Postgres {
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>> {
        async move {
            let mut jobs = self.take_found(max);
            if jobs.len() < max {
                let queues = self.queue_order();
                let claimed = claim(
                    &self.pg,
                    &queues,
                    max - jobs.len(),
                    &self.settings.identity,
                    self.lease,
                    self.settings.max_payload,
                )
                .await;
                match claimed {
                    Ok(claimed) => jobs.extend(claimed),
                    Err(err) => {
                        // The claim may have committed with its reply lost.
                        self.doubt();
                        self.found.lock().unwrap_or_else(PoisonError::into_inner).extend(jobs);
                        return Err(err);
                    }
                }
            }
            Ok(jobs)
        }
        .boxed()
    }

    fn wait(&self) -> BoxFuture<'_, Option<Fetched>> {
        async move {
            let mut failures = 0u32;
            while !self.quit.is_cancelled() {
                let notified = self.wake.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if let Some(job) = self.take_found(1).pop() {
                    return Some(job);
                }
                // Claimed by a task of its own, so a job claimed after this
                // future is dropped is kept for the next fetch.
                let (pg, queues, owner) = (self.pg.clone(), self.queue_order(), self.settings.identity.clone());
                let (lease, max_payload, found) = (self.lease, self.settings.max_payload, self.found.clone());
                let claimed = tokio::spawn(async move {
                    let jobs = claim(&pg, &queues, 1, &owner, lease, max_payload).await?;
                    let any = !jobs.is_empty();
                    found.lock().unwrap_or_else(PoisonError::into_inner).extend(jobs);
                    anyhow::Ok(any)
                })
                .await;
                match claimed {
                    Ok(Ok(true)) => continue,
                    Ok(Ok(false)) => failures = 0,
                    Ok(Err(err)) => {
                        self.doubt();
                        if failures == 0 {
                            tracing::warn!("{err:#}; retrying");
                        }
                        failures += 1;
                    }
                    Err(err) => tracing::warn!("the claim task failed: {err}"),
                }
                self.sleep(notified).await;
            }
            None
        }
        .boxed()
    }

    fn stop_waiting(&self) -> BoxFuture<'_, Vec<Fetched>> {
        async move {
            self.quit.cancel();
            self.take_found(usize::MAX)
        }
        .boxed()
    }

    fn doubt(&self) {
        self.doubt.store(true, std::sync::atomic::Ordering::Release);
    }

    fn take_doubt(&self) -> bool {
        self.doubt.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    fn reconcile<'a>(&'a self, known: &'a Known) -> BoxFuture<'a, Result<usize>> {
        async move {
            // By row: a payload need not be unique, and matching payloads
            // would ship every held one back to PostgreSQL.
            let mut known: Vec<i64> = known.rows.iter().copied().collect();
            known.extend(
                self.found
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter_map(|job| job.receipt.map(|r| r.row)),
            );
            let client = self.pg.client().await?;
            let n = client
                .execute(sql::RELEASE_UNKNOWN, &[&self.settings.identity, &known])
                .await
                .context("releasing jobs whose claim reply was lost")?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        }
        .boxed()
    }

    fn register(&self, _pipe: &mut redis::Pipeline) {
        // Leases, renewed by this source's own loop, say which process
        // holds which job; the Redis heartbeat only shows the process.
    }

    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>> {
        async move {
            let plan = complete::Plan::of(batch);
            if plan.foreign > 0 {
                tracing::warn!(jobs = plan.foreign, "ended jobs that did not come from PostgreSQL: nothing to record");
            }
            if plan.len() > 0 {
                let mut client = self.pg.client().await?;
                let tx = client.transaction().await.context("recording ended jobs")?;
                let written = plan.run(&tx, &self.settings.identity).await?;
                if plan.buries() {
                    trim(&tx, &self.settings.dead).await?;
                }
                tx.commit().await.context("committing ended jobs")?;
                let lost = plan.len() as u64 - written.min(plan.len() as u64);
                if lost > 0 {
                    tracing::warn!(
                        jobs = lost,
                        "ended jobs whose lease had run out and were claimed again elsewhere: their new holder writes their outcome"
                    );
                }
                if plan.releases() {
                    self.wake.notify.notify_waiters();
                }
            }
            self.count(batch, stats).await;
            Ok(())
        }
        .boxed()
    }

    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64> {
        async move {
            let released = async {
                let client = self.pg.client().await?;
                client
                    .execute(sql::RELEASE_ALL, &[&self.settings.identity])
                    .await
                    .context("releasing this process's jobs")
            };
            match released.await {
                Ok(n) => n,
                Err(err) => {
                    tracing::warn!(
                        jobs = jobs.len(),
                        "{err:#}; they come back when their lease runs out ({:?})",
                        self.lease
                    );
                    0
                }
            }
        }
        .boxed()
    }

    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        async move {
            let (requeued, buried) = lease::sweep(&self.pg, self.settings.max_recoveries).await?;
            Ok(usize::try_from(requeued + buried).unwrap_or(0))
        }
        .boxed()
    }

    fn waiting(&self) -> BoxFuture<'_, Result<u64>> {
        async move {
            let client = self.pg.client().await?;
            let row = client
                .query_one(sql::WAITING, &[&self.settings.queues.names()])
                .await
                .context("counting waiting jobs")?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        }
        .boxed()
    }

    fn unregister(&self) -> BoxFuture<'_, ()> {
        async move { self.stop.cancel() }.boxed()
    }
}

/// Trims the dead table to its caps (both kinds).
async fn trim(tx: &deadpool_postgres::Transaction<'_>, caps: &super::DeadCaps) -> Result<()> {
    let statement = tx.prepare_cached(sql::TRIM).await?;
    let max = i64::try_from(caps.max_jobs).unwrap_or(i64::MAX);
    let age = caps.timeout.as_secs_f64();
    for kind in ["dead", "cancelled"] {
        tx.execute(&statement, &[&kind, &age, &max])
            .await
            .context("trimming wasmjobs.dead")?;
    }
    Ok(())
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
