//! `wasmjobs web`: the dashboard on its own ([`crate::web`]), for every
//! process that shares the Redis. `wasmjobs run --web ADDR` serves the same
//! beside a runner. With `--source URL` its job pages show and change the
//! jobs of that PostgreSQL store instead of Redis's queues and sets.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{Cli, RedisArgs};
use crate::web::{self, Access, JobStore};

/// Arguments of `wasmjobs web`.
#[derive(Debug, Args)]
pub struct WebArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Show the jobs of the PostgreSQL job store at URL (queues,
    /// scheduled, retries, dead) instead of those in Redis.
    #[arg(long = "source", env = "WASMJOBS_SOURCE", hide_env_values = true, value_name = "URL")]
    pub jobs_source: Option<String>,
    /// Where to serve it. Any address other than loopback needs
    /// credentials from the environment: WASMJOBS_WEB_TOKEN, or
    /// WASMJOBS_WEB_USER and WASMJOBS_WEB_PASSWORD.
    #[arg(long, default_value = web::DEFAULT_ADDR)]
    pub addr: SocketAddr,
}

/// Runs the command until Ctrl-C or SIGTERM.
pub async fn run(cli: &Cli, args: &WebArgs) -> Result<ExitCode> {
    let access = Access::from_env()?;
    // Refuse before connecting anywhere.
    access.required_for(args.addr)?;
    let map = args.redis.shard_map(&cli.data_dir)?;
    if map.is_sharded() && args.jobs_source.is_some() {
        anyhow::bail!("--shard is for jobs kept in Redis; with --source the jobs are in PostgreSQL");
    }
    let store = match &args.jobs_source {
        Some(url) => JobStore::Postgres(Box::new(crate::pg::Pg::connect(url).await?), Default::default()),
        None => JobStore::Redis,
    };
    let shards = crate::redis::shards::connect_long_lived(&map).await?;
    let sites = shards
        .iter()
        .map(|(name, redis)| web::Site {
            name: name.clone(),
            conn: redis.conn(),
            location: redis.location.clone(),
        })
        .collect();
    let stop = CancellationToken::new();
    let dashboard = web::bind(args.addr, sites, store, access, stop.clone()).await?;
    web::announce(dashboard.bound());
    let server = tokio::spawn(dashboard.serve());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    stop.cancel();
    let _ = server.await;
    for (_, redis) in shards {
        redis.close().await?;
    }
    Ok(ExitCode::SUCCESS)
}
