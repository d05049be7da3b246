//! Leases: how a live process keeps its jobs and a dead one's come back.
//!
//! A claim gives a job a lease of `--lease` seconds (20 by default). Every
//! quarter of a lease each process renews every lease it holds (one
//! `UPDATE`) and sweeps for leases that ran out anywhere, taking those
//! jobs back (or burying them as poison pills). So:
//! - a live process keeps its jobs while a renewal succeeds at least once
//!   per lease: a beat delayed by half a lease, or a PostgreSQL restart
//!   shorter than three quarters of one, loses nothing;
//! - a process that dies holds its jobs for at most one lease after its
//!   last renewal, plus the next sweep of any live process: a quarter of a
//!   lease (≤ 25 s with the defaults);
//! - a process that was cut off for longer than a lease finds its jobs'
//!   completions fenced off (`complete`): whoever holds the job now writes
//!   its outcome. The job ran twice, as at-least-once allows.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use super::sql;
use crate::pg::Pg;

/// How long a claim holds a job unless renewed, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// Renews and sweeps every quarter of `lease` until `stop`.
pub(super) async fn keep(pg: Pg, owner: String, lease: Duration, max_recoveries: u64, stop: CancellationToken) {
    let every = lease / 4;
    let mut renewed = Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        match renew(&pg, &owner, lease).await {
            Ok(_) => {
                if failing {
                    tracing::info!("PostgreSQL is back: leases renewed");
                }
                failing = false;
                renewed = Instant::now();
            }
            Err(err) => {
                let since = renewed.elapsed();
                if since > lease {
                    tracing::warn!(
                        "{err:#}; no lease renewed for {since:?}, longer than a lease ({lease:?}): other processes may take over this process's jobs"
                    );
                } else if !failing {
                    tracing::warn!("{err:#}; leases not renewed, retrying");
                }
                failing = true;
                continue;
            }
        }
        match sweep(&pg, max_recoveries).await {
            Ok((0, 0)) => {}
            Ok((requeued, buried)) => {
                tracing::info!(requeued, buried, "took back the jobs of processes whose lease ran out")
            }
            Err(err) => tracing::debug!("lease sweep: {err:#}"),
        }
    }
}

/// Renews every lease `owner` holds; returns how many.
pub(super) async fn renew(pg: &Pg, owner: &str, lease: Duration) -> Result<u64> {
    let client = pg.client().await?;
    let statement = client.prepare_cached(sql::RENEW).await.context("renewing leases")?;
    client
        .execute(&statement, &[&owner, &lease.as_secs_f64()])
        .await
        .context("renewing leases")
}

/// Takes back expired jobs; returns (requeued, buried).
pub(super) async fn sweep(pg: &Pg, max_recoveries: u64) -> Result<(i64, i64)> {
    let client = pg.client().await?;
    let statement = client.prepare_cached(sql::SWEEP).await.context("sweeping leases")?;
    let max = i32::try_from(max_recoveries).unwrap_or(i32::MAX);
    let row = client.query_one(&statement, &[&max]).await.context("sweeping leases")?;
    Ok((row.get(0), row.get(1)))
}
