//! Orphan recovery: the jobs held by processes that died.
//!
//! Every reliable process is registered in `wasmjobs:holders` (with its
//! [`Origin`] in `wasmjobs:origins`) by every heartbeat; processes from
//! before the batch lists registered in `wasmjobs:inprogress`, which is
//! swept too ([`keys::OWNER_SETS`]). A sweep — at start
//! and about once a minute — looks at every other registered owner and
//! judges it ([`super::liveness`]): dead only if its heartbeat expired, or
//! if it provably ran here and its process is gone. A dead owner's jobs —
//! in its in-progress list and its batch lists ([`keys::held_lists`]) — are
//! claimed one at a time with `RPOPLPUSH` into the sweeper's own list (so
//! two sweepers never both take a job), then each is requeued — or, past
//! `--max-recoveries`, buried as a poison pill ([`after_recovery`]). An
//! owner whose lists are all empty is then forgotten; a live one re-registers at
//! its next heartbeat anyway. An owner Redis refuses to recover (its list
//! is a key of another type, written by some other client) is said once
//! and skipped: the other owners are recovered all the same.

use anyhow::{Context, Result};
use redis::Script;
use serde_json::Value;

use super::dead::{DeadSet, Place};
use super::liveness::Origin;
use super::requeue::Requeue;
use super::scripts;
use crate::job::DEFAULT_QUEUE;
use crate::redis::payload::{self, Payload};
use crate::redis::{Redis, keys, now_f64};

/// The payload field counting recoveries.
pub(crate) const RECOVERIES: &str = "wasmjobs_recoveries";

/// What becomes of a job found in a dead process's list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Back to its queue, with its recoveries counted.
    Requeue(Payload),
    /// It was in progress in more than the allowed number of processes
    /// that died: probably what killed them. To the dead set.
    Poison(Payload),
}

/// The verdict on a recovered `job`, allowing `max_recoveries`.
pub(crate) fn after_recovery(mut job: Payload, max_recoveries: u64, now: f64) -> Verdict {
    let recoveries = job
        .get(RECOVERIES)
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .saturating_add(1);
    job.set(RECOVERIES, Value::from(recoveries));
    if recoveries <= max_recoveries {
        return Verdict::Requeue(job);
    }
    job.set(
        "error_message",
        Value::String(format!(
            "the job was in progress in {recoveries} processes that died; treated as a poison pill"
        )),
    );
    job.set("error_class", Value::String("wasmjobs::PoisonPill".into()));
    job.set_time("failed_at", now);
    Verdict::Poison(job)
}

