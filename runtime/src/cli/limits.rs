//! `wasmjobs limits`: what the cluster-wide limits are doing now.
//!
//! For every plugin with `limits.rate` or `[limits.per_key]` in use
//! (`docs/limits.md`): job starts in the current rate windows, key values
//! seen, concurrency leases held, and the jobs refused (rescheduled) by a
//! rate or a concurrency limit since the keys were created. Read from
//! Redis ([`crate::redis::limits`]), so it shows every process's use; the
//! same table closes `wasmjobs stats`. With shards, a table per shard.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::fleet;
use super::{Cli, RedisArgs};
use crate::redis::limits::{LimitStats, limit_stats};

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
    let answers = fleet::read_all(&args.redis, &cli.data_dir, |mut conn| async move {
        limit_stats(&mut conn).await
    })
    .await?;
    let to_json = |limits: &LimitStats| serde_json::to_value(limits).context("cannot serialise the limits");
    match args.json {
        true => println!(
            "{}",
            serde_json::to_string_pretty(&fleet::json(&answers, "limits", to_json)?)
                .context("cannot serialise the limits")?
        ),
        false => print!("{}", fleet::text(&answers, render)),
    }
    Ok(fleet::status(&answers))
}

fn render(limits: &LimitStats) -> String {
    match limits.plugins.is_empty() {
        true => "no cluster limits in use (no plugin with limits.rate or [limits.per_key] has run a job)\n".to_owned(),
        false => super::stats::render_limits(limits).trim_start_matches('\n').to_owned(),
    }
}
