//! The transaction that records a batch of ended jobs.
//!
//! One `MULTI` per batch: each job leaves the in-progress list (reliable)
//! together with its outcome — the `retry` entry, the dead-set entry (the
//! one bury, which trims), its `schedule` entry when a cluster limit
//! rescheduled it, or its return to the front of its queue — and the
//! cancelled-set entry, the `stat:*` counters with their daily keys (a
//! reschedule counts in neither), and the release of the job's unique lock
//! when it ended for good ([`unique`]). All land or none does, so a failed
//! write can simply be retried.

use super::dead::DeadSet;
use super::requeue::Requeue;
use super::unique;
use crate::redis::{keys, utc_date};
use crate::runner::fetched::{Completion, Finish};
use crate::runner::job_retry::Write;

/// Builds the transaction for `batch`. `held_in` is this process's
/// in-progress list (reliable), `requeue` the requeue script (loaded in
/// the transaction when used).
pub(super) fn transaction(
    batch: &[Completion],
    held_in: Option<&str>,
    dead: &DeadSet,
    requeue: &Requeue,
    now: f64,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut processed = 0u64;
    let mut failed = 0u64;
    let mut discarded = 0u64;
    let mut buried = Vec::new();
    let mut requeue_loaded = false;
    for completion in batch {
        let job = &completion.job;
        let write = match &completion.finish {
            // A hand-back is a requeue: back to the front, untouched.
            Finish::Requeue | Finish::Outcome(Write::HandBack) => {
                match held_in {
                    Some(list) => {
                        if !requeue_loaded {
                            pipe.load_script(requeue.script()).ignore();
                            requeue_loaded = true;
                        }
                        let raw = job.raw.as_bytes();
                        pipe.invoke_script(&requeue.invocation(list, raw, raw, &job.queue))
                            .ignore();
                    }
                    None => {
                        pipe.cmd("RPUSH").arg(keys::queue(&job.queue)).arg(&job.raw).ignore();
                        pipe.cmd("SADD").arg(keys::QUEUES).arg(&job.queue).ignore();
                    }
                }
                continue;
            }
            Finish::Outcome(write) => write,
        };
        if write.is_processed() {
            processed += 1;
        }
        if let Some(list) = held_in {
            pipe.cmd("LREM").arg(list).arg(-1).arg(&job.raw).ignore();
        }
        match write {
            Write::Ack | Write::Drop | Write::HandBack => {}
            Write::Discard => discarded += 1,
            Write::Retry { at, payload } => {
                pipe.cmd("ZADD").arg(keys::RETRY).arg(*at).arg(payload).ignore();
            }
            Write::Dead { payload } => buried.push(payload.as_str()),
            Write::Reschedule { at, payload } => {
                pipe.cmd("ZADD").arg(keys::SCHEDULE).arg(*at).arg(payload).ignore();
            }
            Write::Cancelled { payload } => crate::redis::control::stage_cancelled(&mut pipe, payload, now),
        }
        unique::stage(&mut pipe, completion.unique.as_ref(), write);
        if write.is_failure() {
            failed += 1;
        }
    }
    dead.stage(&mut pipe, buried, now);
    let date = utc_date(now);
    incr(&mut pipe, keys::STAT_PROCESSED, &date, processed);
    incr(&mut pipe, keys::STAT_FAILED, &date, failed);
    if discarded > 0 {
        pipe.cmd("INCRBY").arg(keys::STAT_DISCARDED).arg(discarded).ignore();
    }
    pipe
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
