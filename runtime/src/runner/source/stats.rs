//! Sidekiq's job counters: `stat:processed` and `stat:failed` with their
//! daily keys, and `wasmjobs:stat:discarded`.
//!
//! The outcome writer ([`crate::runner::outcome`]) adds up what each batch
//! owes and hands the sum to [`JobSource::record`](super::JobSource::record)
//! when it is due, which stages it in that batch's transaction
//! ([`Stats::stage`]). So the counters are written at most every 10 ms,
//! not with every batch, much as Sidekiq's own processes add theirs with their
//! heartbeat.

use crate::redis::{keys, utc_date};
use crate::runner::fetched::{Completion, Finish};
use crate::runner::job_retry::Write;

/// Counter increments, not written yet.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Jobs that ran or were decided (`stat:processed`).
    pub(crate) processed: u64,
    /// Of those, failures (`stat:failed`).
    pub(crate) failed: u64,
    /// Jobs discarded (`wasmjobs:stat:discarded`).
    pub(crate) discarded: u64,
}

impl Stats {
    /// Nothing to add.
    pub(crate) const NONE: Stats = Stats {
        processed: 0,
        failed: 0,
        discarded: 0,
    };

    /// What the ended jobs of `batch` add (a requeue, a reschedule and a
    /// hand-back add nothing).
    pub(crate) fn of(batch: &[Completion]) -> Stats {
        let mut stats = Stats::default();
        for completion in batch {
            if let Finish::Outcome(write) = &completion.finish {
                stats.count(write);
            }
        }
        stats
    }

    fn count(&mut self, write: &Write) {
        self.processed += u64::from(write.is_processed());
        self.failed += u64::from(write.is_failure());
        self.discarded += u64::from(matches!(write, Write::Discard));
    }

    /// Adds `other`.
    pub(crate) fn add(&mut self, other: Stats) {
        self.processed += other.processed;
        self.failed += other.failed;
        self.discarded += other.discarded;
    }

    /// Takes off `paid` (never below zero).
    pub(crate) fn sub(&mut self, paid: Stats) {
        self.processed -= paid.processed.min(self.processed);
        self.failed -= paid.failed.min(self.failed);
        self.discarded -= paid.discarded.min(self.discarded);
    }

    /// Whether there is nothing to add.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Stats::NONE
    }

    /// Stages the increments, the daily keys dated by `now` (UTC).
    pub(crate) fn stage(&self, pipe: &mut redis::Pipeline, now: f64) {
        let date = utc_date(now);
        incr(pipe, keys::STAT_PROCESSED, &date, self.processed);
        incr(pipe, keys::STAT_FAILED, &date, self.failed);
        if self.discarded > 0 {
            pipe.cmd("INCRBY")
                .arg(keys::STAT_DISCARDED)
                .arg(self.discarded)
                .ignore();
        }
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
