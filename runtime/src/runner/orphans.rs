//! Orphan recovery: jobs left in the in-progress list of a process that died.
//!
//! Every process with reliable fetch registers its in-progress list in
//! `wasmjobs:inprogress`. Periodically (and at start) each live process looks
//! for owners that are gone — no heartbeat any more, or, on the same host, a
//! pid that no longer exists (so a runner restarted after `kill -9` recovers
//! at once instead of waiting out the 60 s heartbeat expiry) — and claims
//! their jobs one at a time with an atomic move into its own list, so two
//! recovering processes never both take a job.
//!
//! Each recovered job counts its recoveries in `wasmjobs_recoveries`. A job
//! recovered more than `max_recoveries` times probably kills whatever runs
//! it (a poison pill) and goes to the dead set instead.

use std::time::Duration;

use anyhow::{Context, Result};
use rand::Rng;
use redis::Script;
use serde_json::Value;
use tokio::sync::watch;

use super::fetch::{Burier, Requeuer};
use super::heartbeat::Identity;
use crate::redis::payload::{self, Payload};
use crate::redis::{Redis, keys, now_f64};

/// Average time between recovery sweeps.
pub const INTERVAL: Duration = Duration::from_secs(60);

/// The payload field counting recoveries.
const RECOVERIES: &str = "wasmjobs_recoveries";

/// Removes ARGV[1] from the list KEYS[1] and adds ARGV[2] to the dead set
/// KEYS[2] with score ARGV[3].
const BURY_LUA: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) > 0 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  return 1
end
return 0
"#;

/// Forgets an owner whose list is empty.
const FORGET_LUA: &str = r#"
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
  return 1
end
return 0
"#;

/// Recovers orphaned in-progress jobs into this process.
pub struct OrphanRecovery {
    redis: Redis,
    me: Identity,
    own_list: String,
    max_recoveries: u64,
    requeuer: Requeuer,
    bury: Script,
    forget: Script,
}

impl OrphanRecovery {
    /// Recovery for the process `me`, using its in-progress list.
    pub fn new(redis: Redis, me: Identity, max_recoveries: u64) -> Self {
        let own_list = keys::inprogress(&me.identity);
        Self {
            redis,
            me,
            own_list,
            max_recoveries,
            requeuer: Requeuer::default(),
            bury: Script::new(BURY_LUA),
            forget: Script::new(FORGET_LUA),
        }
    }

    /// Sweeps about every [`INTERVAL`] until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let pause = INTERVAL.mul_f64(rand::rng().random_range(0.5..1.5));
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|&s| s) => return,
            }
            if let Err(err) = self.sweep().await {
                tracing::warn!("orphan recovery: {err:#}");
            }
        }
    }

    /// One sweep: recovers every dead owner's jobs. Returns how many jobs
    /// were handled (requeued or buried).
    pub async fn sweep(&self) -> Result<usize> {
        let mut conn = self.redis.conn();
        let owners: Vec<Vec<u8>> = redis::cmd("SMEMBERS")
            .arg(keys::INPROGRESS_OWNERS)
            .query_async(&mut conn)
            .await
            .context("listing in-progress owners")?;
        // wasmjobs writes identities as text; anything else is not ours.
        let owners: Vec<String> = owners.into_iter().filter_map(|o| String::from_utf8(o).ok()).collect();
        let mut handled = 0;
        for owner in owners.iter().filter(|o| **o != self.me.identity) {
            if self.alive(owner).await? {
                continue;
            }
            let list = keys::inprogress(owner);
            loop {
                let claimed: Option<Vec<u8>> = redis::cmd("RPOPLPUSH")
                    .arg(&list)
                    .arg(&self.own_list)
                    .query_async(&mut conn)
                    .await
                    .context("claiming an orphaned job")?;
                let Some(raw) = claimed else { break };
                self.handle(&raw).await?;
                handled += 1;
            }
            let _: i64 = self
                .forget
                .key(&list)
                .key(keys::INPROGRESS_OWNERS)
                .arg(owner)
                .invoke_async(&mut conn)
                .await
                .context("forgetting a dead owner")?;
            if handled > 0 {
                tracing::warn!(owner = %owner, jobs = handled, "recovered jobs of a process that died");
            }
        }
        Ok(handled)
    }

    /// Whether `owner` still runs: its heartbeat is there, and if it lives
    /// on this host, its pid exists.
    async fn alive(&self, owner: &str) -> Result<bool> {
        if let Some((host, pid)) = Identity::parse(owner)
            && host == self.me.hostname
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            return Ok(false);
        }
        let beating: bool = redis::cmd("EXISTS")
            .arg(owner)
            .query_async(&mut self.redis.conn())
            .await
            .context("checking a heartbeat")?;
        Ok(beating)
    }

    /// Requeues a claimed job, or buries it if it is a poison pill or not
    /// UTF-8 text (removed from our list by its exact bytes).
    async fn handle(&self, raw: &[u8]) -> Result<()> {
        let raw = match std::str::from_utf8(raw) {
            Ok(raw) => raw,
            Err(_) => {
                Burier::default()
                    .bury(&self.redis, Some(&self.own_list), raw, "default")
                    .await?;
                return Ok(());
            }
        };
        let now = now_f64();
        let (dead, queue) = match Payload::parse(raw) {
            Err(error) => (Some(payload::malformed(raw, &error, "default", now)), String::new()),
            Ok(mut job) => {
                let recoveries = job.get(RECOVERIES).and_then(Value::as_u64).unwrap_or(0) + 1;
                job.set(RECOVERIES, Value::from(recoveries));
                let queue = job.queue().to_owned();
                if recoveries > self.max_recoveries {
                    job.set(
                        "error_message",
                        Value::String(format!(
                            "the job was in progress in {recoveries} processes that died; treated as a poison pill"
                        )),
                    );
                    job.set("error_class", Value::String("wasmjobs::PoisonPill".into()));
                    job.set_time("failed_at", now);
                    (Some(job), queue)
                } else {
                    self.requeuer
                        .requeue(&self.redis, &self.own_list, raw, &queue, &job.to_json())
                        .await?;
                    (None, queue)
                }
            }
        };
        if let Some(dead) = dead {
            tracing::warn!(jid = %dead.jid(), class = %dead.class(), queue = %queue, "recovered job sent to the dead set");
            let _: i64 = self
                .bury
                .key(&self.own_list)
                .key(keys::DEAD)
                .arg(raw)
                .arg(dead.to_json())
                .arg(now)
                .invoke_async(&mut self.redis.conn())
                .await
                .context("burying a poison pill")?;
        }
        Ok(())
    }
}
