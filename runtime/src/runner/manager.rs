//! The worker pool: at most `concurrency` jobs in flight, each a task.
//!
//! A job needs a slot (a semaphore permit) before it starts; the fetch loop
//! takes slots first and fetches only as many jobs as it holds slots for, so
//! jobs never pile up in memory. The manager remembers what is in flight
//! (for the heartbeat's `:work` hash and for shutdown, when jobs still
//! running at the deadline are stopped and handed back for requeueing).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cancel::Cancels;
use super::fetched::{CompletionSender, Fetched};
use super::inflight::InFlightTable;
use super::processor::{Perform, Slots};
use super::unit::UnitOfWork;

/// How long the fetch loop may wait to gather a batch of free slots.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// The worker pool.
pub(crate) struct Manager {
    perform: Arc<dyn Perform>,
    slots: Arc<Semaphore>,
    concurrency: usize,
    /// The outcome writer of each shard, by [`Fetched::shard`].
    writers: Mutex<Option<Arc<[Option<CompletionSender>]>>>,
    /// Room for jobs waiting on a plugin's own concurrency limit.
    parking: Arc<Semaphore>,
    inflight: Arc<InFlightTable>,
    /// Every job task, so shutdown can wait for them.
    jobs: TaskTracker,
    /// Cancelled at a shutdown deadline: stops every job still running.
    stop_jobs: CancellationToken,
    /// Where running jobs are registered, so a cancel finds them.
    cancels: Arc<Cancels>,
}

impl Manager {
    /// A pool of `concurrency` slots running jobs with `perform`, handing
    /// each job's outcome to the writer of its shard in `writers` (by
    /// shard index; none for a shard the runner takes no jobs from).
    pub(crate) fn new(
        perform: Arc<dyn Perform>,
        concurrency: u32,
        writers: Vec<Option<CompletionSender>>,
        inflight: Arc<InFlightTable>,
        cancels: Arc<Cancels>,
    ) -> Arc<Self> {
        let concurrency = concurrency.max(1) as usize;
        Arc::new(Self {
            perform,
            slots: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            writers: Mutex::new(Some(writers.into())),
            parking: Arc::new(Semaphore::new(concurrency)),
            inflight,
            jobs: TaskTracker::new(),
            stop_jobs: CancellationToken::new(),
            cancels,
        })
    }

    /// Waits for free slots and takes up to `max` of them.
    ///
    /// Under load, slots free up one at a time; fetching as soon as one is
    /// free would cost a Redis round trip per job. So once one slot is free,
    /// this waits up to [`LINGER`] for a batch's worth (half the
    /// concurrency, capped by `max`) before taking whatever is free. An idle
    /// pool has every slot free and returns at once. Half, not less: at
    /// C=10 an eighth is one job per round trip (noop 29k jobs/s; half:
    /// 38k), and at C=100 half gave 86k against 74k; waiting for every slot
    /// was no better than half, as nothing overlaps the round trip then.
    pub(crate) async fn slots(&self, max: usize) -> Vec<OwnedSemaphorePermit> {
        let mut permits = Vec::new();
        let Ok(first) = self.slots.clone().acquire_owned().await else {
            return permits;
        };
        permits.push(first);
        self.take_free(&mut permits, max);
        let batch = (self.concurrency / 2).clamp(1, max);
        let held: usize = permits.iter().map(|p| p.num_permits()).sum();
        if held < batch {
            let more = (batch - held) as u32;
            if let Ok(Ok(group)) = tokio::time::timeout(LINGER, self.slots.clone().acquire_many_owned(more)).await {
                permits.push(group);
            }
            self.take_free(&mut permits, max);
        }
        // One permit per job.
        let mut single = Vec::with_capacity(permits.iter().map(|p| p.num_permits()).sum());
        for mut group in permits {
            while group.num_permits() > 1 {
                match group.split(1) {
                    Some(one) => single.push(one),
                    None => break,
                }
            }
            single.push(group);
        }
        single
    }

    fn take_free(&self, permits: &mut Vec<OwnedSemaphorePermit>, max: usize) {
        let held: usize = permits.iter().map(|p| p.num_permits()).sum();
        let free = self.slots.available_permits().min(max.saturating_sub(held));
        if free > 0
            && let Ok(group) = self.slots.clone().try_acquire_many_owned(free as u32)
        {
            permits.push(group);
        }
    }

    /// Starts `job` in the slot `permit`. After [`Manager::close`] the job
    /// is not started and is returned, for requeueing.
    pub(crate) fn start(self: &Arc<Self>, job: Fetched, permit: OwnedSemaphorePermit) -> Option<Fetched> {
        let writers = self.writers.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(writers) = writers else {
            return Some(job);
        };
        let Some(writer) = writers.get(usize::from(job.shard)).cloned().flatten() else {
            tracing::error!(shard = job.shard, queue = %job.queue, "no outcome writer for the job's shard: not started");
            return Some(job);
        };
        let unit = UnitOfWork::start(job, writer, self.inflight.clone());
        let manager = self.clone();
        // Boxed: the job's future is large (its payload, parsed job, unit
        // of work and outcome hand-over live in it), and unboxed it was
        // copied whole on every move into and through the task cell
        // (`memmove` in tokio's spawn and `set_stage`: ~2.4% of a NoopJob
        // run's CPU); boxed, those moves copy a pointer.
        self.jobs.spawn(Box::pin(async move {
            let unit = unit.parse();
            let typed = unit.job();
            let registration = typed
                .parsed
                .as_ref()
                .ok()
                .map(|(job, _)| manager.cancels.register(&job.jid, typed.fetched.shard));
            let mut runner_slot = Some(permit);
            let slots = Slots {
                runner: &mut runner_slot,
                parking: &manager.parking,
            };
            let write = tokio::select! {
                biased;
                () = manager.stop_jobs.cancelled() => None,
                write = manager.perform.perform(unit.job(), slots, registration.as_ref()) => Some(write),
            };
            match write {
                Some(write) => unit.finish(write).await,
                None => unit.requeue().await,
            }
            drop(runner_slot);
        }));
        None
    }

    /// Stops accepting jobs and lets go of the outcome writer, which ends
    /// once the jobs still running have handed over their results.
    pub(crate) fn close(&self) {
        self.writers.lock().unwrap_or_else(PoisonError::into_inner).take();
        self.jobs.close();
    }

    /// Jobs in flight now (including finished ones whose outcome is still
    /// being written).
    pub(crate) fn busy(&self) -> usize {
        self.inflight.len()
    }

    /// Waits until every job task has ended, or `timeout` passes. Returns
    /// whether they all ended.
    pub(crate) async fn drain(&self, timeout: Duration) -> bool {
        self.jobs.close();
        tokio::time::timeout(timeout, self.jobs.wait()).await.is_ok()
    }

    /// Stops every job still running: each is sent back to the front of
    /// its queue through the writer (so call this before
    /// [`Manager::close`]). Waits up to `grace` for the tasks to end; jobs
    /// whose task has not ended by then are taken out of the in-flight
    /// table and returned, for requeueing with the rest.
    pub(crate) async fn stop_all(&self, grace: Duration) -> Vec<Fetched> {
        self.stop_jobs.cancel();
        if self.drain(grace).await {
            return Vec::new();
        }
        self.inflight.stop_running()
    }
}
