//! The dead set, and the one way into it.
//!
//! Every path that gives up on a job — retries exhausted, a `dead` outcome,
//! a payload that is not a job or not text, a poison pill found in the lists
//! of dead processes, a bad member of `schedule`/`retry` — goes through
//! [`DeadSet`], whose script ([`super::scripts::BURY`]) adds the entry and
//! trims the set in the same step, as Sidekiq does: entries older than
//! [`DeadCaps::timeout`] go, and only the newest [`DeadCaps::max_jobs`]
//! stay. So no path can grow the set without bound.

use std::time::Duration;

use anyhow::{Context, Result};
use redis::Script;

use super::scripts;
use crate::redis::payload;
use crate::redis::{Redis, keys};

/// How much the dead set keeps (Sidekiq's `dead_max_jobs` and
/// `dead_timeout_in_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadCaps {
    /// Most entries kept (the newest).
    pub max_jobs: u64,
    /// Entries older than this are removed.
    pub timeout: Duration,
}

impl Default for DeadCaps {
    /// Sidekiq's defaults: 10,000 jobs, six months (180 days).
    fn default() -> Self {
        Self {
            max_jobs: 10_000,
            timeout: Duration::from_secs(180 * 24 * 3600),
        }
    }
}

/// Where a job to bury is now, so it leaves there in the same step.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// Nowhere in Redis (popped, or removed earlier in the same transaction).
    Nowhere,
    /// The exact bytes `member` in the list `key` (an in-progress list).
    List { key: &'a str, member: &'a [u8] },
    /// The exact bytes `member` in the sorted set `key` (`schedule`, `retry`).
    Set { key: &'a str, member: &'a [u8] },
}

/// The dead set with its caps.
pub(crate) struct DeadSet {
    caps: DeadCaps,
    script: Script,
}

impl DeadSet {
    pub(crate) fn new(caps: DeadCaps) -> Self {
        Self {
            caps,
            script: Script::new(scripts::BURY),
        }
    }

    /// Moves a job from `place` to the dead set as `entry` (its payload
    /// with the error fields), trimming the set. Returns false if the job
    /// was no longer in `place` (then nothing is written).
    pub(crate) async fn bury(&self, redis: &Redis, place: Place<'_>, entry: &str, now: f64) -> Result<bool> {
        let buried: i64 = self
            .invocation(place, entry, now)
            .invoke_async(&mut redis.conn())
            .await
            .context("writing to the dead set")?;
        Ok(buried == 1)
    }

    /// Adds the burial of `entries` (none in Redis any more, or removed
    /// earlier in `pipe`) to the transaction `pipe`.
    pub(crate) fn stage<'a>(&self, pipe: &mut redis::Pipeline, entries: impl IntoIterator<Item = &'a str>, now: f64) {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return;
        }
        // Inside MULTI a missing script cannot be loaded on demand.
        pipe.load_script(&self.script).ignore();
        for entry in entries {
            pipe.invoke_script(&self.invocation(Place::Nowhere, entry, now))
                .ignore();
        }
    }

    fn invocation<'s>(&'s self, place: Place<'_>, entry: &str, now: f64) -> redis::ScriptInvocation<'s> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(keys::DEAD);
        let (kind, member): (&str, &[u8]) = match place {
            Place::Nowhere => ("", b""),
            Place::List { key, member } => {
                invocation.key(key);
                ("list", member)
            }
            Place::Set { key, member } => {
                invocation.key(key);
                ("zset", member)
            }
        };
        invocation
            .arg(entry)
            .arg(now)
            .arg(now - self.caps.timeout.as_secs_f64())
            .arg(self.caps.max_jobs)
            .arg(kind)
            .arg(member);
        invocation
    }
}

impl DeadSet {
    /// Appends the settings the scripts' `bury_oversized` reads
    /// ([`super::scripts`]) to `invocation`: the payload limit, the time,
    /// and this set's caps.
    pub(crate) fn cap_args(&self, invocation: &mut redis::ScriptInvocation<'_>, max_payload: usize, now: f64) {
        invocation
            .arg(max_payload)
            .arg(now)
            .arg(now - self.caps.timeout.as_secs_f64())
            .arg(self.caps.max_jobs);
    }

    /// Buries `raw`, a payload over `max_payload` bytes that a blocking wait
    /// took from `queue`, out of `place` (an in-progress list, or nowhere).
    /// From a list it is found by its length and ends and buried inside
    /// Redis ([`super::scripts::BURY_OVERSIZED_HELD`]): its bytes are not
    /// sent back. Popped (nowhere), they are sent once
    /// ([`super::scripts::BURY_OVERSIZED_POPPED`]). Returns false if it was
    /// no longer in `place`.
    pub(crate) async fn bury_oversized(
        &self,
        redis: &Redis,
        place: Place<'_>,
        raw: &[u8],
        max_payload: usize,
        queue: &str,
    ) -> Result<bool> {
        const ENDS: usize = 256;
        let now = crate::redis::now_f64();
        let (script, mut invocation);
        match place {
            Place::List { key, .. } => {
                script = Script::new(scripts::BURY_OVERSIZED_HELD);
                invocation = script.prepare_invoke();
                invocation
                    .key(keys::DEAD)
                    .key(key)
                    .arg(raw.len())
                    .arg(&raw[..ENDS.min(raw.len())])
                    .arg(&raw[raw.len().saturating_sub(ENDS)..]);
            }
            Place::Nowhere | Place::Set { .. } => {
                script = Script::new(scripts::BURY_OVERSIZED_POPPED);
                invocation = script.prepare_invoke();
                invocation.key(keys::DEAD).arg(raw);
            }
        }
        self.cap_args(&mut invocation, max_payload, now);
        let mark: Option<Vec<u8>> = invocation
            .invoke_async(&mut redis.conn())
            .await
            .context("sending a payload over --max-payload to the dead set")?;
        match mark {
            Some(mark) => {
                oversized_buried(queue, &mark);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Whether the fetch script's `mark` for a job says it was over the
/// payload limit and buried (`o<size> <jid>`); logs it if so.
pub(crate) fn oversized_buried(queue: &str, mark: &[u8]) -> bool {
    let Some(rest) = mark.strip_prefix(b"o") else {
        return false;
    };
    let text = String::from_utf8_lossy(rest);
    let (bytes, jid) = text.split_once(' ').unwrap_or((&text, ""));
    tracing::warn!(
        queue = %queue,
        jid = %jid,
        bytes = %bytes,
        "a job over --max-payload was sent to the dead set unrun (kept whole there)"
    );
    true
}

impl DeadSet {
    /// Buries a payload that is not UTF-8 text, taken from `queue`: its
    /// dead entry keeps the exact bytes ([`payload::undecodable`]).
    pub(crate) async fn bury_undecodable(
        &self,
        redis: &Redis,
        place: Place<'_>,
        raw: &[u8],
        queue: &str,
    ) -> Result<bool> {
        let now = crate::redis::now_f64();
        let dead = payload::undecodable(raw, queue, now);
        let buried = self
            .bury(redis, place, &dead.to_json(), now)
            .await
            .context("sending a payload that is not UTF-8 text to the dead set")?;
        if buried {
            tracing::warn!(
                queue = %queue,
                jid = %dead.jid(),
                bytes = raw.len(),
                "a job payload that is not UTF-8 text was sent to the dead set"
            );
        }
        Ok(buried)
    }
}
