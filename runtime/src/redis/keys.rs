//! Every Redis key wasmjobs reads or writes.
//!
//! Sidekiq's own keys keep Sidekiq's names (so its clients, API and Web UI
//! see our state); keys only wasmjobs uses live under `wasmjobs:`.

// The producer's keys (queues, schedule, unique locks) are the client
// crate's, written once.
pub(crate) use wasmjobs_client::keys::{QUEUES, SCHEDULE, queue};
/// ZSET of failed jobs awaiting a retry (score: retry time).
pub(crate) const RETRY: &str = "retry";
/// ZSET of jobs out of retries (score: death time).
pub(crate) const DEAD: &str = "dead";
/// SET of live process identities.
pub(crate) const PROCESSES: &str = "processes";
/// Total processed jobs (Sidekiq counts failures as processed too).
pub(crate) const STAT_PROCESSED: &str = "stat:processed";
/// Total failed jobs.
pub(crate) const STAT_FAILED: &str = "stat:failed";
/// Jobs discarded at the guest's request (wasmjobs only).
pub(crate) const STAT_DISCARDED: &str = "wasmjobs:stat:discarded";
/// SET of identities that hold (or held) jobs in their in-progress list
/// and batch lists ([`held_lists`]), for orphan recovery.
pub(crate) const HOLDERS: &str = "wasmjobs:holders";
/// SET of identities of processes from before the batch lists (before
/// 2026-12-06), which hold jobs in their in-progress list alone: still
/// swept, never written. A separate set, because such a process forgets a
/// dead owner whose in-progress list is empty, which would strand jobs
/// left in a newer owner's batch lists.
pub(crate) const INPROGRESS_OWNERS: &str = "wasmjobs:inprogress";
/// Both owner sets, newest first.
pub(crate) const OWNER_SETS: [&str; 2] = [HOLDERS, INPROGRESS_OWNERS];
/// HASH of identity → where the process runs (boot id, PID namespace, pid,
/// start time), so a process on the same machine can prove it dead or alive.
pub(crate) const ORIGINS: &str = "wasmjobs:origins";
/// Daily stat keys live five years, as Sidekiq's.
pub(crate) const STATS_TTL_SECS: i64 = 5 * 365 * 24 * 3600;
/// Heartbeat keys expire after this many seconds without a beat.
pub(crate) const HEARTBEAT_TTL_SECS: i64 = 60;

/// A daily stat key, e.g. `stat:processed:2026-11-30`.
pub(crate) fn daily(stat: &str, date: &str) -> String {
    format!("{stat}:{date}")
}

/// The HASH of the jobs processed and failed in the UTC minute `minute`
/// (seconds since the epoch ÷ 60), every process merged; see
/// [`super::history`].
pub(crate) fn minute_stats(minute: u64) -> String {
    format!("wasmjobs:stat:minute:{minute}")
}

/// The in-progress list of the process `identity` (reliable fetch).
pub(crate) fn inprogress(identity: &str) -> String {
    format!("wasmjobs:inprogress:{identity}")
}

/// How many batch lists a reliable process may hold jobs in beside its
/// in-progress list: part of the protocol, since a process recovering a
/// dead one's jobs looks in exactly these.
pub(crate) const BATCH_LISTS: usize = 32;

/// The batch list `slot` (below [`BATCH_LISTS`]) of the process
/// `identity`: where one sorted fetch left its jobs
/// (`runner/source/batches.rs`).
pub(crate) fn batch_list(identity: &str, slot: usize) -> String {
    format!("wasmjobs:inprogress:{identity}:b{slot}")
}

/// Every list the process `identity` may hold jobs in: its in-progress
/// list first, then its batch lists.
pub(crate) fn held_lists(identity: &str) -> Vec<String> {
    std::iter::once(inprogress(identity))
        .chain((0..BATCH_LISTS).map(|slot| batch_list(identity, slot)))
        .collect()
}

/// The hash of jobs being worked on by `identity`, as Sidekiq ≥ 7 names it.
pub(crate) fn work(identity: &str) -> String {
    format!("{identity}:work")
}

/// The same, as Sidekiq 6 names it (its Web UI and `Sidekiq::Workers` read this).
pub(crate) fn workers(identity: &str) -> String {
    format!("{identity}:workers")
}

/// The list the Web UI pushes `TSTP` / `TERM` into for `identity`.
pub(crate) fn signals(identity: &str) -> String {
    format!("{identity}-signals")
}

