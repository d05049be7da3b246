//! Releasing unique-job locks as jobs end (or start).
//!
//! A unique job's payload names its lock (`unique_lock`, see
//! [`wasmjobs_client::unique`]). Which outcomes end the job for good, and
//! so release the lock, is decided once here, in [`releases`]; the outcome
//! transaction ([`super::record`]) stages the release beside the outcome
//! with [`stage`], so both land or neither does. The release is a
//! compare-and-delete on the job's own jid under our key prefix only, so a
//! forged payload cannot delete anything else, and a lock that expired and
//! was taken by a newer job is left alone.
//!
//! The lock is read from a payload once, when its unit of work parses it
//! (`runner::unit::TypedJob`; a payload without the field costs one
//! substring search), and travels with the job's outcome ([`Completion`]).

use crate::redis::Redis;
use crate::redis::unique::{Lock, UniqueUntil};
use crate::runner::fetched::{Completion, Finish};
use crate::runner::job_retry::Write;

/// Whether `write` ends the job for good, releasing its unique lock:
/// success, discard, dead set, dropped, cancelled. A retry keeps it (the job is still
/// to run). Exhaustive on purpose: a new outcome must decide (a job
/// rescheduled by a rate limit keeps its lock; a cancelled one releases).
pub(crate) fn releases(write: &Write) -> bool {
    match write {
        Write::Ack | Write::Discard | Write::Dead { .. } | Write::Drop | Write::Cancelled { .. } => true,
        Write::Retry { .. } | Write::Reschedule { .. } | Write::HandBack | Write::HandBackLater { .. } => false,
    }
}

/// Adds the release of the job's `lock` (if it names one) to `pipe`, if
/// `write` ends the job. Returns whether it did.
pub(crate) fn stage(pipe: &mut redis::Pipeline, lock: Option<&Lock>, write: &Write) -> bool {
    match lock {
        Some(lock) if releases(write) => {
            lock.stage_release(pipe);
            true
        }
        _ => false,
    }
}

/// How many releases a recorded `batch` carried (for `/metrics`).
pub(crate) fn released(batch: &[Completion]) -> u64 {
    batch
        .iter()
        .filter(|c| match &c.finish {
            Finish::Outcome(write) => releases(write) && c.unique.is_some(),
            Finish::Requeue => false,
        })
        .count() as u64
}

/// `unique_until: "start"`: releases the job's lock (`unique`, read from
/// its payload) as it starts, if it has one and asks for that. Returns
/// whether a release was sent; a failure is logged, and the lock then
/// lives until it expires.
pub(crate) async fn release_at_start(redis: &Redis, unique: Option<&(Lock, UniqueUntil)>, jid: &str) -> bool {
    match unique {
        Some((lock, UniqueUntil::Start)) => release_now(redis, lock, jid, "started").await,
        _ => false,
    }
}

/// Releases the lock of `raw` now (a job that died outside the outcome
/// transaction: a poison pill). Returns whether a release was sent.
pub(crate) async fn release_dead(redis: &Redis, raw: &str, jid: &str) -> bool {
    match Lock::from_payload(raw) {
        Some((lock, _)) => release_now(redis, &lock, jid, "died").await,
        None => false,
    }
}

async fn release_now(redis: &Redis, lock: &Lock, jid: &str, why: &str) -> bool {
    match lock.release(&mut redis.conn()).await {
        Ok(released) => {
            tracing::debug!(jid = %jid, lock = %lock.key(), released, "unique lock released: the job {why}");
            true
        }
        Err(err) => {
            tracing::warn!(jid = %jid, lock = %lock.key(), "{err:#}; the lock lives until it expires");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::payload::Payload;

    #[test]
    fn only_ends_release() {
        assert!(releases(&Write::Ack));
        assert!(releases(&Write::Discard));
        assert!(releases(&Write::Drop));
        assert!(releases(&Write::Dead { payload: "{}".into() }));
        assert!(!releases(&Write::Retry {
            at: 1.0,
            payload: "{}".into()
        }));
    }

    #[test]
    fn a_release_is_staged_only_for_a_unique_job_that_ended() {
        let job = wasmjobs_client::Job::new("X")
            .unique_for(std::time::Duration::from_secs(5))
            .to_payload(1.0)
            .unwrap()
            .0
            .to_json();
        let plain = Payload::new("X", vec![], "default", 1.0).to_json();
        let lock = |raw: &str| Lock::from_payload(raw).map(|(lock, _)| lock);
        assert!(lock(&plain).is_none());
        let mut pipe = redis::pipe();
        assert!(stage(&mut pipe, lock(&job).as_ref(), &Write::Ack));
        assert!(!stage(&mut pipe, lock(&plain).as_ref(), &Write::Ack));
        assert!(!stage(
            &mut pipe,
            lock(&job).as_ref(),
            &Write::Retry {
                at: 1.0,
                payload: job.clone()
            }
        ));
        assert_eq!(pipe.cmd_iter().count(), 1);
    }
}
