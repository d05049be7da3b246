//! What a finished job's [`Outcome`] means for Redis: Sidekiq's retry policy.
//!
//! - success → ack;
//! - `discard` → ack, counted as discarded;
//! - `dead` → the dead set, with Sidekiq's error fields;
//! - `retry` (an error the guest asked to retry, a trap, a timeout) → the
//!   `retry` set at `now + count⁴ + 15 + rand(10·(count+1))` seconds while
//!   retries remain (default 25, `retry: N` caps it), then the dead set;
//!   `retry: false` drops the job after the failure (as Sidekiq does), and
//!   `dead: false` keeps an exhausted job out of the dead set.
//!
//! A job whose class no plugin serves is retried on the same schedule, but
//! never dropped: with `retry: false` or when its retries run out it goes
//! to the dead set regardless, since the job itself never ran.
//!
//! Unknown payload keys are kept: only the error fields change (plus
//! [`ERROR_PLUGIN`], the plugin version that failed).

use rand::Rng;
use serde_json::Value;

use crate::job::{Outcome, cap_error};
use crate::metrics::Counted;
use crate::redis::payload::{Payload, RetryPolicy};

/// `error_class` of a job retried because no plugin served its class.
pub(crate) const NO_PLUGIN: &str = "wasmjobs::NoPlugin";

/// Payload key naming the plugin version ("name@version") whose run failed.
pub(crate) const ERROR_PLUGIN: &str = "error_plugin";

/// Sidekiq's default number of retries.
pub(crate) const DEFAULT_MAX_RETRIES: u64 = 25;

/// What to write for one finished job.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// Done: remove it.
    Ack,
    /// Dropped at the guest's request.
    Discard,
    /// Try again at `at` (epoch seconds) with the updated payload.
    Retry {
        /// When.
        at: f64,
        /// The payload with its error fields.
        payload: String,
    },
    /// Into the dead set.
    Dead {
        /// The payload with its error fields.
        payload: String,
    },
    /// Failed with `retry: false` (or exhausted with `dead: false`): gone.
    Drop,
    /// Not run: over a cluster limit (`runner::limiter`), back to the
    /// `schedule` set until `at`. Not a failure and not processed; the
    /// payload counts it (`overrated`), its `retry_count` is untouched.
    Reschedule {
        /// When.
        at: f64,
        /// The payload with `overrated` counted.
        payload: String,
    },
    /// Cancelled (`wasmjobs cancel`): not retried; into the cancelled set
    /// with who cancelled it and when.
    Cancelled {
        /// The job's jid (its request is resolved).
        jid: String,
        /// The payload with `cancelled_at`, `cancelled_by`, `cancelled_from`.
        payload: String,
    },
    /// Not run: a class no plugin here serves, on a queue a Ruby Sidekiq
    /// process also fetches (`runner::neighbours`). Back to the front of
    /// its queue exactly as it came, for that process: not processed, not
    /// failed.
    HandBack,
    /// Not run: handed back as [`Write::HandBack`] so often in a row that
    /// no Ruby process seems to take it now: into `schedule` until `at`,
    /// exactly as it came (`payload`), for whoever polls it then. Not
    /// processed, not failed.
    HandBackLater {
        /// When.
        at: f64,
        /// The job's payload as fetched.
        payload: String,
    },
}

impl Write {
    /// Whether the job failed (Sidekiq's `stat:failed`).
    pub(crate) fn is_failure(&self) -> bool {
        matches!(self, Write::Retry { .. } | Write::Dead { .. } | Write::Drop)
    }

    /// Whether the job ran, or was decided (Sidekiq's `stat:processed`):
    /// all but a reschedule and a hand-back.
    pub(crate) fn is_processed(&self) -> bool {
        self.counted().is_some()
    }

    /// How this write counts in a [`Tally`](crate::metrics::Tally); none
    /// for a job that did not run here (rescheduled by a cluster limit,
    /// handed back to Ruby Sidekiq), which is counted apart.
    pub(crate) fn counted(&self) -> Option<Counted> {
        Some(match self {
            Write::Ack => Counted::Success,
            Write::Discard => Counted::Discard,
            Write::Retry { .. } => Counted::Retry,
            Write::Dead { .. } => Counted::Dead,
            Write::Drop => Counted::Drop,
            Write::Cancelled { .. } => Counted::Cancelled,
            Write::Reschedule { .. } | Write::HandBack | Write::HandBackLater { .. } => return None,
        })
    }
}

