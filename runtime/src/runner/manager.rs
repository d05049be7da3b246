//! The worker pool: at most `concurrency` jobs in flight, each a task.
//!
//! A job needs a slot (a semaphore permit) before it starts; the fetch loop
//! takes slots first and fetches only as many jobs as it holds slots for, so
//! jobs never pile up in memory. The manager remembers what is in flight
//! (for the heartbeat's `:work` hash and for shutdown, when jobs still
//! running at the deadline are stopped and handed back for requeueing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use super::fetch::Fetched;

/// How long the fetch loop may wait to gather a batch of free slots.
pub const LINGER: Duration = Duration::from_millis(1);
use super::outcome::{Completion, CompletionSender};
use super::processor;
use super::reloader::LiveCatalog;
use crate::metrics::Metrics;
use crate::redis::now_f64;
use crate::sandbox::Executor;

/// A job being worked on.
#[derive(Debug, Clone)]
pub struct InFlight {
    /// The job as fetched.
    pub job: Fetched,
    /// When it started (epoch seconds).
    pub run_at: f64,
}

struct Entry {
    info: InFlight,
    abort: Option<AbortHandle>,
}

/// Jobs taken from Redis and not yet recorded back: running, or finished
/// with their outcome waiting in the writer. Shared by the manager (which
/// adds), the outcome writer (which removes once written) and the fetch
/// loop (which compares it with the in-progress list after a Redis error).
#[derive(Default)]
pub struct InFlightTable(Mutex<HashMap<u64, Entry>>);

impl InFlightTable {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets jobs whose outcome is recorded.
    pub fn remove(&self, ids: impl IntoIterator<Item = u64>) {
        let mut entries = self.entries();
        for id in ids {
            entries.remove(&id);
        }
    }

    /// How many jobs are not recorded yet.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether every job is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload texts of the jobs not recorded yet.
    pub fn raws(&self) -> std::collections::HashSet<String> {
        self.entries().values().map(|e| e.info.job.raw.clone()).collect()
    }
}

/// The worker pool.
pub struct Manager {
    executor: Arc<Executor>,
    catalog: LiveCatalog,
    metrics: Arc<Metrics>,
    slots: Arc<Semaphore>,
    concurrency: usize,
    completions: Mutex<Option<CompletionSender>>,
    /// Room for jobs waiting on a plugin's own concurrency limit.
    parking: Arc<Semaphore>,
    inflight: Arc<InFlightTable>,
    next_id: AtomicU64,
}

impl Manager {
    /// A pool of `concurrency` slots running `catalog`'s plugins.
    pub fn new(
        metrics: Arc<Metrics>,
        executor: Arc<Executor>,
        catalog: LiveCatalog,
        concurrency: u32,
        completions: CompletionSender,
        inflight: Arc<InFlightTable>,
    ) -> Arc<Self> {
        let concurrency = concurrency.max(1) as usize;
        Arc::new(Self {
            metrics,
            executor,
            catalog,
            slots: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            completions: Mutex::new(Some(completions)),
            parking: Arc::new(Semaphore::new(concurrency)),
            inflight,
            next_id: AtomicU64::new(0),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.inflight.entries()
    }

    /// The configured concurrency.
    pub fn concurrency(&self) -> usize {
        self.concurrency
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
    pub async fn slots(&self, max: usize) -> Vec<OwnedSemaphorePermit> {
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
    pub fn start(self: &Arc<Self>, job: Fetched, permit: OwnedSemaphorePermit) -> Option<Fetched> {
        let completions = self.completions.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(completions) = completions else {
            return Some(job);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.entries().insert(
            id,
            Entry {
                info: InFlight {
                    job: job.clone(),
                    run_at: now_f64(),
                },
                abort: None,
            },
        );
        let manager = self.clone();
        // The catalog as it is when the job is taken: a reload from now on
        // does not change the version it runs on.
        let catalog = self.catalog.load_full();
        let handle = tokio::spawn(async move {
            let mut runner_slot = Some(permit);
            let slots = processor::Slots {
                runner: &mut runner_slot,
                parking: &manager.parking,
            };
            let write = processor::process(&manager.executor, &catalog, &manager.metrics, &job, slots).await;
            // The job stays in the in-flight table until the writer has
            // recorded its outcome: if the task is stopped at shutdown before
            // this send completes, it is still listed and gets requeued.
            if completions
                .send(Completion {
                    id,
                    raw: job.raw,
                    write,
                })
                .await
                .is_err()
            {
                tracing::error!("the outcome writer is gone; the job stays in the in-progress list");
                manager.inflight.remove([id]);
            }
            drop(runner_slot);
        });
        if let Some(entry) = self.entries().get_mut(&id) {
            entry.abort = Some(handle.abort_handle());
        }
        None
    }

    /// Stops accepting jobs and lets go of the outcome writer, which ends
    /// once the jobs still running have handed over their results.
    pub fn close(&self) {
        self.completions.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    /// Jobs in flight now (including finished ones whose outcome is still
    /// being written).
    pub fn busy(&self) -> usize {
        self.entries().len()
    }

    /// What is in flight, keyed by a per-job id (Sidekiq's "tid").
    pub fn snapshot(&self) -> Vec<(String, InFlight)> {
        self.entries()
            .iter()
            .map(|(id, e)| (format!("{id:x}"), e.info.clone()))
            .collect()
    }

    /// Waits until nothing is in flight, or `timeout` passes. Returns whether
    /// everything finished.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.busy() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every job still running and returns them, for requeueing.
    pub fn abort_all(&self) -> Vec<Fetched> {
        let mut entries = self.entries();
        let mut jobs = Vec::with_capacity(entries.len());
        for (_, entry) in entries.drain() {
            if let Some(abort) = entry.abort {
                abort.abort();
            }
            jobs.push(entry.info.job);
        }
        jobs
    }
}
