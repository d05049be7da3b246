//! The job source: the whole work protocol between this process and Redis.
//!
//! Everything that decides where a job is — in a queue, in this process's
//! in-progress list, in `retry` / `schedule`, in the dead set, back in its
//! queue — is done here, so at-least-once delivery has one owner. The rest
//! of the runner sees one trait, [`JobSource`], and never the fetch mode
//! (after Sidekiq's `fetch` with its `UnitOfWork`):
//!
//! | call | reliable ([`reliable::Reliable`]) | basic ([`basic::Basic`]) |
//! |---|---|---|
//! | [`fetch`](JobSource::fetch) | one Lua call moves up to *n* jobs into `wasmjobs:inprogress:<identity>` | the same call pops them |
//! | [`wait`](JobSource::wait) | `BLMOVE` per queue, on its own connection | one `BRPOP` over all queues |
//! | [`record`](JobSource::record) | one `MULTI`: `LREM` from the list + the outcome | the outcome |
//! | [`requeue_all`](JobSource::requeue_all) | every job still in the list, to the front of its queue | the jobs given |
//! | [`recover_orphans`](JobSource::recover_orphans) | claim the lists of dead processes ([`orphans`]) | nothing to recover |
//! | [`register`](JobSource::register) | in `wasmjobs:inprogress`, with every heartbeat | nothing |
//!
//! Every Lua script lives in [`scripts`]; every way into the dead set is
//! [`dead::DeadSet`], which trims it. `docs/redis-engine.md` draws a job's
//! life through these states.

pub(crate) mod basic;
mod batches;
pub(crate) mod dead;
mod doubt;
pub(crate) mod due;
pub(crate) mod liveness;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod orphans;
pub(crate) mod paused;
pub(crate) mod postgres;
mod record;
pub(crate) mod reliable;
mod requeue;
mod scripts;
pub(crate) mod sharded;
mod stats;
mod take;
pub(crate) mod unique;
mod waiters;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_util::future::BoxFuture;

pub use dead::DeadCaps;
/// The fetch script, for the benchmarks' native baseline (the same
/// protocol text, not a copy).
pub use scripts::FETCH as FETCH_SCRIPT;
pub(crate) use stats::Stats;

use super::fetched::{Completion, Fetched, Known};
use super::queues::Queues;
use crate::redis::Redis;

/// Most jobs one fetch moves (also bounded by free slots).
pub(crate) const MAX_BATCH: usize = 500;

/// How long one blocking call waits in Redis before the loop re-checks
/// whether it should still be waiting. Shutdown does not wait for it
/// (`CLIENT UNBLOCK`), so it is long: each return is a wake-up, and on a VM
/// a wake-up costs ~0.4 ms of CPU, the bulk of an idle runner's cost
/// (docs/performance.md). A connection that dies silently is noticed after
/// this plus the response timeout.
pub(crate) const BLOCK: Duration = Duration::from_secs(15);

/// The delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FetchMode {
    /// At-least-once: jobs are held in a per-process in-progress list.
    #[default]
    Reliable,
    /// At-most-once: jobs are popped; a crash loses the jobs in flight.
    Basic,
}

/// What a job source needs to know about its process.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The delivery guarantee.
    pub(crate) mode: FetchMode,
    /// The queues to take jobs from, and in what order.
    pub(crate) queues: Queues,
    /// This process's identity (`hostname:pid:nonce`).
    pub(crate) identity: String,
    /// Recoveries after which a job is a poison pill.
    pub(crate) max_recoveries: u64,
    /// What the dead set keeps.
    pub(crate) dead: DeadCaps,
    /// Bytes a job's payload may have (0: no limit); a larger one goes to
    /// the dead set unrun, from inside Redis when it can.
    pub(crate) max_payload: usize,
    /// Ruby clients may cancel jobs by writing `cancelled-<jid>` or
    /// `it-<jid>` without a message: every fetch looks them up
    /// (`run --sidekiq-cancels`).
    pub(crate) sidekiq_cancels: bool,
}

/// The work protocol, as the runner sees it. Futures are boxed so the
/// runner holds any source as `Arc<dyn JobSource>`.
pub(crate) trait JobSource: Send + Sync {
    /// Takes up to `max` jobs without blocking: first any a waiter found,
    /// then from the queues in order.
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>>;

    /// Waits (in Redis, without polling) until a job can be taken, and
    /// takes it. Cancel-safe: a job found after the future is dropped is
    /// kept for the next [`fetch`](JobSource::fetch).
    fn wait(&self) -> BoxFuture<'_, Option<Fetched>>;

    /// Stops waiting for good (before anything is requeued at shutdown);
    /// returns jobs taken but not handed out.
    fn stop_waiting(&self) -> BoxFuture<'_, Vec<Fetched>>;

    /// Notes that a reply may have been lost: a call may have moved jobs
    /// into this process's list without us knowing which.
    fn doubt(&self);

    /// Whether a [`reconcile`](JobSource::reconcile) is due now.
    fn take_doubt(&self) -> bool;

