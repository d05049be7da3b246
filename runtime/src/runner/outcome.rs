//! Writing results back: ack, retry, dead, counters — in batches.
//!
//! Units of work hand over a [`Completion`] each ([`super::unit`]); one
//! writer task drains what has accumulated (up to [`MAX_BATCH`]) and has the
//! job source record it in a single transaction
//! ([`JobSource::record`](super::source::JobSource::record)): the outcome
//! and the job's removal from the in-progress list land together or not at
//! all, and at tens of thousands of jobs a second Redis sees a few hundred
//! round trips instead of one per job. Sidekiq's `stat:*` counters are
//! summed apart and go with a batch at most every 10 ms
//! ([`super::owed`]).
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fetched::{Completion, CompletionSender, Finish};
use super::inflight::InFlightTable;
use super::job_retry::Write;
use super::owed::Owed;
use super::source::{JobSource, Stats};
use super::supervise;
use crate::metrics::{Metrics, Tally};

/// Most completions written per transaction.
pub(crate) const MAX_BATCH: usize = 1_000;
/// Longest pause between two attempts to write a batch.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Least time between two log lines about the same failing batch.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(30);

/// Process-local tallies, for the heartbeat, logs and the run summary.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// How the jobs whose outcome was written ended.
    jobs: Mutex<Tally>,
    /// Jobs stopped at a shutdown deadline and sent back to their queues.
    pub requeued: AtomicU64,
    /// Jobs over a cluster limit, sent back to `schedule` without running
    /// (not processed, not failed).
    pub rescheduled: AtomicU64,
}

impl Counters {
    /// How the jobs whose outcome was written so far ended.
    pub(crate) fn jobs(&self) -> Tally {
        *self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, batch: &[Completion]) {
        let mut requeued = 0;
        let mut rescheduled = 0;
        let mut jobs = Tally::default();
        for completion in batch {
            match &completion.finish {
                Finish::Requeue => requeued += 1,
                Finish::Outcome(write) => match write.counted() {
                    Some(counted) => jobs.count(counted),
                    None if matches!(write, Write::Reschedule { .. }) => rescheduled += 1,
                    None => {}
                },
            }
        }
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner).merge(&jobs);
        self.requeued.fetch_add(requeued, Ordering::Relaxed);
        self.rescheduled.fetch_add(rescheduled, Ordering::Relaxed);
    }
}

/// The writer's name among the background services.
pub(crate) const SERVICE: &str = "outcome writer";

/// Starts the writer. It ends once every sender is dropped and everything
/// received has been written. It is a vital service
/// ([`supervise::vital`]): a panic restarts it, the batch it held is
/// written by the next run (recorded once: a batch whose write had landed
/// is not written again), and the heartbeat waits meanwhile.
pub(crate) fn spawn(
    source: Arc<dyn JobSource>,
    counters: Arc<Counters>,
    inflight: Arc<InFlightTable>,
    metrics: Arc<Metrics>,
    capacity: usize,
) -> (CompletionSender, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(capacity.max(MAX_BATCH));
    let writer = Arc::new(Writer {
        source,
        counters,
        inflight,
        metrics,
    });
    let state = Arc::new(tokio::sync::Mutex::new(State {
        rx,
        batch: Vec::with_capacity(MAX_BATCH),
        written: false,
        owed: Owed::new(Instant::now()),
    }));
    let task = tokio::spawn(async move {
        // It ends when its senders are gone, never on a stop: what they
        // sent must be written.
        let never = CancellationToken::new();
        let make = || {
            let (writer, state) = (writer.clone(), state.clone());
            async move { writer.run(&mut *state.lock().await).await }
        };
        let restarted = || writer.metrics.process.service_restarted(SERVICE);
        supervise::vital(SERVICE, &never, make, restarted).await;
    });
    (tx, task)
}

struct Writer {
    source: Arc<dyn JobSource>,
    counters: Arc<Counters>,
    inflight: Arc<InFlightTable>,
    metrics: Arc<Metrics>,
}

/// What the writer keeps across a restart.
struct State {
    rx: mpsc::Receiver<Completion>,
    /// The batch being written; not empty after a run that died with it.
    batch: Vec<Completion>,
    /// Whether `batch` is recorded in the source.
    written: bool,
    owed: Owed,
}

impl Writer {
    async fn run(&self, state: &mut State) {
        let gauges = &self.metrics.process;
        loop {
            if state.batch.is_empty() {
                let received = match state.owed.deadline() {
                    None => state.rx.recv_many(&mut state.batch, MAX_BATCH).await,
                    Some(at) => {
                        match tokio::time::timeout_at(at.into(), state.rx.recv_many(&mut state.batch, MAX_BATCH)).await
                        {
                            Ok(received) => received,
                            // Counters owed, and no batch to carry them.
                            Err(_) => {
                                let owed = state.owed.all();
                                self.write(&[], owed, &mut state.owed, &state.rx).await;
                                continue;
                            }
                        }
                    }
                };
                if received == 0 {
                    break;
                }
                state.owed.add(Stats::of(&state.batch));
                state.written = false;
            }
            if !state.written {
                let due = state.owed.due(Instant::now());
                self.write(&state.batch, due, &mut state.owed, &state.rx).await;
                state.written = true;
            }
            self.counters.add(&state.batch);
            let released = super::source::unique::released(&state.batch);
            gauges.unique_locks_released.fetch_add(released, Ordering::Relaxed);
            self.inflight.remove(state.batch.iter().map(|c| c.id));
            state.batch.clear();
            gauges.outcomes_pending.store(state.rx.len() as u64, Ordering::Relaxed);
        }
        if !state.owed.is_empty() {
            let owed = state.owed.all();
            self.write(&[], owed, &mut state.owed, &state.rx).await;
        }
    }

    /// Records `batch` with the counters `stats` (owed by it and earlier
    /// batches), retrying with backoff until it is written.
    async fn write(&self, batch: &[Completion], stats: Stats, owed: &mut Owed, rx: &mpsc::Receiver<Completion>) {
        let gauges = &self.metrics.process;
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0u64;
        let mut logged: Option<Instant> = None;
        while let Err(err) = self.source.record(batch, &stats).await {
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
        owed.paid(stats, Instant::now());
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
