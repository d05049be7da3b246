//! The transaction that records a batch of ended jobs.
//!
//! One `MULTI` per batch: each job leaves the list it is held in
//! (reliable: its batch list, or the in-progress list) together with its
//! outcome — the `retry` entry, the dead-set entry (the
//! one bury, which trims), its `schedule` entry when a cluster limit
//! rescheduled it, or its return to the front of its queue — and the
//! cancelled-set entry (and the close of its cancel request), the release
//! of the job's unique lock when it ended for good ([`unique`]), and the
//! `stat:*` counters the writer says are due ([`Stats`]: at most every
//! 10 ms, not with every batch). All land or none does, so a
//! failed write can simply be retried. When the batch holds every job a
//! batch list still has (`super::batches`), the list is deleted instead of
//! each job removed from it: one `DEL` for many `LREM`s.

use anyhow::{Context, Result};

use super::dead::DeadSet;
use super::requeue::Requeue;
use super::stats::Stats;
use super::unique;
use crate::redis::{Redis, keys};
use crate::runner::fetched::{Completion, Finish, Held};
use crate::runner::job_retry::Write;

/// How many jobs of each batch list a transaction takes out of it: once
/// Redis confirms it, they have left ([`Held::leave`]).
pub(super) type Leaving = Vec<(Held, usize)>;

