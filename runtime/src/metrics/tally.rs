//! How jobs ended, counted one way everywhere: a [`Tally`] is kept per
//! class and plugin version (`super::ClassStats`, for `/metrics` and
//! `/stats`), per process (`runner::outcome::Counters`, for the heartbeat
//! and Sidekiq's counters) and for a whole run (`runner::RunSummary`).
//! Which write of a job counts as which [`Counted`] is decided in one place
//! too (`runner::job_retry::Write::counted`).

use serde::Serialize;

/// How a job ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Acked.
    Success,
    /// Failed, scheduled for a retry.
    Retry,
    /// Failed, sent to the dead set.
    Dead,
    /// Discarded at the guest's request.
    Discard,
    /// Failed with `retry: false`: gone.
    Drop,
    /// Cancelled before or while it ran.
    Cancelled,
}

/// Jobs counted by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Jobs finished, whatever the outcome (Sidekiq's "processed").
    pub processed: u64,
    /// Of those, failed: retried, dead or dropped.
    pub failed: u64,
    /// Failures scheduled for a retry.
    pub retried: u64,
    /// Failures sent to the dead set.
    pub dead: u64,
    /// Discarded at the guest's request.
    pub discarded: u64,
    /// Cancelled before or while they ran.
    pub cancelled: u64,
}

impl Tally {
    /// Counts one job that ended as `outcome`.
    pub fn count(&mut self, outcome: Counted) {
        self.processed += 1;
        match outcome {
            Counted::Success => {}
            Counted::Retry => {
                self.failed += 1;
                self.retried += 1;
            }
            Counted::Dead => {
                self.failed += 1;
                self.dead += 1;
            }
            Counted::Drop => self.failed += 1,
            Counted::Discard => self.discarded += 1,
            Counted::Cancelled => self.cancelled += 1,
        }
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &Tally) {
        self.processed += other.processed;
        self.failed += other.failed;
        self.retried += other.retried;
        self.dead += other.dead;
        self.discarded += other.discarded;
        self.cancelled += other.cancelled;
    }

    /// Jobs that succeeded.
    pub fn succeeded(&self) -> u64 {
        self.processed - self.failed - self.discarded - self.cancelled
    }

    /// Failures neither retried nor kept (`retry: false`).
    pub fn dropped(&self) -> u64 {
        self.failed - self.retried - self.dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_lands_in_one_place() {
        let mut tally = Tally::default();
        for outcome in [
            Counted::Success,
            Counted::Retry,
            Counted::Dead,
            Counted::Discard,
            Counted::Drop,
            Counted::Cancelled,
            Counted::Success,
        ] {
            tally.count(outcome);
        }
        assert_eq!(
            tally,
            Tally {
                processed: 7,
                failed: 3,
                retried: 1,
                dead: 1,
                discarded: 1,
                cancelled: 1,
            }
        );
        assert_eq!((tally.succeeded(), tally.dropped()), (2, 1));
        let mut twice = tally;
        twice.merge(&tally);
        assert_eq!((twice.processed, twice.succeeded()), (14, 4));
    }
}