/// Decides what to write for `payload` given `outcome`, at time `now`.
pub(crate) fn decide(payload: &Payload, outcome: &Outcome, now: f64) -> Write {
    match outcome {
        Outcome::Success => Write::Ack,
        Outcome::Discard(_) => Write::Discard,
        Outcome::Dead(message) => {
            let mut failed = payload.clone();
            record_failure(&mut failed, "wasmjobs::Dead", message, now);
            to_morgue(failed)
        }
        Outcome::Retry(message) => {
            let mut failed = payload.clone();
            let count = record_failure(&mut failed, "wasmjobs::Retry", message, now);
            match max_retries(payload) {
                None => Write::Drop,
                Some(max) => retry_or(failed, count, max, now, to_morgue),
            }
        }
    }
}

/// How many retries the payload allows; `None` for `retry: false`.
fn max_retries(payload: &Payload) -> Option<u64> {
    match payload.retry_policy() {
        RetryPolicy::Never => None,
        RetryPolicy::Default => Some(DEFAULT_MAX_RETRIES),
        RetryPolicy::Max(n) => Some(n),
    }
}

/// A retry at the backoff for failure `count` while it is below `max`,
/// else what `exhausted` makes of the job.
fn retry_or(failed: Payload, count: u64, max: u64, now: f64, exhausted: fn(Payload) -> Write) -> Write {
    if count < max {
        Write::Retry {
            at: now + delay_secs(count),
            payload: failed.to_json(),
        }
    } else {
        exhausted(failed)
    }
}

/// What to write for a job whose class no plugin serves: a retry while
/// retries remain (at the usual backoff), else the dead set, even with
/// `retry: false` or `dead: false`: it never ran, so dropping it would lose
/// it.
pub(crate) fn unserved(payload: &Payload, message: &str, now: f64) -> Write {
    let mut failed = payload.clone();
    failed.remove(ERROR_PLUGIN);
    let count = record_failure(&mut failed, NO_PLUGIN, message, now);
    let max = max_retries(payload).unwrap_or(0);
    retry_or(failed, count, max, now, |failed| Write::Dead {
        payload: failed.to_json(),
    })
}

fn to_morgue(payload: Payload) -> Write {
    if payload.get("dead") == Some(&Value::Bool(false)) {
        Write::Drop
    } else {
        Write::Dead {
            payload: payload.to_json(),
        }
    }
}

/// Writes Sidekiq's error fields; returns the new `retry_count`.
fn record_failure(payload: &mut Payload, class: &str, message: &str, now: f64) -> u64 {
    payload.set("error_message", Value::String(cap_error(message).to_owned()));
    payload.set("error_class", Value::String(class.to_owned()));
    let count = match payload.retry_count() {
        Some(previous) => {
            payload.set_time("retried_at", now);
            // The count comes from the payload: any u64 a client wrote.
            previous.saturating_add(1)
        }
        None => {
            payload.set_time("failed_at", now);
            0
        }
    };
    payload.set("retry_count", Value::from(count));
    count
}

