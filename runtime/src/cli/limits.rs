//! `wasmjobs limits`: what the cluster-wide limits are doing now.
//!
//! For every plugin with `limits.rate` or `[limits.per_key]` in use
//! (`docs/limits.md`): job starts in the current rate windows, key values
//! seen, concurrency leases held, and the jobs refused (rescheduled) by a
//! rate or a concurrency limit since the keys were created. Read from
//! Redis ([`crate::redis::limits`]), so it shows every process's use; the
//! same table closes `wasmjobs stats`.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::limits::limit_stats;

/// This command's name, in messages.
const COMMAND: &str = "limits";

/// Arguments of `wasmjobs limits`.
#[derive(Debug, Args)]
pub struct LimitsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &LimitsArgs) -> Result<ExitCode> {
    let redis = crate::redis::connect(&args.redis.single(&cli.data_dir, COMMAND)?).await?;
    let limits = limit_stats(&mut redis.conn()).await;
    redis.close().await?;
    let limits = limits?;
    match args.json {
        true => println!(
            "{}",
            serde_json::to_string_pretty(&limits).context("cannot serialise the limits")?
        ),
        false if limits.plugins.is_empty() => {
            println!("no cluster limits in use (no plugin with limits.rate or [limits.per_key] has run a job)")
        }
        false => print!("{}", super::stats::render_limits(&limits).trim_start_matches('\n')),
    }
    Ok(ExitCode::SUCCESS)
}
