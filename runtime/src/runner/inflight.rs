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
//! `--exit-when-empty` check, and the fetch loop's reconcile after a lost
//! reply (every payload held here is known, not an orphan).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::fetched::Fetched;

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
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl InFlightTable {
    fn entries(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a job that starts now; returns its id.
    pub(crate) fn add(&self, job: Fetched, run_at: f64) -> u64 {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let info = InFlight { job, run_at };
        self.entries().insert(id, Entry { info, recording: false });
        id
    }

    /// Marks job `id` as handed to the writer. False if it was stopped
    /// (taken out for requeueing): its outcome must then not be written.
    pub(crate) fn recording(&self, id: u64) -> bool {
        match self.entries().get_mut(&id) {
            Some(entry) => {
                entry.recording = true;
                true
            }
            None => false,
        }
    }

    /// Forgets jobs whose outcome is recorded (or that were handed back).
    pub(crate) fn remove(&self, ids: impl IntoIterator<Item = u64>) {
        let mut entries = self.entries();
        for id in ids {
            entries.remove(&id);
        }
    }

    /// Takes out every job still running (not recording), for requeueing.
    pub(crate) fn stop_running(&self) -> Vec<Fetched> {
        let mut entries = self.entries();
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
        self.entries().len()
    }

    /// Whether every job is recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload texts of the jobs not recorded yet.
    pub(crate) fn raws(&self) -> HashSet<String> {
        self.entries().values().map(|e| e.info.job.raw.clone()).collect()
    }

    /// What is in flight, keyed by a per-job id (Sidekiq's "tid").
    pub(crate) fn snapshot(&self) -> Vec<(String, InFlight)> {
        self.entries()
            .iter()
            .map(|(id, e)| (format!("{id:x}"), e.info.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(raw: &str) -> Fetched {
        Fetched {
            raw: raw.into(),
            queue: "q".into(),
        }
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
}