/// Builds the transaction for `batch` and the counters `stats`.
/// `held_in` is this process's in-progress list (reliable; a job fetched
/// into a batch list is in that one), `requeue` the requeue script
/// (loaded in the transaction when used).
pub(super) fn transaction(
    batch: &[Completion],
    stats: &Stats,
    held_in: Option<&str>,
    dead: &DeadSet,
    requeue: &Requeue,
    now: f64,
) -> (redis::Pipeline, Leaving) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut buried = Vec::new();
    let mut closed = Vec::new();
    let mut requeue_loaded = false;
    let leaving = leaving(batch);
    // The batch lists this transaction empties: deleted at its end (after
    // any requeue has moved its job out), their jobs not removed one by one.
    let emptied: Vec<&Held> = leaving
        .iter()
        .filter(|(held, jobs)| held.left() == *jobs)
        .map(|(held, _)| held)
        .collect();
    for completion in batch {
        let job = &completion.job;
        let list = job.held.as_ref().map(Held::key).or(held_in);
        let write = match &completion.finish {
            // A hand-back is a requeue: back to the front, untouched.
            Finish::Requeue | Finish::Outcome(Write::HandBack) => {
                match list {
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
        match &job.held {
            Some(held) if emptied.iter().any(|e| e.same(held)) => {}
            // A batch list's head is its oldest job, the one likeliest done.
            Some(held) => {
                pipe.add_command(lrem(held.key(), 1, &job.raw)).ignore();
            }
            None => {
                if let Some(list) = held_in {
                    pipe.add_command(lrem(list, -1, &job.raw)).ignore();
                }
            }
        }
        match write {
            Write::Ack | Write::Drop | Write::HandBack | Write::Discard => {}
            Write::Retry { at, payload } => {
                pipe.cmd("ZADD").arg(keys::RETRY).arg(*at).arg(payload).ignore();
            }
            Write::Dead { payload } => buried.push(payload.as_str()),
            Write::Reschedule { at, payload } | Write::HandBackLater { at, payload } => {
                pipe.cmd("ZADD").arg(keys::SCHEDULE).arg(*at).arg(payload).ignore();
            }
            Write::Cancelled { jid, payload } => {
                crate::redis::control::stage_cancelled(&mut pipe, payload, now);
                closed.push(jid.as_str());
            }
        }
        unique::stage(&mut pipe, completion.unique.as_ref(), write);
    }
    for held in emptied {
        pipe.cmd("DEL").arg(held.key()).ignore();
    }
    dead.stage(&mut pipe, buried, now);
    crate::redis::control::stage_close(&mut pipe, &closed);
    stats.stage(&mut pipe, now);
    (pipe, leaving)
}

/// How many jobs of `batch` each batch list holds (a batch's jobs come
/// from a handful of lists, so a scan of the short list beats a map).
fn leaving(batch: &[Completion]) -> Leaving {
    let mut leaving: Leaving = Vec::new();
    for held in batch.iter().filter_map(|c| c.job.held.as_ref()) {
        match leaving.iter_mut().find(|(h, _)| h.same(held)) {
            Some((_, jobs)) => *jobs += 1,
            None => leaving.push((held.clone(), 1)),
        }
    }
    leaving
}

/// `LREM list count raw` (`-1`: the first from the tail, where an
/// in-progress list keeps its oldest; `1`: from the head, where a batch
/// list does), its buffers sized once: built the usual way, a command
/// grows its buffer as each argument is added (about three reallocations
/// a job for a payload of a few hundred bytes).
fn lrem(list: &str, count: i8, raw: &str) -> redis::Cmd {
    let mut lrem = redis::Cmd::with_capacity(4, "LREM".len() + list.len() + "-1".len() + raw.len());
    lrem.arg("LREM").arg(list).arg(count).arg(raw);
    lrem
}

/// Sends `transaction`, unless it has nothing to write (at-most-once
/// acks whose counters are not due yet, or a store's [`counters`] with
/// none: no round trip then).
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
    use crate::runner::fetched::Fetched;
    use crate::runner::source::dead::DeadCaps;

    fn packed(pipe: &redis::Pipeline) -> String {
        String::from_utf8_lossy(&pipe.get_packed_pipeline()).into_owned()
    }

    /// A job of a batch list leaves that list (not the in-progress list);
    /// the transaction holding every job the list still has deletes it
    /// instead, after a hand-back among them has moved its job out.
    #[test]
    fn the_last_jobs_of_a_batch_list_delete_it_whole() {
        let held = Held::new("wasmjobs:inprogress:me:b3".into(), 3, 3);
        let done = |jid: &str, finish: Finish| {
            let mut job = Fetched::new(format!(r#"{{"class":"A","args":[],"jid":"{jid}"}}"#), "default");
            job.held = Some(held.clone());
            Completion {
                id: 0,
                job,
                unique: None,
                finish,
            }
        };
        let dead = DeadSet::new(DeadCaps::default());
        let requeue = Requeue::new();
        let main = "wasmjobs:inprogress:me";
        let (first, leaving) = transaction(
            &[done("a", Finish::Outcome(Write::Ack))],
            &Stats::NONE,
            Some(main),
            &dead,
            &requeue,
            1.0,
        );
        let first = packed(&first);
        let lrem = "\r\n$4\r\nLREM\r\n";
        assert_eq!(first.matches(lrem).count(), 1, "{first}");
        assert!(
            first.contains("LREM\r\n$25\r\nwasmjobs:inprogress:me:b3\r\n$1\r\n1\r\n"),
            "from the head: {first}"
        );
        assert!(first.contains("wasmjobs:inprogress:me:b3"), "{first}");
        assert!(!first.contains("\r\nDEL\r\n"), "{first}");
        assert_eq!(leaving, [(held.clone(), 1)]);
        assert!(!held.leave(1), "two jobs left");
        let (last, leaving) = transaction(
            &[done("b", Finish::Requeue), done("c", Finish::Outcome(Write::Ack))],
            &Stats::NONE,
            Some(main),
            &dead,
            &requeue,
            1.0,
        );
        let last = packed(&last);
        assert_eq!(last.matches(lrem).count(), 0, "{last}");
        let requeued = last.find("EVALSHA").expect("the hand-back's requeue");
        let deleted = last.find("\r\nDEL\r\n").expect("the list deleted");
        assert!(requeued < deleted, "deleted after the requeue moved its job: {last}");
        assert_eq!(leaving, [(held.clone(), 2)]);
        assert!(held.leave(2), "empty");
    }

    /// The presized `LREM` is the command `redis::cmd` would build.
    #[test]
    fn the_presized_lrem_is_the_usual_command() {
        let raw = r#"{"class":"NoopJob","args":[],"jid":"abc"}"#;
        let usual = redis::cmd("LREM").arg("held").arg(-1).arg(raw).get_packed_command();
        assert_eq!(lrem("held", -1, raw).get_packed_command(), usual);
    }
}
