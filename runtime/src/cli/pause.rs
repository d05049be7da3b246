//! `wasmjobs pause QUEUE...` / `wasmjobs resume QUEUE...`: stop and start
//! fetching from queues, in every process sharing the Redis.
//!
//! Written to Sidekiq Pro's `paused` set (so Sidekiq's own tools see it)
//! and announced on the control channel: every wasmjobs process stops
//! fetching from a paused queue within a second; jobs already running
//! finish; pushing to the queue goes on. `wasmjobs pause` with no queue
//! lists the paused ones. With shards, each queue is paused on the shard
//! holding it, and the list covers every shard; a queue whose shard is
//! down is said not to be paused (or resumed), a shard that cannot be
//! listed is named, and either makes the exit status 1.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::control;
use crate::redis::shards::{ShardMap, close_all, open_all};

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
    if !map.is_sharded() {
        return one(&map, args, paused).await;
    }
    let shards = open_all(&map).await;
    let verb = if paused { "paused" } else { "resumed" };
    let mut failed = false;
    // Each queue on its shard; every shard tried, each queue's fate said.
    for (index, queues) in map.routes.group(args.queues.iter().map(String::as_str)) {
        let shard = &shards[index];
        let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
        let done = match &shard.redis {
            Ok(redis) => set(&mut redis.conn(), &queues, paused).await,
            Err(err) => Err(anyhow!("{err:#}")),
        };
        for queue in &queues {
            match &done {
                Ok(()) => println!("{queue}: {verb} (shard {})", shard.name),
                Err(err) => println!("{queue}: NOT {verb}: {err:#}"),
            }
        }
        failed |= done.is_err();
    }
    // Every shard listed; one that cannot be is named.
    let mut now = Vec::new();
    let mut unread = Vec::new();
    for shard in &shards {
        let listed = match &shard.redis {
            Ok(redis) => control::paused(&mut redis.conn()).await,
            Err(err) => Err(anyhow!("{err:#}")),
        };
        match listed {
            Ok(queues) => now.extend(queues.into_iter().map(|q| format!("{q} (shard {})", shard.name))),
            Err(err) => {
                eprintln!("cannot list the paused queues of shard {}: {err:#}", shard.name);
                unread.push(shard.name.as_str());
            }
        }
    }
    let unread_note = match unread.is_empty() {
        true => String::new(),
        false => format!(" (not read: shard {})", unread.join(", shard ")),
    };
    match now.is_empty() {
        true => println!("no queue is paused{unread_note}"),
        false => println!("paused now: {}{unread_note}", now.join(", ")),
    }
    failed |= !unread.is_empty();
    close_all(shards).await?;
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Without shards: the one Redis, whose errors are the command's.
async fn one(map: &ShardMap, args: &PauseArgs, paused: bool) -> Result<ExitCode> {
    let (_, _, target) = map.for_queue("");
    let redis = crate::redis::connect(target).await?;
    let mut conn = redis.conn();
    let result = async {
        set(&mut conn, &args.queues, paused).await?;
        control::paused(&mut conn).await
    }
    .await;
    redis.close().await?;
    let now = result?;
    let verb = if paused { "paused" } else { "resumed" };
    for queue in &args.queues {
        println!("{queue}: {verb}");
    }
    match now.is_empty() {
        true => println!("no queue is paused"),
        false => println!("paused now: {}", now.join(", ")),
    }
    Ok(ExitCode::SUCCESS)
}

/// Pauses (or resumes) `queues`, if any.
async fn set(conn: &mut redis::aio::ConnectionManager, queues: &[String], paused: bool) -> Result<()> {
    match (queues.is_empty(), paused) {
        (true, _) => Ok(()),
        (false, true) => control::pause(conn, queues).await,
        (false, false) => control::resume(conn, queues).await,
    }
}
