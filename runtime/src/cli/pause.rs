//! `wasmjobs pause QUEUE...` / `wasmjobs resume QUEUE...`: stop and start
//! fetching from queues, in every process sharing the Redis.
//!
//! Written to Sidekiq Pro's `paused` set (so Sidekiq's own tools see it)
//! and announced on the control channel: every wasmjobs process stops
//! fetching from a paused queue within a second; jobs already running
//! finish; pushing to the queue goes on. `wasmjobs pause` with no queue
//! lists the paused ones.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::control;

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
    let redis = crate::redis::connect(&args.redis.target(&cli.data_dir)).await?;
    let mut conn = redis.conn();
    let result = async {
        if !args.queues.is_empty() {
            match paused {
                true => control::pause(&mut conn, &args.queues).await?,
                false => control::resume(&mut conn, &args.queues).await?,
            }
        }
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
