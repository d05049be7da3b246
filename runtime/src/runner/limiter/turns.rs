//! When the jobs a process's limiter sent back to `schedule` are due, so
//! that its scheduled poller moves them back in time: while any is due
//! soon or was due within [`GRACE`], the poller polls every
//! [`POLL_WHILE_WAITING`] instead of its usual interval (5 s × processes
//! by default). A limited job comes back [`super::policy::EARLY`] before
//! its turn, so a poll a second late costs nothing, and an idle process
//! (or one whose plugins have no limits) polls as before. A job sent back
//! wakes a poller asleep for its usual pause ([`Turns::sent`]), so no
//! timer runs while nothing is due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The poller's pause while jobs sent back by a limit are due.
const POLL_WHILE_WAITING: Duration = Duration::from_secs(1);
/// How long after the last one is due the poller keeps the short pause.
const GRACE: f64 = 2.0;

/// The latest due time of the jobs sent back, epoch ms.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    latest_ms: AtomicU64,
    sent: Notify,
}

impl Turns {
    /// A job was sent back to `schedule`, due at `at` (epoch seconds).
    pub(crate) fn sent_back(&self, at: f64) {
        if at.is_finite() && at > 0.0 {
            self.latest_ms.fetch_max((at * 1000.0) as u64, Ordering::Relaxed);
            // Every shard's poller shares these turns, and the job's may
            // be any of them: wake them all, and keep a wake-up for one
            // not waiting yet.
            self.sent.notify_waiters();
            self.sent.notify_one();
        }
    }

    /// Resolves when a job is sent back (at once if one was since the
    /// last call).
    pub(crate) async fn sent(&self) {
        self.sent.notified().await;
    }

    /// Whether, at `now` (epoch seconds), a job sent back may be waiting
    /// for the poller.
    pub(crate) fn waiting(&self, now: f64) -> bool {
        let latest = self.latest_ms.load(Ordering::Relaxed);
        latest > 0 && now <= latest as f64 / 1000.0 + GRACE
    }

    /// The poller's next pause: `usual`, or shorter while jobs wait.
    pub(crate) fn pause(&self, usual: Duration, now: f64) -> Duration {
        if self.waiting(now) {
            usual.min(POLL_WHILE_WAITING)
        } else {
            usual
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_sent_back_wakes_every_shards_poller() {
        let turns = std::sync::Arc::new(Turns::default());
        let pollers: Vec<_> = (0..3)
            .map(|_| {
                let turns = turns.clone();
                tokio::spawn(async move { turns.sent().await })
            })
            .collect();
        // Each poller is waiting before the job is sent back.
        tokio::task::yield_now().await;
        turns.sent_back(100.0);
        let woken = tokio::time::timeout(Duration::from_secs(5), futures_util::future::join_all(pollers)).await;
        assert!(woken.is_ok(), "a poller was left asleep");
    }

    #[test]
    fn the_poller_hurries_only_while_sent_back_jobs_are_due() {
        let turns = Turns::default();
        let usual = Duration::from_secs(15);
        assert!(!turns.waiting(100.0));
        assert_eq!(turns.pause(usual, 100.0), usual);
        turns.sent_back(130.0);
        turns.sent_back(110.0);
        turns.sent_back(f64::NAN);
        turns.sent_back(-1.0);
        assert_eq!(turns.pause(usual, 100.0), POLL_WHILE_WAITING);
        assert!(turns.waiting(131.9));
        assert!(!turns.waiting(132.1));
        assert_eq!(turns.pause(usual, 133.0), usual);
        assert_eq!(
            turns.pause(Duration::from_millis(100), 120.0),
            Duration::from_millis(100)
        );
    }
}
