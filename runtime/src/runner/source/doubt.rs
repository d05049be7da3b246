//! Doubt after a lost reply.
//!
//! When a call that moves jobs into this process's in-progress list fails
//! after Redis may have carried it out (the connection broke mid-call, Redis
//! restarted), jobs can sit in the list that nobody here runs. The source
//! then doubts, and the fetch loop reconciles the list with what it holds:
//! repeatedly (at most every [`RECONCILE_EVERY`]) for [`DOUBT_WINDOW`],
//! since while Redis restarts orphans can appear after the first check.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long after a lost reply the in-progress list keeps being reconciled.
pub(super) const DOUBT_WINDOW: Duration = Duration::from_secs(5);
/// Least time between two reconciles.
pub(super) const RECONCILE_EVERY: Duration = Duration::from_millis(250);

#[derive(Default)]
struct Window {
    until: Option<Instant>,
    last: Option<Instant>,
}

/// The lost-reply flag and its reconcile window.
#[derive(Default)]
pub(super) struct Doubt {
    flag: AtomicBool,
    window: Mutex<Window>,
}

impl Doubt {
    /// A reply may have been lost.
    pub(super) fn raise(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Whether a reconcile is due at `now`.
    pub(super) fn take(&self, now: Instant) -> bool {
        let mut window = self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.flag.swap(false, Ordering::AcqRel) {
            window.until = Some(now + DOUBT_WINDOW);
        }
        match window.until {
            Some(until) if now < until => {
                if window.last.is_some_and(|last| now < last + RECONCILE_EVERY) {
                    return false;
                }
                window.last = Some(now);
                true
            }
            Some(_) => {
                // One last check as the window closes.
                window.until = None;
                window.last = None;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_reply_opens_a_window_of_spaced_reconciles_and_one_last_check() {
        let doubt = Doubt::default();
        let t0 = Instant::now();
        assert!(!doubt.take(t0), "no doubt, no reconcile");
        doubt.raise();
        assert!(doubt.take(t0));
        assert!(!doubt.take(t0 + RECONCILE_EVERY / 2), "spaced");
        assert!(doubt.take(t0 + RECONCILE_EVERY));
        assert!(doubt.take(t0 + DOUBT_WINDOW), "one last check as the window closes");
        assert!(!doubt.take(t0 + DOUBT_WINDOW + RECONCILE_EVERY), "then quiet");
    }
}
