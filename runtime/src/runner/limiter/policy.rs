//! What a job refused by a cluster limit becomes: Sidekiq Enterprise's
//! way, rescheduled, not retried. A pure function, like
//! [`super::super::job_retry`].
//!
//! - The payload's `overrated` goes up by one (Ent's field), its
//!   `retry_count` and error fields are untouched; the job goes to
//!   `schedule` at `now + delay` and is not a failure.
//! - A rate refusal carries the job's *turn* (the script hands them out
//!   one `window / limit` apart): the job comes back [`EARLY`] before it,
//!   so that it is moved back by a poller in time (the poller of the
//!   process that sent it back polls every second while it is due, see
//!   [`super::turns`]) and waits the rest in its process, admitted for
//!   its start ([`super::HORIZON`] ≥ `EARLY`).
//!   No growth, no jitter: turns are already spread at the rate; only a
//!   turn further than [`MAX_TURN_SECS`] is cut short (the job then asks
//!   again and gets a later turn).
//! - A concurrency refusal (the holders' end is unknown) waits
//!   [`CONCURRENCY_BASE`], growing by 10% per reschedule already counted,
//!   capped at [`MAX_DELAY_SECS`] and spread by up to +50% of jitter so
//!   that jobs refused together do not come back together.
//! - After [`MAX_RESCHEDULES`] reschedules the refusal goes through the
//!   normal retry path instead (Ent does the same after 20, with minutes
//!   between reschedules; ours are seconds apart, so the cap is higher):
//!   `retry_count`, backoff and finally the dead set, so a job that can
//!   never get under its limit shows up as failing instead of looping
//!   unnoticed. `overrated` is kept, so every later refusal goes that way
//!   too.
//! - When Redis cannot be asked ([`Refusal::Unavailable`]) the job is
//!   neither run unlimited nor counted as overrated: it is rescheduled at
//!   [`UNAVAILABLE_BASE`] (with the same jitter), and the write waits for
//!   Redis like every outcome.
//!
//! The payload keeps [`FIRST_ENQUEUED_AT`], its `enqueued_at` before the
//! first reschedule (the scheduled poller rewrites `enqueued_at` each time
//! it moves the job back), so the queue latency recorded when it finally
//! runs includes the time spent rescheduled.

use serde_json::Value;

use super::super::job_retry::{self, Write};
use crate::job::Outcome;
use crate::redis::payload::Payload;

/// Payload key counting reschedules for limits (Sidekiq Enterprise's).
pub(crate) const OVERRATED: &str = "overrated";
/// Payload key holding the job's enqueue time before its first reschedule.
pub(crate) const FIRST_ENQUEUED_AT: &str = "first_enqueued_at";
/// Reschedules after which a refusal goes through the retry path.
pub(crate) const MAX_RESCHEDULES: u64 = 100;
/// Base delay when a concurrency limit refused (its holders' end is unknown).
pub(crate) const CONCURRENCY_BASE: f64 = 1.0;
/// Base delay when the limits could not be checked.
pub(crate) const UNAVAILABLE_BASE: f64 = 5.0;
/// Shortest base delay, seconds.
pub(crate) const MIN_DELAY_SECS: f64 = 0.05;
/// Longest delay before jitter, seconds (concurrency and unavailable).
pub(crate) const MAX_DELAY_SECS: f64 = 60.0;
/// How long before its turn a job refused by a rate comes back, seconds.
pub(crate) const EARLY: f64 = 5.0;
/// Longest wait for a turn, seconds (a week).
pub(crate) const MAX_TURN_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// Why a job may not start now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Refusal {
    /// A rate limit is full within the horizon; the job's turn comes in
    /// `wait_secs`.
    Rate {
        /// Seconds until the job's turn.
        wait_secs: f64,
    },
    /// A per-key concurrency limit is full.
    Concurrency,
    /// Redis did not answer the check.
    Unavailable,
}

impl Refusal {
    /// The metrics label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refusal::Rate { .. } => "rate",
            Refusal::Concurrency => "concurrency",
            Refusal::Unavailable => "unavailable",
        }
    }
}