/// Prefix of every cluster-limit key (`runner::limiter`, `docs/limits.md`).
pub(crate) const LIMIT_PREFIX: &str = "wasmjobs:limit:";

/// ZSET, the sliding-window log of a plugin's starts (`limits.rate`):
/// member `identity:n`, score the start time in Redis ms.
pub(crate) fn limit_rate(plugin: &str) -> String {
    format!("{LIMIT_PREFIX}{plugin}:rate")
}

/// String beside a rate's log (`limit_rate`, `limit_key_rate`): the next
/// turn handed to a job sent back to `schedule`, in Redis ms.
pub(crate) fn limit_turn(rate_key: &str) -> String {
    format!("{rate_key}:turn")
}

/// ZSET, the sliding-window log of one key value's starts
/// (`limits.per_key.rate`); `bucket` is a hash of the value, or `none`.
pub(crate) fn limit_key_rate(plugin: &str, bucket: &str) -> String {
    format!("{LIMIT_PREFIX}{plugin}:key:{bucket}:rate")
}

/// ZSET of one key value's concurrency leases
/// (`limits.per_key.concurrency`): member `identity:n`, score the lease's
/// expiry in Redis ms.
pub(crate) fn limit_key_leases(plugin: &str, bucket: &str) -> String {
    format!("{LIMIT_PREFIX}{plugin}:key:{bucket}:leases")
}

/// HASH of a plugin's jobs refused by its limits: `rate`, `concurrency` → count.
pub(crate) fn limit_overrated(plugin: &str) -> String {
    format!("{LIMIT_PREFIX}{plugin}:overrated")
}

/// SET of paused queue names, bare (Sidekiq Pro's `paused`; Sidekiq's own
/// `Stats#queue_summaries` reads it).
pub(crate) const PAUSED: &str = "paused";
/// Pub/sub channel on which `wasmjobs cancel`, `pause` and `resume` tell
/// every running process at once.
pub(crate) const CONTROL_CHANNEL: &str = "wasmjobs:control";
/// ZSET of cancelled jobs (score: cancel time), each payload with
/// `cancelled_at` and `cancelled_by`; capped like the dead set.
pub(crate) const CANCELLED: &str = "wasmjobs:cancelled";
/// Jobs cancelled in all.
pub(crate) const STAT_CANCELLED: &str = "wasmjobs:stat:cancelled";
/// Seconds a cancel request (`cancelled-<jid>`) is kept: the Sidekiq wiki's day.
pub(crate) const CANCEL_TTL_SECS: i64 = 86_400;
/// ZSET of the jids `wasmjobs cancel` asked for and did not see end
/// (score: when the request expires). While it holds one that has not
/// expired, every fetch looks up the cancel requests of the jobs it takes
/// (the fetch script's marks): a job pushed or fetched after the request
/// never starts, even in a process that missed the message.
pub(crate) const CANCELS_OPEN: &str = "wasmjobs:cancels:open";

/// A cancel request for `jid`, as the Sidekiq wiki's FAQ writes it (any
/// value; wasmjobs writes who and when as JSON).
pub(crate) fn cancel_request(jid: &str) -> String {
    format!("cancelled-{jid}")
}

/// The iteration state of `jid` (Sidekiq ≥ 7.3.3), whose `cancelled` field
/// `Sidekiq::Client#cancel!` sets.
pub(crate) fn iteration(jid: &str) -> String {
    format!("it-{jid}")
}

/// SET of the cron schedules' hash keys (sidekiq-cron 2.x, namespace
/// `default`); see `redis::cron`.
pub(crate) const CRON_JOBS: &str = "cron_jobs:default";

/// The HASH of the cron schedule `name` (sidekiq-cron 2.x).
pub(crate) fn cron_job(name: &str) -> String {
    format!("cron_job:default:{name}")
}

/// SET of the cron schedules' hash keys in sidekiq-cron 1.x's layout (no
/// namespace), which Sidekiq 6 apps on sidekiq-cron 1.x use.
pub(crate) const CRON_JOBS_V1: &str = "cron_jobs";

/// The HASH of the cron schedule `name` (sidekiq-cron 1.x).
pub(crate) fn cron_job_v1(name: &str) -> String {
    format!("cron_job:{name}")
}

/// The HASH of the latency histograms published in the UTC minute
/// `minute` (seconds since the epoch ÷ 60) by every process; see
/// `metrics::published`.
pub(crate) fn latency(minute: u64) -> String {
    format!("wasmjobs:latency:{minute}")
}
