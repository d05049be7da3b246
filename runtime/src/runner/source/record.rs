//! The transaction that records a batch of ended jobs.
//!
//! One `MULTI` per batch: each job leaves the in-progress list (reliable)
//! together with its outcome — the `retry` entry, the dead-set entry (the
//! one bury, which trims), its `schedule` entry when a cluster limit
//! rescheduled it, or its return to the front of its queue — and the
//! cancelled-set entry (and the close of its cancel request), the release
//! of the job's unique lock when it ended for good ([`unique`]), and the
//! `stat:*` counters the writer says are due ([`Stats`]: at most every
//! 10 ms, not with every batch). All land or none does, so a
//! failed write can simply be retried.

use anyhow::{Context, Result};

use super::dead::DeadSet;
use super::requeue::Requeue;
use super::stats::Stats;
use super::unique;
use crate::redis::{Redis, keys};
use crate::runner::fetched::{Completion, Finish};
use crate::runner::job_retry::Write;

/// Builds the transaction for `batch` and the counters `stats`.
/// `held_in` is this process's in-progress list (reliable), `requeue` the
/// requeue script (loaded in the transaction when used).
pub(super) fn transaction(
    batch: &[Completion],
    stats: &Stats,
    held_in: Option<&str>,
    dead: &DeadSet,
    requeue: &Requeue,
    now: f64,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut buried = Vec::new();
    let mut closed = Vec::new();
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
                        pipe.cmd("SADD").arg(keys::QUEUES).arg(&*job.queue).ignore();
                    }
                }
                continue;
            }
            Finish::Outcome(write) => write,
        };
        if let Some(list) = held_in {
            pipe.add_command(lrem(list, &job.raw)).ignore();
        }
        match write {
            Write::Ack | Write::Drop | Write::HandBack | Write::Discard => {}
            Write::Retry { at, payload } => {
                pipe.cmd("ZADD").arg(keys::RETRY).arg(*at).arg(payload).ignore();
            }
            Write::Dead { payload } => buried.push(payload.as_str()),
            Write::Reschedule { at, payload } => {
                pipe.cmd("ZADD").arg(keys::SCHEDULE).arg(*at).arg(payload).ignore();
            }
            Write::Cancelled { jid, payload } => {
                crate::redis::control::stage_cancelled(&mut pipe, payload, now);
                closed.push(jid.as_str());
            }
        }
        unique::stage(&mut pipe, completion.unique.as_ref(), write);
    }
    dead.stage(&mut pipe, buried, now);
    crate::redis::control::stage_close(&mut pipe, &closed);
    stats.stage(&mut pipe, now);
    pipe
}

/// Sends `transaction`, unless it has nothing to write (at-most-once
/// acks whose counters are not due yet, or a store's [`counters`] with
/// none: no round trip then).
/// `LREM list -1 raw`, its buffers sized once: built the usual way, a
/// command grows its buffer as each argument is added (about three
/// reallocations a job for a payload of a few hundred bytes).
fn lrem(list: &str, raw: &str) -> redis::Cmd {
    let mut lrem = redis::Cmd::with_capacity(4, "LREM".len() + list.len() + "-1".len() + raw.len());
    lrem.arg("LREM").arg(list).arg(-1).arg(raw);
    lrem
}

pub(super) async fn send(transaction: redis::Pipeline, redis: &Redis) -> Result<()> {
    if transaction.is_empty() {
        return Ok(());
    }
    transaction
        .query_async::<()>(&mut redis.conn())
        .await
        .context("writing job outcomes")
}

/// What a batch of jobs kept elsewhere (the PostgreSQL store) writes to
/// Redis: the `stat:*` counters `stats` and the cancelled count, and the
/// release of unique locks held in Redis. Not atomic with the jobs' own
/// writes: counters, as Sidekiq's are. Empty when there is nothing to
/// add ([`send`] then sends nothing).
pub(super) fn counters(batch: &[Completion], stats: &Stats, now: f64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let mut cancelled = Vec::new();
    for completion in batch {
        let Finish::Outcome(write) = &completion.finish else {
            continue;
        };
        if let Write::Cancelled { jid, .. } = write {
            cancelled.push(jid.as_str());
        }
        unique::stage(&mut pipe, completion.unique.as_ref(), write);
    }
    if !cancelled.is_empty() {
        pipe.cmd("INCRBY")
            .arg(keys::STAT_CANCELLED)
            .arg(cancelled.len())
            .ignore();
        crate::redis::control::stage_close(&mut pipe, &cancelled);
    }
    stats.stage(&mut pipe, now);
    pipe
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The presized `LREM` is the command `redis::cmd` would build.
    #[test]
    fn the_presized_lrem_is_the_usual_command() {
        let raw = r#"{"class":"NoopJob","args":[],"jid":"abc"}"#;
        let usual = redis::cmd("LREM").arg("held").arg(-1).arg(raw).get_packed_command();
        assert_eq!(lrem("held", raw).get_packed_command(), usual);
    }
}