/// The delay before the job is tried again, seconds, for a job already
/// rescheduled `overrated` times; `jitter` is uniform in [0, 1).
pub(crate) fn delay_secs(refusal: Refusal, overrated: u64, jitter: f64) -> f64 {
    let base = match refusal {
        Refusal::Rate { wait_secs } => {
            let early = if wait_secs.is_finite() {
                wait_secs - EARLY
            } else {
                MAX_TURN_SECS
            };
            return early.clamp(MIN_DELAY_SECS, MAX_TURN_SECS);
        }
        Refusal::Concurrency => CONCURRENCY_BASE,
        Refusal::Unavailable => UNAVAILABLE_BASE,
    };
    let base = if base.is_finite() {
        base.clamp(MIN_DELAY_SECS, MAX_DELAY_SECS)
    } else {
        MAX_DELAY_SECS
    };
    let grown = (base * 1.1f64.powi(overrated.min(100) as i32)).min(MAX_DELAY_SECS);
    grown * (1.0 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// How many times the payload says it was rescheduled (0 for anything but
/// a whole number: any client may write it).
pub(crate) fn overrated(payload: &Payload) -> u64 {
    payload.get(OVERRATED).and_then(Value::as_u64).unwrap_or(0)
}

/// The write for a job `refusal` kept from starting at `now`.
pub(crate) fn refused(payload: &Payload, refusal: Refusal, now: f64, jitter: f64) -> Write {
    let count = overrated(payload);
    let mut next = payload.clone();
    if refusal != Refusal::Unavailable {
        if count >= MAX_RESCHEDULES {
            next.remove(FIRST_ENQUEUED_AT);
            let message = format!(
                "over its {} limit after {count} reschedules (docs/limits.md)",
                refusal.label()
            );
            return job_retry::decide(&next, &Outcome::Retry(message), now);
        }
        next.set(OVERRATED, Value::from(count + 1));
    }
    if next.get(FIRST_ENQUEUED_AT).is_none()
        && let Some(enqueued) = payload.time("enqueued_at").or_else(|| payload.time("created_at"))
    {
        next.set_time(FIRST_ENQUEUED_AT, enqueued);
    }
    Write::Reschedule {
        at: now + delay_secs(refusal, count, jitter),
        payload: next.to_json(),
    }
}

/// When the job was first enqueued, if a reschedule recorded it.
pub(crate) fn first_enqueued_at(payload: &Payload) -> Option<f64> {
    payload.time(FIRST_ENQUEUED_AT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(extra: &str) -> Payload {
        Payload::parse(&format!(
            r#"{{"class":"X","args":[1],"jid":"j","queue":"q","enqueued_at":100.5{extra}}}"#
        ))
        .unwrap()
    }

    fn rescheduled(write: &Write) -> (f64, Payload) {
        match write {
            Write::Reschedule { at, payload } => (*at, Payload::parse(payload).unwrap()),
            other => panic!("not a reschedule: {other:?}"),
        }
    }

    #[test]
    fn a_refusal_reschedules_and_counts_overrated() {
        let (at, p) = rescheduled(&refused(&payload(""), Refusal::Concurrency, 1000.0, 0.0));
        assert_eq!(at, 1000.0 + CONCURRENCY_BASE);
        assert_eq!(p.get(OVERRATED), Some(&Value::from(1)));
        assert_eq!(first_enqueued_at(&p), Some(100.5));
        assert_eq!(p.retry_count(), None);
        assert_eq!(p.get("error_message"), None);

        // The second keeps the first enqueue time, not the poller's newer one.
        let mut again = p.clone();
        again.set_time("enqueued_at", 999.0);
        let (_, p2) = rescheduled(&refused(&again, Refusal::Rate { wait_secs: 0.3 }, 1001.0, 0.5));
        assert_eq!(p2.get(OVERRATED), Some(&Value::from(2)));
        assert_eq!(first_enqueued_at(&p2), Some(100.5));
        assert!(
            !Write::Reschedule {
                at: 0.0,
                payload: String::new()
            }
            .is_failure()
        );
    }

    #[test]
    fn a_rate_refusal_comes_back_early_for_its_turn_without_growth_or_jitter() {
        let rate = |wait_secs| Refusal::Rate { wait_secs };
        assert_eq!(delay_secs(rate(EARLY + 3.5), 0, 0.0), 3.5);
        assert_eq!(delay_secs(rate(EARLY + 3.5), 50, 0.9), 3.5);
        assert_eq!(delay_secs(rate(3600.0), 7, 0.3), 3600.0 - EARLY);
        assert_eq!(delay_secs(rate(0.25), 0, 0.0), MIN_DELAY_SECS);
        assert_eq!(delay_secs(rate(-4.0), 0, 0.0), MIN_DELAY_SECS);
        assert_eq!(delay_secs(rate(f64::NAN), 0, 0.0), MAX_TURN_SECS);
        assert_eq!(delay_secs(rate(f64::INFINITY), 0, 0.0), MAX_TURN_SECS);
        assert_eq!(delay_secs(rate(1e12), 0, 0.0), MAX_TURN_SECS);
        assert!(EARLY <= super::super::HORIZON.as_secs_f64());
    }

    #[test]
    fn concurrency_delays_grow_and_are_capped() {
        assert!((delay_secs(Refusal::Concurrency, 10, 0.0) - 1.1f64.powi(10)).abs() < 1e-9);
        assert_eq!(delay_secs(Refusal::Concurrency, u64::MAX, 0.0), MAX_DELAY_SECS);
        assert_eq!(delay_secs(Refusal::Concurrency, 0, 0.999_999_9), 1.499_999_95);
        let mut previous = 0.0;
        for n in 0..200 {
            let d = delay_secs(Refusal::Concurrency, n, 0.0);
            assert!(d >= previous && d <= MAX_DELAY_SECS, "{n}: {d}");
            previous = d;
            let jittered = delay_secs(Refusal::Concurrency, n, 0.99);
            assert!(jittered >= d && jittered < 1.5 * d + 1e-9);
        }
    }

    #[test]
    fn past_the_cap_a_refusal_goes_through_the_retry_path() {
        let capped = refused(
            &payload(&format!(r#","overrated":{MAX_RESCHEDULES},"first_enqueued_at":3.0"#)),
            Refusal::Rate { wait_secs: 1.0 },
            1000.0,
            0.0,
        );
        let Write::Retry { payload, .. } = &capped else {
            panic!("{capped:?}")
        };
        let p = Payload::parse(payload).unwrap();
        assert_eq!(p.retry_count(), Some(0));
        assert!(
            p.str("error_message").unwrap_or_default().contains("rate limit"),
            "{payload}"
        );
        assert_eq!(p.get(OVERRATED), Some(&Value::from(MAX_RESCHEDULES)));
        assert_eq!(p.get(FIRST_ENQUEUED_AT), None);
        assert!(capped.is_failure());
    }

    #[test]
    fn unavailable_limits_reschedule_without_counting_and_hostile_counts_are_zero() {
        let (at, p) = rescheduled(&refused(&payload(""), Refusal::Unavailable, 10.0, 0.0));
        assert_eq!(at, 10.0 + UNAVAILABLE_BASE);
        assert_eq!(p.get(OVERRATED), None);
        for hostile in [r#","overrated":"lots""#, r#","overrated":-3"#, r#","overrated":1.5"#] {
            let (_, p) = rescheduled(&refused(&payload(hostile), Refusal::Concurrency, 10.0, 0.0));
            assert_eq!(p.get(OVERRATED), Some(&Value::from(1)), "{hostile}");
        }
        let (_, p) = rescheduled(&refused(
            &payload(&format!(r#","overrated":{}"#, MAX_RESCHEDULES - 1)),
            Refusal::Concurrency,
            10.0,
            0.0,
        ));
        assert_eq!(p.get(OVERRATED), Some(&Value::from(MAX_RESCHEDULES)));
    }
}
