//! The jobs this process holds: taken from Redis and not yet recorded back.
//!
//! An entry is added when a job starts ([`super::manager`]), marked
//! *recording* when its unit of work hands the outcome to the writer
//! ([`super::unit::UnitOfWork::finish`]) and removed once the writer has
//! written it ([`super::outcome`]). At a shutdown deadline the entries still
//! running are taken out ([`InFlightTable::stop_running`]) and requeued; a
//! job finishing at that very moment then finds its entry gone and hands
//! nothing over, so a job is either recorded or requeued, never both.
//!
//! Readers: the heartbeat (Sidekiq's `:work` hash), `/metrics`, the
//! `--exit-when-empty` check, the fetch loop's reconcile after a lost
//! reply (every payload held here is known, not an orphan), and the run
//! summary, for which the table also keeps its busy window
//! ([`InFlightTable::busy`]): from the first job added to the last one
//! removed.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::fetched::{Fetched, Known};

/// A job being worked on.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    /// The job as fetched.
    pub(crate) job: Fetched,
    /// When it started (epoch seconds).
    pub(crate) run_at: f64,
}

struct Entry {
    info: InFlight,
    /// Its outcome is with the writer.
    recording: bool,
}

/// Jobs taken from Redis and not yet recorded back.
#[derive(Default)]
pub(crate) struct InFlightTable {
    inner: Mutex<Inner>,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    /// When the first job was added.
    first_added: Option<Instant>,
    /// When a job was last removed.
    last_removed: Option<Instant>,
}

impl InFlightTable {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a job that starts now; returns its id.
    pub(crate) fn add(&self, job: Fetched, run_at: f64) -> u64 {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let info = InFlight { job, run_at };
        let mut inner = self.inner();
        if inner.first_added.is_none() {
            inner.first_added = Some(Instant::now());
        }
        inner.entries.insert(id, Entry { info, recording: false });
        id
    }

    /// The busy window: from the first job added to the last one removed
    /// (recorded or handed back), `None` before a job has gone through.
    /// Unlike the time since fetching began, it leaves out the waits for
    /// work before the first job and after the last.
    pub(crate) fn busy(&self) -> Option<Duration> {
        let inner = self.inner();
        match (inner.first_added, inner.last_removed) {
            (Some(first), Some(last)) => Some(last.saturating_duration_since(first)),
            _ => None,
        }
    }

    /// Marks job `id` as handed to the writer. False if it was stopped
    /// (taken out for requeueing): its outcome must then not be written.
    pub(crate) fn recording(&self, id: u64) -> bool {
        match self.inner().entries.get_mut(&id) {
            Some(entry) => {
                entry.recording = true;
                true
            }
            None => false,
        }
    }

    /// Forgets jobs whose outcome is recorded (or that were handed back).
    pub(crate) fn remove(&self, ids: impl IntoIterator<Item = u64>) {
        let mut inner = self.inner();
        let mut removed = false;
        for id in ids {
            removed |= inner.entries.remove(&id).is_some();
        }
        if removed {
            inner.last_removed = Some(Instant::now());
        }
    }

    /// Takes out every job still running (not recording), for requeueing.
    pub(crate) fn stop_running(&self) -> Vec<Fetched> {
        let mut inner = self.inner();
        let entries = &mut inner.entries;
        let running: Vec<u64> = entries
            .iter()
            .filter(|(_, e)| !e.recording)
            .map(|(&id, _)| id)
            .collect();
        running
            .into_iter()
            .filter_map(|id| entries.remove(&id))
            .map(|e| e.info.job)
            .collect()
    }

    /// How many jobs are not recorded yet.
    pub(crate) fn len(&self) -> usize {
        self.inner().entries.len()
    }

    /// Whether every job is recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The jobs not recorded yet.
    pub(crate) fn known(&self) -> Known {
        let mut known = Known::default();
        for entry in self.inner().entries.values() {
            known.add(&entry.info.job);
        }
        known
    }

    /// The ids of the jobs in flight from `shard` (what
    /// [`Self::describe`] keys on).
    pub(crate) fn ids(&self, shard: u16) -> HashSet<u64> {
        self.inner()
            .entries
            .iter()
            .filter(|(_, e)| e.info.job.shard == shard)
            .map(|(id, _)| *id)
            .collect()
    }

    /// `describe` of each job in flight from `shard` whose id `pick`
    /// accepts, keyed by that id (Sidekiq's "tid" is its hex form);
    /// nothing is cloned but what `describe` makes.
    pub(crate) fn describe<T>(
        &self,
        shard: u16,
        pick: impl Fn(u64) -> bool,
        mut describe: impl FnMut(&InFlight) -> T,
    ) -> Vec<(u64, T)> {
        self.inner()
            .entries
            .iter()
            .filter(|(id, e)| e.info.job.shard == shard && pick(**id))
            .map(|(id, e)| (*id, describe(&e.info)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(raw: &str) -> Fetched {
        Fetched::new(raw.into(), "q")
    }

    #[test]
    fn a_job_is_either_recorded_or_stopped_never_both() {
        let table = InFlightTable::default();
        let a = table.add(job("a"), 1.0);
        let b = table.add(job("b"), 1.0);
        assert!(table.recording(a));
        let stopped = table.stop_running();
        assert_eq!(stopped.iter().map(|j| j.raw.as_str()).collect::<Vec<_>>(), ["b"]);
        // b finishing after the deadline hands nothing over.
        assert!(!table.recording(b));
        assert_eq!(table.len(), 1, "a is still being recorded");
        table.remove([a]);
        assert!(table.is_empty());
    }

    #[test]
    fn the_busy_window_runs_from_the_first_job_added_to_the_last_removed() {
        let table = InFlightTable::default();
        assert_eq!(table.busy(), None, "nothing went through yet");
        let a = table.add(job("a"), 1.0);
        let b = table.add(job("b"), 1.0);
        table.remove([a]);
        let after_a = table.busy().expect("a went through");
        table.remove([b]);
        let after_b = table.busy().expect("b went through");
        assert!(after_b >= after_a, "{after_b:?} < {after_a:?}");
        // Removing an id that is not there (already stopped) moves nothing.
        table.remove([a]);
        assert_eq!(table.busy(), Some(after_b));
        // A later job extends the window to its own removal.
        let c = table.add(job("c"), 1.0);
        let before = Instant::now();
        while before.elapsed() < Duration::from_millis(2) {
            std::hint::spin_loop();
        }
        table.remove([c]);
        assert!(table.busy().expect("c went through") >= after_b + Duration::from_millis(2));
    }
}
