//! The parts of a runner that belong to one Redis shard (`docs/shards.md`).
//!
//! With one Redis there is one shard, the default. With several
//! (`--shard`, `--route`), each is a complete Sidekiq keyspace, and the
//! runner keeps, per shard: its connection, its copy of the paused set
//! and the Ruby Sidekiq processes seen on its queues ([`Shard`]); and,
//! wired by the launcher, its job source and outcome writer (for the
//! runner's queues it holds), its heartbeat and control listener, its
//! scheduled poller and its cron poller. What is the process's and not a
//! queue's (cluster limits, the published latency and per-minute counts)
//! lives on the default shard.
//!
//! The default shard must answer at start, as the one Redis must today.
//! Any other is connected to on first use: a shard that is down stops
//! only its queues, and is picked up, by every part, when it answers.

use std::sync::Arc;

use anyhow::Result;

use super::neighbours::Neighbours;
use super::queues::Queues;
use super::source::paused::Paused;
use crate::metrics::Metrics;
use crate::redis::Redis;
use crate::redis::shards::{ShardMap, connect_long_lived};

/// One shard, as this runner uses it.
pub(crate) struct Shard {
    /// Its index in the shard map (a job's [`Fetched::shard`]).
    ///
    /// [`Fetched::shard`]: super::fetched::Fetched::shard
    pub(crate) index: u16,
    /// Its name (`default` for the default shard).
    pub(crate) name: String,
    /// Its connection.
    pub(crate) redis: Redis,
    /// The runner's queues it holds, in their order and weights; `None`
    /// if it holds none (its scheduled jobs and cron ticks are still
    /// served).
    pub(crate) queues: Option<Queues>,
    /// Its paused set, as far as the runner's queues go.
    pub(crate) paused: Arc<Paused>,
    /// The Ruby Sidekiq processes on its queues.
    pub(crate) neighbours: Arc<Neighbours>,
}

impl Shard {
    /// The names of the runner's queues it holds.
    pub(crate) fn queue_names(&self) -> Vec<String> {
        self.queues.as_ref().map(Queues::names).unwrap_or_default()
    }
}

/// Opens every shard of `map` for a runner serving `queues`, and reads
/// each one's paused set and neighbours once (in parallel; a shard that
/// does not answer is said so and read again by its pollers).
pub(crate) async fn open(map: &ShardMap, queues: &Queues, metrics: &Arc<Metrics>) -> Result<Vec<Shard>> {
    let mut shards = Vec::new();
    for (index, (name, redis)) in connect_long_lived(map).await?.into_iter().enumerate() {
        let index = u16::try_from(index).map_err(|_| anyhow::anyhow!("more than {} shards", u16::MAX))?;
        let held = queues.only(|queue| map.routes.shard_of(queue) == usize::from(index));
        let names = held.as_ref().map(Queues::names).unwrap_or_default();
        let paused = Paused::new(names.clone(), Some(metrics.clone()));
        let neighbours = Neighbours::new(names, paused.clone(), metrics.clone());
        shards.push(Shard {
            index,
            name,
            redis,
            queues: held,
            paused,
            neighbours,
        });
    }
    let sharded = map.is_sharded();
    futures_util::future::join_all(shards.iter().map(|shard| async move {
        let on = match sharded {
            true => format!(" on shard {}", shard.name),
            false => String::new(),
        };
        if let Err(err) = shard.paused.refresh(&shard.redis).await {
            tracing::warn!("{err:#}{on}; fetching from every queue there until the paused set can be read");
        }
        if let Err(err) = shard.neighbours.refresh(&shard.redis).await {
            tracing::warn!("{err:#}{on}; cannot tell yet whether a Ruby Sidekiq process shares our queues there");
        }
    }))
    .await;
    for shard in shards.iter().filter(|shard| sharded && shard.queues.is_some()) {
        tracing::info!(shard = %shard.name, redis = %shard.redis.location, queues = ?shard.queue_names(), "serving shard");
    }
    Ok(shards)
}
