//! Putting a held job back at the front of its queue ([`scripts::REQUEUE`]),
//! only if it is still in the list: shared by reconcile and shutdown
//! ([`super::reliable`]), orphan recovery ([`super::orphans`]) and the
//! outcome transaction ([`super::record`]).

use anyhow::{Context, Result};
use redis::{Script, ScriptInvocation};

use super::scripts;
use crate::redis::{Redis, keys};

/// The requeue script.
pub(super) struct Requeue {
    script: Script,
}

impl Requeue {
    pub(super) fn new() -> Self {
        Self {
            script: Script::new(scripts::REQUEUE),
        }
    }

    /// The script itself (to load it inside a transaction).
    pub(super) fn script(&self) -> &Script {
        &self.script
    }

    /// Moves `raw` from `list` to the front of `queue` as `replacement`,
    /// if it is still in `list`.
    pub(super) fn invocation(&self, list: &str, raw: &[u8], replacement: &[u8], queue: &str) -> ScriptInvocation<'_> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(list)
            .key(keys::queue(queue))
            .key(keys::QUEUES)
            .arg(raw)
            .arg(replacement)
            .arg(queue);
        invocation
    }

    /// Runs [`Requeue::invocation`]; returns whether the job moved.
    pub(super) async fn run(
        &self,
        redis: &Redis,
        list: &str,
        raw: &[u8],
        replacement: &[u8],
        queue: &str,
    ) -> Result<bool> {
        let moved: i64 = self
            .invocation(list, raw, replacement, queue)
            .invoke_async(&mut redis.conn())
            .await
            .context("requeueing a job")?;
        Ok(moved == 1)
    }
}
