//! The poller: moves due jobs from `schedule` and `retry` to their queues.
//!
//! Each move is one Lua call (`ZREM` then `LPUSH`), so when several processes
//! poll at once a job is enqueued exactly once: whoever removes it pushes it.
//! As in Sidekiq, the pause between polls is random around
//! `poll_interval × live processes`, so a cluster polls about once per
//! `poll_interval` in total and processes do not stampede. The moved job gets
//! a fresh `enqueued_at` (in its own time style); everything else is kept.
//!
//! Members are read as bytes: one that is not a valid job (not UTF-8 text,
//! not JSON, no class...) is moved to the dead set, removed by its exact
//! bytes, instead of stopping the poller for every process.
//!
//! When a plugin appears for a class that had none, the jobs of that class
//! waiting in `retry` for it ([`Poller::release_unserved`]) are enqueued at
//! once instead of at their backoff time.

use std::time::Duration;

use anyhow::{Context, Result};
use rand::Rng;
use redis::Script;
use tokio::sync::watch;

use crate::redis::payload::{self, Payload};
use crate::redis::{Redis, keys, now_f64};

/// The `error_class` of a job retried because no plugin served its class.
const NO_PLUGIN: &str = super::job_retry::NO_PLUGIN;

/// Jobs taken per `ZRANGEBYSCORE` round.
const BATCH: isize = 100;

/// Moves ARGV[1] from the set KEYS[1] to the list KEYS[2] as ARGV[2], and
/// adds ARGV[3] to the queue set KEYS[3], if it is still in the set.
const ENQUEUE_LUA: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

/// Moves ARGV[1] from the set KEYS[1] to the dead set KEYS[2] as ARGV[2].
const BURY_LUA: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  return 1
end
return 0
"#;

/// The scheduled-job poller.
pub struct Poller {
    redis: Redis,
    average: Duration,
    enqueue: Script,
    bury: Script,
}

impl Poller {
    /// A poller whose average pause per process is `average`.
    pub fn new(redis: Redis, average: Duration) -> Self {
        Self {
            redis,
            average,
            enqueue: Script::new(ENQUEUE_LUA),
            bury: Script::new(BURY_LUA),
        }
    }

    /// Polls until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        // A random first wait spreads processes started together.
        let mut pause = self.average.mul_f64(rand::rng().random_range(0.0..1.0));
        loop {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|&s| s) => return,
            }
            let processes = match self.poll().await {
                Ok((_, processes)) => processes,
                Err(err) => {
                    tracing::warn!("scheduled poller: {err:#}");
                    1
                }
            };
            let average = self.average.mul_f64(processes.max(1) as f64);
            pause = average.mul_f64(rand::rng().random_range(0.5..1.5));
        }
    }

    /// Moves every due job of `schedule` and `retry`; returns how many moved.
    pub async fn enqueue_due(&self) -> Result<usize> {
        Ok(self.poll().await?.0)
    }

    /// One poll: the first batch of due jobs of both sets and the number of
    /// live processes (for the next pause) in a single round trip, which is
    /// all an idle cluster costs; then moves what is due, batch by batch.
    /// Returns (jobs moved, live processes).
    async fn poll(&self) -> Result<(usize, u64)> {
        let now = now_f64();
        let mut pipe = redis::pipe();
        for set in [keys::SCHEDULE, keys::RETRY] {
            pipe.add_command(due_batch(set, now));
        }
        pipe.cmd("SCARD").arg(keys::PROCESSES);
        let (schedule, retry, processes): (Vec<Vec<u8>>, Vec<Vec<u8>>, u64) = pipe
            .query_async(&mut self.redis.conn())
            .await
            .context("reading due scheduled and retry jobs")?;
        let mut moved = 0;
        for (set, mut due) in [(keys::SCHEDULE, schedule), (keys::RETRY, retry)] {
            loop {
                for member in &due {
                    moved += self.move_one(set, member, now).await? as usize;
                }
                if (due.len() as isize) < BATCH {
                    break;
                }
                due = due_batch(set, now_f64())
                    .query_async(&mut self.redis.conn())
                    .await
                    .with_context(|| format!("reading due jobs from {set}"))?;
            }
        }
        if moved > 0 {
            tracing::debug!(moved, "enqueued due scheduled/retry jobs");
        }
        Ok((moved, processes))
    }

    /// Enqueues now the jobs in `retry` that failed only because no plugin
    /// served their class (`error_class` `wasmjobs::NoPlugin`) and whose
    /// class is in `classes`. Returns how many moved.
    pub async fn release_unserved(&self, classes: &[String]) -> Result<usize> {
        let mut moved = 0;
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("ZSCAN")
                .arg(keys::RETRY)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut self.redis.conn())
                .await
                .context("scanning the retry set")?;
            // ZSCAN returns member, score, member, score...
            for member in page.iter().step_by(2) {
                // Not text: not a job waiting for a plugin (the poller buries it when due).
                let Ok(text) = std::str::from_utf8(member) else {
                    continue;
                };
                if !text.contains(NO_PLUGIN) {
                    continue;
                }
                let Ok(job) = Payload::parse(text) else { continue };
                if job.str("error_class") == Some(NO_PLUGIN) && classes.iter().any(|c| c == job.class()) {
                    moved += self.move_one(keys::RETRY, member, now_f64()).await? as usize;
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(moved)
    }

    /// Enqueues the due `member` of `set`, or, if it is not a valid job
    /// (not UTF-8 text, not JSON, ...), moves it to the dead set, so a bad
    /// entry never stops the poller. Removed from `set` by its exact bytes.
    async fn move_one(&self, set: &str, member: &[u8], now: f64) -> Result<bool> {
        let mut conn = self.redis.conn();
        let parsed = match std::str::from_utf8(member) {
            Ok(text) => Payload::parse(text).map_err(|error| payload::malformed(text, &error, "default", now)),
            Err(_) => Err(payload::undecodable(member, "default", now)),
        };
        let moved: i64 = match parsed {
            Ok(mut job) => {
                job.set_time("enqueued_at", now);
                let queue = job.queue().to_owned();
                self.enqueue
                    .key(set)
                    .key(keys::queue(&queue))
                    .key(keys::QUEUES)
                    .arg(member)
                    .arg(job.to_json())
                    .arg(&queue)
                    .invoke_async(&mut conn)
                    .await
                    .context("enqueueing a due job")?
            }
            Err(dead) => {
                tracing::warn!(
                    set,
                    jid = %dead.jid(),
                    "malformed job sent to the dead set: {}",
                    dead.str("error_message").unwrap_or_default()
                );
                self.bury
                    .key(set)
                    .key(keys::DEAD)
                    .arg(member)
                    .arg(dead.to_json())
                    .arg(now)
                    .invoke_async(&mut conn)
                    .await
                    .context("burying a malformed job")?
            }
        };
        Ok(moved == 1)
    }
}

/// `ZRANGEBYSCORE set -inf now LIMIT 0 BATCH`: the next due members of `set`.
fn due_batch(set: &str, now: f64) -> redis::Cmd {
    let mut cmd = redis::cmd("ZRANGEBYSCORE");
    cmd.arg(set).arg("-inf").arg(now).arg("LIMIT").arg(0).arg(BATCH);
    cmd
}
