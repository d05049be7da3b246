//! Writing results back: ack, retry, dead, counters — in batches.
//!
//! Processors send a [`Completion`] per job; one writer task drains what has
//! accumulated (up to [`MAX_BATCH`]) and writes it in a single `MULTI`
//! transaction: the `retry`/`dead` entry and the removal from the in-progress
//! list land together or not at all, and at tens of thousands of jobs a
//! second Redis sees a few hundred round trips instead of one per job.
//!
//! If Redis is unreachable or refuses the writes (a full Redis: `maxmemory`
//! reached with `noeviction` answers `OOM`), the batch is kept and retried
//! with backoff (up to [`MAX_BACKOFF`]); the jobs stay in the in-progress
//! list meanwhile, so nothing is lost even if the process dies before Redis
//! comes back (they are recovered as orphans). Jobs finishing meanwhile
//! queue behind the batch, and once that queue is full they wait too, each
//! holding its slot: the runner slows to a stop instead of dropping
//! anything. Never in silence: the first failure is logged at once, then at
//! most every [`LOG_EVERY`] while it lasts, and the recovery when it ends;
//! `/metrics` counts failed attempts (`wasmjobs_outcome_write_failures_total`)
//! and shows the outcomes not written yet (`wasmjobs_outcomes_pending`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::mpsc;

use super::fetch::FetchMode;
use super::job_retry::Write;
use super::manager::InFlightTable;
use crate::metrics::Metrics;
use crate::redis::{Redis, keys, now_f64, utc_date};

/// Most completions written per transaction.
pub const MAX_BATCH: usize = 1_000;
/// Longest pause between two attempts to write a batch.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Least time between two log lines about the same failing batch.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// One finished job, ready to be written.
#[derive(Debug)]
pub struct Completion {
    /// The job's entry in the in-flight table, removed once written.
    pub id: u64,
    /// The payload exactly as fetched (the in-progress list entry).
    pub raw: String,
    /// What to write.
    pub write: Write,
}

/// Process-local tallies, for the heartbeat, logs and the run summary.
#[derive(Debug, Default)]
pub struct Counters {
    /// Jobs whose outcome was written (Sidekiq's "processed": every job run).
    pub processed: AtomicU64,
    /// Jobs that failed (retry, dead or dropped).
    pub failed: AtomicU64,
    /// Failures scheduled for a retry.
    pub retried: AtomicU64,
    /// Jobs sent to the dead set.
    pub dead: AtomicU64,
    /// Jobs discarded at the guest's request.
    pub discarded: AtomicU64,
}

impl Counters {
    fn add(&self, batch: &[Completion]) {
        let count = |f: fn(&Write) -> bool| batch.iter().filter(|c| f(&c.write)).count() as u64;
        self.processed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.failed.fetch_add(count(Write::is_failure), Ordering::Relaxed);
        self.retried
            .fetch_add(count(|w| matches!(w, Write::Retry { .. })), Ordering::Relaxed);
        self.dead
            .fetch_add(count(|w| matches!(w, Write::Dead { .. })), Ordering::Relaxed);
        self.discarded
            .fetch_add(count(|w| matches!(w, Write::Discard)), Ordering::Relaxed);
    }
}

/// The writer task's input.
pub type CompletionSender = mpsc::Sender<Completion>;

/// Starts the writer. It ends once every sender is dropped and everything
/// received has been written.
pub fn spawn(
    redis: Redis,
    mode: FetchMode,
    inprogress: String,
    counters: Arc<Counters>,
    inflight: Arc<InFlightTable>,
    metrics: Arc<Metrics>,
    capacity: usize,
) -> (CompletionSender, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(capacity.max(MAX_BATCH));
    let writer = Writer {
        redis,
        mode,
        inprogress,
        counters,
        inflight,
        metrics,
    };
    (tx, tokio::spawn(writer.run(rx)))
}

