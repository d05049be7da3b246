//! `wasmjobs pause QUEUE...` / `wasmjobs resume QUEUE...`: stop and start
//! fetching from queues, in every process sharing the Redis.
//!
//! Written to Sidekiq Pro's `paused` set (so Sidekiq's own tools see it)
//! and announced on the control channel: every wasmjobs process stops
//! fetching from a paused queue within a second; jobs already running
//! finish; pushing to the queue goes on. `wasmjobs pause` with no queue
//! lists the paused ones. With shards, each queue is paused on the shard
//! holding it, and the list covers every shard.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::control;
use crate::redis::shards::{close_all, open_all};

/// Arguments of `wasmjobs pause` and `wasmjobs resume`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The queues (none: list the paused queues).
    #[arg(value_name = "QUEUE")]
    pub queues: Vec<String>,
}

/// Runs `pause` (`paused` true) or `resume`.
pub async fn run(cli: &Cli, args: &PauseArgs, paused: bool) -> Result<ExitCode> {
    for queue in &args.queues {
        control::valid_queue(queue)?;
    }
    let map = args.redis.shard_map(&cli.data_dir)?;
    let shards = open_all(&map).await;
    let result = async {
        // Each queue is paused on its shard, which must be up.
        for (index, queues) in map.routes.group(args.queues.iter().map(String::as_str)) {
            let mut conn = shards[index].redis.as_ref().map_err(|err| anyhow!("{err:#}"))?.conn();
            let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
            match paused {
                true => control::pause(&mut conn, &queues).await?,
                false => control::resume(&mut conn, &queues).await?,
            }
        }
        // Every shard is listed; one that is down is said to be.
        let mut now = Vec::new();
        for shard in &shards {
            let listed = match &shard.redis {
                Ok(redis) => control::paused(&mut redis.conn()).await,
                Err(err) => Err(anyhow!("{err:#}")),
            };
            match (listed, map.is_sharded()) {
                (Ok(paused), false) => now.extend(paused),
                (Ok(paused), true) => now.extend(paused.into_iter().map(|q| format!("{q} (shard {})", shard.name))),
                (Err(err), false) => return Err(err),
                (Err(err), true) => eprintln!("cannot list the paused queues of shard {}: {err:#}", shard.name),
            }
        }
        anyhow::Ok(now)
    }
    .await;
    close_all(shards).await?;
    let now = result?;
    let verb = if paused { "paused" } else { "resumed" };
    for queue in &args.queues {
        match map.is_sharded() {
            true => println!("{queue}: {verb} (shard {})", map.for_queue(queue).1),
            false => println!("{queue}: {verb}"),
        }
    }
    match now.is_empty() {
        true => println!("no queue is paused"),
        false => println!("paused now: {}", now.join(", ")),
    }
    Ok(ExitCode::SUCCESS)
}
