//! An in-memory job source, for unit tests of the runner core (the fetch
//! loop, the manager, the writer, shutdown) without Redis. A test double
//! of [`JobSource`], not a model of Redis: one queue, one held list, and
//! switches that make it fail the way Redis can (a lost reply, refused
//! writes).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Result, anyhow};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::Notify;

use super::doubt::Doubt;
use super::{JobSource, Stats};
use crate::runner::fetched::{Completion, Fetched, Finish, Known};
use crate::runner::job_retry::Write;

/// What the source holds.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The queue; the front is taken next.
    pub(crate) queue: VecDeque<String>,
    /// Taken and not yet recorded (the in-progress list).
    pub(crate) held: Vec<String>,
    /// Recorded outcomes, in order.
    pub(crate) recorded: Vec<(String, Finish)>,
    /// The counters written, summed.
    pub(crate) stats: Stats,
    /// Record calls that succeeded, empty ones included.
    pub(crate) writes: u64,
    /// Of those, the ones that wrote counters.
    pub(crate) counter_writes: u64,
}

/// The in-memory source.
#[derive(Default)]
pub(crate) struct MemorySource {
    state: Mutex<State>,
    pushed: Notify,
    doubt: Doubt,
    /// The next fetch moves jobs and then fails, as if its reply was lost.
    pub(crate) lose_next_reply: AtomicBool,
    /// This many record calls fail before one succeeds.
    pub(crate) refuse_records: AtomicU32,
    /// This many record calls panic (a bug in a store) before one runs.
    pub(crate) panic_records: AtomicU32,
    /// Every fetch fails (its Redis is down), moving nothing.
    pub(crate) fail_fetches: AtomicBool,
    /// Every fetch hangs (its Redis stopped answering) until
    /// [`MemorySource::answer_again`], then takes jobs as usual.
    pub(crate) hang_fetches: AtomicBool,
    answering: Notify,
    /// The queue's name (`q` when not given).
    name: Option<String>,
}

impl MemorySource {
    /// A source whose queue holds `jobs` (taken in this order).
    pub(crate) fn with(jobs: &[&str]) -> Self {
        let source = Self::default();
        source.state().queue.extend(jobs.iter().map(|j| (*j).to_owned()));
        source
    }

    /// An empty source whose queue is named `queue`.
    pub(crate) fn named(queue: &str) -> Self {
        Self {
            name: Some(queue.to_owned()),
            ..Self::default()
        }
    }

    /// The state, to look at or change.
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the hang of [`MemorySource::hang_fetches`].
    pub(crate) fn answer_again(&self) {
        self.hang_fetches.store(false, Ordering::Release);
        self.answering.notify_waiters();
    }

    /// Adds a job at the back of the queue.
    pub(crate) fn push(&self, job: &str) {
        self.state().queue.push_back(job.to_owned());
        self.pushed.notify_waiters();
    }

    fn take(&self, max: usize) -> Vec<Fetched> {
        let mut state = self.state();
        let mut jobs = Vec::new();
        while jobs.len() < max {
            let Some(raw) = state.queue.pop_front() else { break };
            state.held.push(raw.clone());
            jobs.push(Fetched::new(raw, self.name.clone().unwrap_or_else(|| "q".into())));
        }
        jobs
    }
}

impl JobSource for MemorySource {
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>> {
        async move {
            loop {
                let answering = self.answering.notified();
                if !self.hang_fetches.load(Ordering::Acquire) {
                    break;
                }
                answering.await;
            }
            if self.fail_fetches.load(Ordering::Acquire) {
                return Err(anyhow!("Connection refused (os error 111)"));
            }
            let jobs = self.take(max);
            if self.lose_next_reply.swap(false, Ordering::AcqRel) {
                self.doubt.raise();
                return Err(anyhow!("connection lost (the jobs were moved)"));
            }
            Ok(jobs)
        }
        .boxed()
    }

    fn wait(&self) -> BoxFuture<'_, Option<Fetched>> {
        async move {
            loop {
                let pushed = self.pushed.notified();
                if let Some(job) = self.take(1).pop() {
                    return Some(job);
                }
                pushed.await;
            }
        }
        .boxed()
    }

    fn stop_waiting(&self) -> BoxFuture<'_, Vec<Fetched>> {
        async { Vec::new() }.boxed()
    }

    fn doubt(&self) {
        self.doubt.raise();
    }

    fn take_doubt(&self) -> bool {
        self.doubt.take(Instant::now())
    }

    fn reconcile<'a>(&'a self, known: &'a Known) -> BoxFuture<'a, Result<usize>> {
        async move {
            let mut state = self.state();
            let (keep, lost): (Vec<String>, Vec<String>) = state.held.drain(..).partition(|j| known.raws.contains(j));
            state.held = keep;
            let n = lost.len();
            for job in lost.into_iter().rev() {
                state.queue.push_front(job);
            }
            Ok(n)
        }
        .boxed()
    }

    fn register(&self, _pipe: &mut redis::Pipeline) {}

    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>> {
        async move {
            let refused = self
                .refuse_records
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if refused {
                return Err(anyhow!("OOM command not allowed when used memory > 'maxmemory'"));
            }
            let panics = self
                .panic_records
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            assert!(!panics, "a record call panicked (MemorySource::panic_records)");
            let mut state = self.state();
            for completion in batch {
                let raw = &completion.job.raw;
                if let Some(at) = state.held.iter().position(|j| j == raw) {
                    state.held.remove(at);
                }
                if matches!(completion.finish, Finish::Requeue | Finish::Outcome(Write::HandBack)) {
                    state.queue.push_front(raw.clone());
                }
                state.recorded.push((raw.clone(), completion.finish.clone()));
            }
            state.stats.add(*stats);
            state.writes += 1;
            state.counter_writes += u64::from(!stats.is_empty());
            Ok(())
        }
        .boxed()
    }

    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64> {
        async move {
            let mut state = self.state();
            let given: Vec<String> = jobs.into_iter().map(|j| j.raw).collect();
            let held = std::mem::take(&mut state.held);
            let n = held.len();
            // Oldest first at the front, like the Redis sources.
            for job in held.into_iter().rev() {
                state.queue.push_front(job);
            }
            debug_assert!(given.iter().all(|g| state.queue.contains(g)));
            n as u64
        }
        .boxed()
    }

    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        async { Ok(0) }.boxed()
    }

    fn waiting(&self) -> BoxFuture<'_, Result<u64>> {
        async move { Ok(self.state().queue.len() as u64) }.boxed()
    }

    fn unregister(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}