struct Writer {
    redis: Redis,
    mode: FetchMode,
    inprogress: String,
    counters: Arc<Counters>,
    inflight: Arc<InFlightTable>,
    metrics: Arc<Metrics>,
}

impl Writer {
    async fn run(self, mut rx: mpsc::Receiver<Completion>) {
        let gauges = &self.metrics.process;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
            let mut backoff = Duration::from_millis(50);
            let mut attempts = 0u64;
            let mut logged: Option<Instant> = None;
            while let Err(err) = self.write(&batch).await {
                attempts += 1;
                gauges.outcome_write_failures.fetch_add(1, Ordering::Relaxed);
                let pending = batch.len() + rx.len();
                gauges.outcomes_pending.store(pending as u64, Ordering::Relaxed);
                if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    logged = Some(Instant::now());
                    tracing::error!(
                        jobs = batch.len(),
                        pending,
                        attempts,
                        "cannot record job outcomes: {err:#}{}; they stay in the in-progress list and are retried (every {MAX_BACKOFF:?} at most) until Redis takes them",
                        hint(&err)
                    );
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            if attempts > 0 {
                tracing::info!(
                    jobs = batch.len(),
                    attempts,
                    "job outcomes recorded after Redis refused them"
                );
            }
            self.counters.add(&batch);
            self.inflight.remove(batch.iter().map(|c| c.id));
            batch.clear();
            gauges.outcomes_pending.store(rx.len() as u64, Ordering::Relaxed);
        }
    }

    async fn write(&self, batch: &[Completion]) -> Result<()> {
        let now = now_f64();
        let date = utc_date(now);
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut failed = 0u64;
        let mut discarded = 0u64;
        let mut died = false;
        for completion in batch {
            if self.mode == FetchMode::Reliable {
                pipe.cmd("LREM")
                    .arg(&self.inprogress)
                    .arg(-1)
                    .arg(&completion.raw)
                    .ignore();
            }
            match &completion.write {
                Write::Ack | Write::Drop => {}
                Write::Discard => discarded += 1,
                Write::Retry { at, payload } => {
                    pipe.cmd("ZADD").arg(keys::RETRY).arg(*at).arg(payload).ignore();
                }
                Write::Dead { payload } => {
                    pipe.cmd("ZADD").arg(keys::DEAD).arg(now).arg(payload).ignore();
                    died = true;
                }
            }
            if completion.write.is_failure() {
                failed += 1;
            }
        }
        if died {
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(keys::DEAD)
                .arg("-inf")
                .arg(now - keys::DEAD_TIMEOUT_SECS)
                .ignore();
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(keys::DEAD)
                .arg(0)
                .arg(-(keys::DEAD_MAX_JOBS + 1))
                .ignore();
        }
        incr(&mut pipe, keys::STAT_PROCESSED, &date, batch.len() as u64);
        incr(&mut pipe, keys::STAT_FAILED, &date, failed);
        if discarded > 0 {
            pipe.cmd("INCRBY").arg(keys::STAT_DISCARDED).arg(discarded).ignore();
        }
        pipe.query_async::<()>(&mut self.redis.conn())
            .await
            .context("writing job outcomes")
    }
}

/// What to do about a write error, when it is a known one.
fn hint(err: &anyhow::Error) -> &'static str {
    if format!("{err:#}").contains("OOM") {
        " (Redis is full: maxmemory is reached and its policy evicts nothing; free memory or raise maxmemory)"
    } else {
        ""
    }
}

/// `INCRBY stat` and its daily twin (with Sidekiq's five-year expiry).
fn incr(pipe: &mut redis::Pipeline, stat: &str, date: &str, by: u64) {
    if by == 0 {
        return;
    }
    let daily = keys::daily(stat, date);
    pipe.cmd("INCRBY").arg(stat).arg(by).ignore();
    pipe.cmd("INCRBY").arg(&daily).arg(by).ignore();
    pipe.cmd("EXPIRE").arg(&daily).arg(keys::STATS_TTL_SECS).ignore();
}