    /// Puts back in their queues the jobs held for this process that are
    /// not in `known` (running, or awaiting their outcome write). Returns
    /// how many.
    fn reconcile<'a>(&'a self, known: &'a Known) -> BoxFuture<'a, Result<usize>>;

    /// Adds this process's registration to a heartbeat transaction, so a
    /// process is registered as long as it beats.
    fn register(&self, pipe: &mut redis::Pipeline);

    /// Writes a batch of ended jobs in one transaction: each leaves this
    /// process, and its outcome (retry, dead, requeue) lands with it, or
    /// nothing does; `stats` (the counters the writer owes, of this batch
    /// and earlier ones, or none) land with them. `batch` may be empty.
    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>>;

    /// At shutdown, after every outcome is recorded: puts `jobs` (taken but
    /// never started) and anything else still held for this process back
    /// at the front of their queues. Returns how many.
    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64>;

    /// [`requeue_all`](JobSource::requeue_all), leaving alone the shards
    /// in `stuck`, whose outcomes could not all be recorded (their jobs
    /// stay held, for recovery). A source of one Redis is shard 0: with
    /// it stuck, nothing is requeued.
    fn requeue_all_except<'a>(&'a self, jobs: Vec<Fetched>, stuck: &'a [u16]) -> BoxFuture<'a, u64> {
        match stuck.is_empty() {
            true => self.requeue_all(jobs),
            false => Box::pin(async { 0 }),
        }
    }

    /// [`unregister`](JobSource::unregister), leaving alone the shards in
    /// `stuck` (see [`requeue_all_except`](JobSource::requeue_all_except)).
    fn unregister_except<'a>(&'a self, stuck: &'a [u16]) -> BoxFuture<'a, ()> {
        match stuck.is_empty() {
            true => self.unregister(),
            false => Box::pin(async {}),
        }
    }

    /// Jobs the source's waiters already took and hold for the next
    /// fetch, up to `max`, without a round trip (none for a source
    /// without waiters).
    fn take_found(&self, _max: usize) -> Vec<Fetched> {
        Vec::new()
    }

    /// Takes over the jobs of processes that died. Returns how many jobs
    /// were handled (requeued or buried).
    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>>;

    /// How many jobs wait, due, in this process's queues
    /// (`--exit-when-empty`); a store may stop counting at one.
    fn waiting(&self) -> BoxFuture<'_, Result<u64>>;

    /// At a clean shutdown: this process holds nothing any more.
    fn unregister(&self) -> BoxFuture<'_, ()>;
}

/// The length of `queues` in Redis, summed.
/// A queue key of another type (another client's) counts as empty: it is
/// skipped by the fetch too.
pub(crate) async fn redis_waiting(redis: &Redis, queues: &[impl AsRef<str>]) -> Result<u64> {
    let script = ::redis::Script::new(scripts::WAITING);
    let mut invocation = script.prepare_invoke();
    for queue in queues {
        invocation.key(crate::redis::keys::queue(queue.as_ref()));
    }
    Ok(invocation.invoke_async(&mut redis.conn()).await?)
}

/// Where jobs are kept.
#[derive(Debug, Clone)]
pub enum Store {
    /// In Redis, in Sidekiq's layout (the default).
    Redis,
    /// In PostgreSQL (`--source postgres://…`), each claim leased for this long.
    Postgres { pg: Box<crate::pg::Pg>, lease: Duration },
}

impl Store {
    /// What a heartbeat says of it: `redis`, or the PostgreSQL store's
    /// location (no password).
    pub(crate) fn location(&self) -> String {
        match self {
            Store::Redis => "redis".to_owned(),
            Store::Postgres { pg, .. } => pg.location.clone(),
        }
    }
}

/// The job source for `settings` on `store`, leaving out the queues
/// `paused` holds.
pub(crate) fn open(store: &Store, redis: Redis, settings: Settings, paused: Arc<paused::Paused>) -> Arc<dyn JobSource> {
    match (store, settings.mode) {
        (Store::Postgres { pg, lease }, _) => {
            Arc::new(postgres::Postgres::new((**pg).clone(), redis, settings, paused, *lease))
        }
        (Store::Redis, FetchMode::Reliable) => Arc::new(reliable::Reliable::new(redis, settings, paused)),
        (Store::Redis, FetchMode::Basic) => Arc::new(basic::Basic::new(redis, settings, paused)),
    }
}

/// Average time between orphan-recovery sweeps.
pub(crate) const RECOVERY_INTERVAL: Duration = Duration::from_secs(60);

/// Recovers orphans about every [`RECOVERY_INTERVAL`] (randomised, so
/// processes started together do not sweep together) until `stop`.
pub(crate) async fn recover_orphans_periodically(
    source: Arc<dyn JobSource>,
    stop: tokio_util::sync::CancellationToken,
) {
    use rand::Rng;
    loop {
        let pause = RECOVERY_INTERVAL.mul_f64(rand::rng().random_range(0.5..1.5));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return,
        }
        match source.recover_orphans().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(jobs = n, "recovered jobs left by processes that died"),
            Err(err) => tracing::warn!("orphan recovery: {err:#}"),
        }
    }
}