/// One process's orphan recovery.
pub(crate) struct Recovery {
    pub(super) redis: Redis,
    pub(super) identity: String,
    pub(super) own_list: String,
    pub(super) origin: Option<Origin>,
    pub(super) max_recoveries: u64,
    pub(super) requeue: Requeue,
    pub(super) forget: Script,
    /// Owners whose recovery Redis refused, already reported.
    pub(super) refused: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Recovery {
    pub(super) fn new(redis: Redis, identity: &str, origin: Option<Origin>, max_recoveries: u64) -> Self {
        Self {
            redis,
            identity: identity.to_owned(),
            own_list: keys::inprogress(identity),
            origin,
            max_recoveries,
            requeue: Requeue::new(),
            forget: Script::new(scripts::FORGET),
            refused: Default::default(),
        }
    }

    /// One sweep; returns how many jobs were handled (requeued or buried).
    pub(super) async fn sweep(&self, dead: &DeadSet) -> Result<usize> {
        let mut conn = self.redis.conn();
        let mut owners: Vec<Vec<u8>> = Vec::new();
        for set in keys::OWNER_SETS {
            match redis::cmd("SMEMBERS")
                .arg(set)
                .query_async::<Vec<Vec<u8>>>(&mut conn)
                .await
            {
                Ok(members) => owners.extend(members),
                // Another client's key there stops the recovery of no owner
                // listed in the other set.
                Err(err) if err.code() == Some("WRONGTYPE") => {
                    let mut refused = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if refused.insert(set.to_owned()) {
                        tracing::warn!(
                            "orphan recovery skips the owners in {set} while it is not a set (said once): {err}"
                        );
                    }
                }
                Err(err) => return Err(err).context("listing in-progress owners"),
            }
        }
        owners.sort();
        owners.dedup();
        // wasmjobs writes identities as text; anything else is not ours.
        let owners: Vec<String> = owners
            .into_iter()
            .filter_map(|o| String::from_utf8(o).ok())
            .filter(|o| *o != self.identity)
            .collect();
        let mut handled = 0;
        for owner in &owners {
            match self.recover(owner, dead).await {
                Ok(claimed) => handled += claimed,
                Err(err) if crate::redis::bounded::answered_anyhow(&err) => {
                    let mut refused = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if refused.insert(owner.clone()) {
                        tracing::warn!(owner = %owner, "orphan recovery skips this owner while Redis refuses it (said once): {err:#}");
                    }
                }
                Err(err) => return Err(err),
            }
        }
        Ok(handled)
    }

    /// Recovers the jobs of `owner` if it is dead; returns how many.
    async fn recover(&self, owner: &str, dead: &DeadSet) -> Result<usize> {
        if self.alive(owner).await? {
            return Ok(0);
        }
        let mut conn = self.redis.conn();
        let lists = keys::held_lists(owner);
        let mut claimed_here = 0;
        for list in &lists {
            loop {
                let claimed: Option<Vec<u8>> = redis::cmd("RPOPLPUSH")
                    .arg(list)
                    .arg(&self.own_list)
                    .query_async(&mut conn)
                    .await
                    .context("claiming an orphaned job")?;
                let Some(raw) = claimed else { break };
                self.handle(&raw, dead).await?;
                claimed_here += 1;
            }
        }
        let mut forget = self.forget.prepare_invoke();
        for list in &lists {
            forget.key(list);
        }
        let _: i64 = forget
            .key(keys::HOLDERS)
            .key(keys::INPROGRESS_OWNERS)
            .key(keys::ORIGINS)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .context("forgetting a dead owner")?;
        if claimed_here > 0 {
            tracing::warn!(owner = %owner, jobs = claimed_here, "recovered jobs of a process that died");
        }
        Ok(claimed_here)
    }

    /// Whether `owner` still runs: provably, where this machine can check
    /// its origin; else as long as its heartbeat has not expired.
    async fn alive(&self, owner: &str) -> Result<bool> {
        let mut conn = self.redis.conn();
        if let Some(here) = &self.origin {
            let origin: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(keys::ORIGINS)
                .arg(owner)
                .query_async(&mut conn)
                .await
                .context("reading a process's origin")?;
            let origin = origin
                .and_then(|o| String::from_utf8(o).ok())
                .and_then(|o| Origin::decode(&o));
            if let Some(alive) = origin.and_then(|o| o.alive_seen_from(here)) {
                return Ok(alive);
            }
        }
        let beating: bool = redis::cmd("EXISTS")
            .arg(owner)
            .query_async(&mut conn)
            .await
            .context("checking a heartbeat")?;
        Ok(beating)
    }

    /// Requeues a claimed job, or buries it if it is a poison pill, not a
    /// job, or not UTF-8 text (removed from our list by its exact bytes).
    async fn handle(&self, raw: &[u8], dead: &DeadSet) -> Result<()> {
        let place = Place::List {
            key: &self.own_list,
            member: raw,
        };
        let Ok(text) = std::str::from_utf8(raw) else {
            dead.bury_undecodable(&self.redis, place, raw, DEFAULT_QUEUE).await?;
            return Ok(());
        };
        let now = now_f64();
        let (entry, queue) = match Payload::parse(text) {
            Err(error) => (
                payload::malformed(text, &error, DEFAULT_QUEUE, now),
                DEFAULT_QUEUE.to_owned(),
            ),
            Ok(job) => {
                let queue = job.queue().to_owned();
                match after_recovery(job, self.max_recoveries, now) {
                    Verdict::Requeue(job) => {
                        self.requeue
                            .run(&self.redis, &self.own_list, raw, job.to_json().as_bytes(), &queue)
                            .await
                            .context("requeueing a recovered job")?;
                        return Ok(());
                    }
                    Verdict::Poison(job) => (job, queue),
                }
            }
        };
        tracing::warn!(jid = %entry.jid(), class = %entry.job_class(), queue = %queue, "recovered job sent to the dead set");
        let buried = dead
            .bury(&self.redis, place, &entry.to_json(), now)
            .await
            .context("burying a recovered job")?;
        if buried {
            // A poison pill died: its unique lock goes with it.
            super::unique::release_dead(&self.redis, text, entry.jid()).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(recoveries: Option<u64>) -> Payload {
        let mut job = Payload::new("J", vec![], "q", 1.0);
        if let Some(n) = recoveries {
            job.set(RECOVERIES, Value::from(n));
        }
        job
    }

    #[test]
    fn recoveries_are_counted_until_the_job_is_a_poison_pill() {
        let Verdict::Requeue(first) = after_recovery(job(None), 3, 2.0) else {
            panic!("the first recovery requeues");
        };
        assert_eq!(first.get(RECOVERIES), Some(&Value::from(1)));
        let Verdict::Requeue(third) = after_recovery(job(Some(2)), 3, 2.0) else {
            panic!("the third recovery still requeues");
        };
        assert_eq!(third.get(RECOVERIES), Some(&Value::from(3)));
        let Verdict::Poison(dead) = after_recovery(job(Some(3)), 3, 2.0) else {
            panic!("the fourth is a poison pill");
        };
        assert_eq!(dead.str("error_class"), Some("wasmjobs::PoisonPill"));
        assert!(dead.str("error_message").is_some_and(|m| m.contains("4 processes")));
        assert!(dead.get("failed_at").is_some());
    }

    #[test]
    fn no_recovery_allowed_buries_at_once_and_counts_saturate() {
        assert!(matches!(after_recovery(job(None), 0, 2.0), Verdict::Poison(_)));
        assert!(matches!(
            after_recovery(job(Some(u64::MAX)), u64::MAX, 2.0),
            Verdict::Requeue(_)
        ));
    }
}