/// Sidekiq's backoff for retry number `count` (0-based), in seconds.
pub(crate) fn delay_secs(count: u64) -> f64 {
    let count = count.min(1_000);
    let jitter = rand::rng().random_range(0..10 * (count + 1));
    (count.pow(4) + 15 + jitter) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::MAX_ERROR_CHARS;

    fn payload(extra: &str) -> Payload {
        Payload::parse(&format!(
            r#"{{"class":"X","args":[],"jid":"j","queue":"q","custom":7{extra}}}"#
        ))
        .unwrap()
    }

    fn fields(write: &Write) -> Payload {
        match write {
            Write::Retry { payload, .. } | Write::Dead { payload } => Payload::parse(payload).unwrap(),
            other => panic!("no payload in {other:?}"),
        }
    }

    #[test]
    fn first_failure_schedules_a_retry_with_error_fields() {
        let write = decide(&payload(""), &Outcome::Retry("boom".into()), 1000.0);
        let Write::Retry { at, .. } = &write else {
            panic!("{write:?}")
        };
        assert!((1015.0..1025.0).contains(at), "{at}");
        let p = fields(&write);
        assert_eq!(p.retry_count(), Some(0));
        assert_eq!(p.str("error_message"), Some("boom"));
        assert_eq!(p.time("failed_at"), Some(1000.0));
        assert_eq!(p.get("custom"), Some(&Value::from(7)));
    }

    #[test]
    fn later_failures_count_up_and_exhaustion_goes_to_the_dead_set() {
        let write = decide(
            &payload(r#","retry_count":3,"failed_at":1.0"#),
            &Outcome::Retry("again".into()),
            1000.0,
        );
        let p = fields(&write);
        assert_eq!(p.retry_count(), Some(4));
        assert_eq!(p.time("retried_at"), Some(1000.0));
        assert_eq!(p.time("failed_at"), Some(1.0));

        let exhausted = decide(&payload(r#","retry_count":24"#), &Outcome::Retry("last".into()), 1000.0);
        assert!(matches!(exhausted, Write::Dead { .. }), "{exhausted:?}");
        let capped = decide(
            &payload(r#","retry":2,"retry_count":1"#),
            &Outcome::Retry("x".into()),
            1000.0,
        );
        assert!(matches!(capped, Write::Dead { .. }), "{capped:?}");
        let zero = decide(&payload(r#","retry":0"#), &Outcome::Retry("x".into()), 1000.0);
        assert!(matches!(zero, Write::Dead { .. }), "{zero:?}");
    }

    #[test]
    fn a_retry_count_at_the_top_of_u64_does_not_overflow() {
        let write = decide(
            &payload(&format!(r#","retry":{max},"retry_count":{max}"#, max = u64::MAX)),
            &Outcome::Retry("x".into()),
            1000.0,
        );
        assert!(matches!(write, Write::Dead { .. }), "{write:?}");
        assert_eq!(fields(&write).retry_count(), Some(u64::MAX));
    }

    #[test]
    fn retry_false_and_dead_false_drop_the_job() {
        assert_eq!(
            decide(&payload(r#","retry":false"#), &Outcome::Retry("x".into()), 1.0),
            Write::Drop
        );
        assert_eq!(
            decide(&payload(r#","retry":0,"dead":false"#), &Outcome::Retry("x".into()), 1.0),
            Write::Drop
        );
    }

    #[test]
    fn a_job_nobody_serves_retries_and_is_never_dropped() {
        let Write::Retry { payload: retried, .. } = unserved(&payload(""), "no plugin", 1000.0) else {
            panic!("a first failure is a retry")
        };
        assert!(retried.contains(r#""error_class":"wasmjobs::NoPlugin""#), "{retried}");
        for extra in [
            r#","retry":false"#,
            r#","retry":false,"dead":false"#,
            r#","retry_count":24"#,
        ] {
            let write = unserved(&payload(extra), "no plugin", 1.0);
            assert!(matches!(write, Write::Dead { .. }), "{extra}: {write:?}");
        }
    }

    #[test]
    fn dead_and_discard_and_success() {
        assert_eq!(decide(&payload(""), &Outcome::Success, 1.0), Write::Ack);
        assert_eq!(
            decide(&payload(""), &Outcome::Discard("meh".into()), 1.0),
            Write::Discard
        );
        let dead = decide(&payload(""), &Outcome::Dead("hopeless".into()), 1.0);
        assert_eq!(fields(&dead).str("error_message"), Some("hopeless"));
        assert!(dead.is_failure());
    }

    #[test]
    fn backoff_follows_sidekiq() {
        for count in [0u64, 1, 5, 24] {
            let d = delay_secs(count);
            let base = (count.pow(4) + 15) as f64;
            assert!(d >= base && d < base + (10 * (count + 1)) as f64, "{count}: {d}");
        }
    }

    #[test]
    fn error_messages_are_capped() {
        let long = "e".repeat(20_000);
        let p = fields(&decide(&payload(""), &Outcome::Dead(long), 1.0));
        assert_eq!(p.str("error_message").map(str::len), Some(MAX_ERROR_CHARS));
    }
}
