//! Moving a due job from `schedule` or `retry` to its queue.
//!
//! Each move is one Lua call ([`crate::redis::enqueue::ENQUEUE_DUE`], the
//! dashboard's too: `ZREM` then
//! `LPUSH`), so when several processes poll at once a job is enqueued
//! exactly once: whoever removes it pushes it. The moved job gets a fresh
//! `enqueued_at` (in its own time style); everything else is kept. A member
//! that is not a valid job (not UTF-8 text, not JSON, no class...) goes to
//! the dead set instead, removed by its exact bytes, so a bad entry never
//! stops the poller. Members over the payload limit are buried by the
//! script that reads the due members, inside Redis: the poller never
//! holds them.

use anyhow::{Context, Result};
use redis::Script;

use super::dead::{DeadCaps, DeadSet, Place};
use super::scripts;
use crate::job::DEFAULT_QUEUE;
use crate::redis::payload::{self, Payload};
use crate::redis::{Redis, keys};

/// Moves due members of the sorted sets to their queues.
pub(crate) struct DueMover {
    due: Script,
    enqueue: Script,
    dead: DeadSet,
    max_payload: usize,
}

impl DueMover {
    /// A mover burying bad members in a dead set with `dead`'s caps, and
    /// members over `max_payload` bytes (0: no limit) without reading them.
    pub(crate) fn new(dead: DeadCaps, max_payload: usize) -> Self {
        Self {
            due: Script::new(scripts::DUE),
            enqueue: Script::new(crate::redis::enqueue::ENQUEUE_DUE),
            dead: DeadSet::new(dead),
            max_payload,
        }
    }

    /// Adds to `pipe` the reading of up to `batch` members of `set` due at
    /// `now` ([`scripts::DUE`]: those over the payload limit are buried in
    /// Redis, never read). The script must be loaded first in the same
    /// pipeline ([`DueMover::load`]).
    pub(crate) fn stage_due(&self, pipe: &mut redis::Pipeline, set: &str, batch: usize, now: f64) {
        let mut invocation = self.due.prepare_invoke();
        invocation.key(set).key(keys::DEAD).arg(batch);
        self.dead.cap_args(&mut invocation, self.max_payload, now);
        pipe.invoke_script(&invocation);
    }

    /// Adds loading the due script to `pipe` (a pipeline cannot load a
    /// missing script on demand).
    pub(crate) fn load(&self, pipe: &mut redis::Pipeline) {
        pipe.load_script(&self.due).ignore();
    }

    /// Enqueues the due `member` of `set` (or buries it if it is not a
    /// valid job). Returns false if someone else moved it first.
    pub(crate) async fn move_one(&self, redis: &Redis, set: &str, member: &[u8], now: f64) -> Result<bool> {
        let parsed = match std::str::from_utf8(member) {
            Ok(text) => Payload::parse(text).map_err(|error| payload::malformed(text, &error, DEFAULT_QUEUE, now)),
            Err(_) => Err(payload::undecodable(member, DEFAULT_QUEUE, now)),
        };
        match parsed {
            Ok(mut job) => {
                job.set_time("enqueued_at", now);
                let queue = job.queue().to_owned();
                let moved: i64 = self
                    .enqueue
                    .key(set)
                    .key(keys::queue(&queue))
                    .key(keys::QUEUES)
                    .arg(member)
                    .arg(job.to_json())
                    .arg(&queue)
                    .invoke_async(&mut redis.conn())
                    .await
                    .context("enqueueing a due job")?;
                Ok(moved == 1)
            }
            Err(dead) => {
                tracing::warn!(
                    set,
                    jid = %dead.jid(),
                    "malformed job sent to the dead set: {}",
                    dead.str("error_message").unwrap_or_default()
                );
                let place = Place::Set { key: set, member };
                self.dead
                    .bury(redis, place, &dead.to_json(), now)
                    .await
                    .context("burying a malformed job")
            }
        }
    }
}
