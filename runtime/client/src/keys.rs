//! The Redis keys a producer writes.
//!
//! Sidekiq's own keys keep Sidekiq's names (so its workers, API and Web UI
//! see the jobs); keys only wasmjobs uses live under `wasmjobs:`. The
//! runtime's key module re-exports these, so each name is written once.

/// SET of known queue names.
pub const QUEUES: &str = "queues";
/// ZSET of jobs to run later (score: epoch seconds).
pub const SCHEDULE: &str = "schedule";
/// Prefix of the unique-job locks: `wasmjobs:unique:<sha256 hex>`, a
/// STRING holding the jid of the job that owns it, with a TTL
/// ([`crate::unique`]).
pub const UNIQUE_PREFIX: &str = "wasmjobs:unique:";

/// The pending list of `queue`.
pub fn queue(queue: &str) -> String {
    format!("queue:{queue}")
}

/// The unique-job lock for `digest` (64 lowercase hex characters).
pub fn unique(digest: &str) -> String {
    format!("{UNIQUE_PREFIX}{digest}")
}
