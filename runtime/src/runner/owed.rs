//! The job counters this process owes Redis, and when the outcome writer
//! pays them.
//!
//! Every ended job adds to Sidekiq's `stat:processed` and `stat:failed`
//! and their daily keys: three commands for each counter that moves.
//! Written with every batch, at ten jobs in flight (batches of about five)
//! that alone was 0.6 commands a job, against one `LREM` for the job
//! itself. So the writer sums what batches owe ([`Owed::add`]) and pays
//! the sum, in the transaction of the batch it goes with
//! ([`JobSource::record`](super::source::JobSource::record)), once
//! [`STATS_LAG`] has passed since counters were last written
//! ([`Owed::due`]), or alone, without a batch, when [`STATS_LAG`] passes
//! with none to carry them ([`Owed::deadline`]). At tens of thousands of
//! jobs a second that is a hundred writes of counters a second instead of
//! thousands, and a runner that falls idle has written every count
//! [`STATS_LAG`] later.
//!
//! A job's own outcome never waits for this; only its count may, by at
//! most [`STATS_LAG`]. What a process killed with `SIGKILL` still owed is
//! lost: at most [`STATS_LAG`]'s worth of counts. Sidekiq's processes keep
//! theirs in memory the same way and add them with each heartbeat, every
//! 10 s.

use std::time::{Duration, Instant};

use super::source::Stats;

/// Longest a job's count waits to be written.
pub(crate) const STATS_LAG: Duration = Duration::from_millis(10);

/// Counters summed and not written yet.
#[derive(Debug)]
pub(crate) struct Owed {
    stats: Stats,
    /// When counters were last written (or the writer started).
    paid_at: Instant,
}

impl Owed {
    /// Nothing owed, as of `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            stats: Stats::NONE,
            paid_at: now,
        }
    }

    /// Adds a batch's counters.
    pub(crate) fn add(&mut self, stats: Stats) {
        self.stats.add(stats);
    }

    /// Whether anything is owed.
    pub(crate) fn is_empty(&self) -> bool {
        self.stats.is_empty()
    }

    /// Everything owed.
    pub(crate) fn all(&self) -> Stats {
        self.stats
    }

    /// What to write with a batch recorded at `now`: everything owed, or
    /// nothing yet.
    pub(crate) fn due(&self, now: Instant) -> Stats {
        match now.saturating_duration_since(self.paid_at) >= STATS_LAG {
            true => self.stats,
            false => Stats::NONE,
        }
    }

    /// When what is owed must be written without a batch; `None` when
    /// nothing is owed.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (!self.is_empty()).then_some(self.paid_at + STATS_LAG)
    }

    /// `paid` (what [`Owed::due`] or [`Owed::all`] gave) was written at
    /// `now`.
    pub(crate) fn paid(&mut self, paid: Stats, now: Instant) {
        if paid.is_empty() {
            return;
        }
        self.stats.sub(paid);
        self.paid_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(processed: u64, failed: u64) -> Stats {
        Stats {
            processed,
            failed,
            discarded: 0,
        }
    }

    #[test]
    fn counts_wait_while_jobs_keep_ending_and_go_once_late() {
        let start = Instant::now();
        let mut owed = Owed::new(start);
        owed.add(jobs(5, 1));
        let soon = start + STATS_LAG / 2;
        assert_eq!(owed.due(soon), Stats::NONE, "not yet");
        owed.paid(Stats::NONE, soon);
        owed.add(jobs(5, 0));
        assert_eq!(owed.deadline(), Some(start + STATS_LAG));
        let late = start + STATS_LAG;
        let due = owed.due(late);
        assert_eq!(due, jobs(10, 1), "everything owed goes at once");
        owed.paid(due, late);
        assert!(owed.is_empty());
        assert_eq!(owed.deadline(), None, "nothing owed, nothing to wait for");
    }

    #[test]
    fn a_quiet_spell_writes_the_next_batch_at_once_then_the_lag_restarts() {
        let start = Instant::now();
        let mut owed = Owed::new(start);
        let later = start + 10 * STATS_LAG;
        owed.add(jobs(1, 0));
        let due = owed.due(later);
        assert_eq!(due, jobs(1, 0));
        owed.paid(due, later);
        owed.add(jobs(1, 0));
        assert_eq!(owed.due(later + STATS_LAG / 10), Stats::NONE);
        assert_eq!(owed.deadline(), Some(later + STATS_LAG));
    }

    #[test]
    fn counts_added_while_a_write_was_out_stay_owed() {
        let start = Instant::now();
        let mut owed = Owed::new(start);
        owed.add(jobs(4, 2));
        let due = owed.all();
        owed.add(jobs(1, 0));
        owed.paid(due, start);
        assert_eq!(owed.all(), jobs(1, 0));
    }

    #[test]
    fn nothing_paid_leaves_the_lag_running_from_the_last_real_write() {
        let start = Instant::now();
        let mut owed = Owed::new(start);
        owed.add(jobs(1, 0));
        owed.paid(Stats::NONE, start + STATS_LAG / 2);
        assert_eq!(owed.deadline(), Some(start + STATS_LAG));
    }
}
