//! What the PostgreSQL job store holds, for `wasmjobs stats --source`: per
//! queue the jobs waiting (due), scheduled, waiting for a retry and
//! running, with the age of the oldest due one; and the dead table by kind.
//! One pass over `wasmjobs.jobs` (which holds only live work).

use anyhow::{Context, Result};
use serde::Serialize;

use super::Pg;

/// One queue of the store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueStats {
    pub name: String,
    /// Due and unclaimed.
    pub waiting: i64,
    /// Due later, never run.
    pub scheduled: i64,
    /// Due later after a failure.
    pub retrying: i64,
    /// Claimed by a process.
    pub running: i64,
    /// Seconds the oldest waiting job has been due.
    pub latency_secs: f64,
}

/// The whole store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreStats {
    /// The store's URL, without its password.
    pub location: String,
    pub queues: Vec<QueueStats>,
    pub dead: i64,
    pub cancelled: i64,
}

/// Reads the store.
pub async fn read(pg: &Pg) -> Result<StoreStats> {
    let client = pg.client().await?;
    let rows = client
        .query(
            "SELECT queue,
                count(*) FILTER (WHERE owner IS NULL AND run_at <= now()),
                count(*) FILTER (WHERE owner IS NULL AND run_at > now() AND NOT payload ? 'retry_count'),
                count(*) FILTER (WHERE owner IS NULL AND run_at > now() AND payload ? 'retry_count'),
                count(*) FILTER (WHERE owner IS NOT NULL),
                coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE owner IS NULL AND run_at <= now())), 0)::float8
             FROM wasmjobs.jobs GROUP BY queue ORDER BY queue",
            &[],
        )
        .await
        .context("reading wasmjobs.jobs")?;
    let queues = rows
        .iter()
        .map(|row| QueueStats {
            name: row.get(0),
            waiting: row.get(1),
            scheduled: row.get(2),
            retrying: row.get(3),
            running: row.get(4),
            latency_secs: row.get(5),
        })
        .collect();
    let dead = client
        .query_one(
            "SELECT count(*) FILTER (WHERE kind = 'dead'), count(*) FILTER (WHERE kind = 'cancelled') FROM wasmjobs.dead",
            &[],
        )
        .await
        .context("reading wasmjobs.dead")?;
    Ok(StoreStats {
        location: pg.location.clone(),
        queues,
        dead: dead.get(0),
        cancelled: dead.get(1),
    })
}

impl StoreStats {
    /// The text `wasmjobs stats` prints.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = format!("\nPostgreSQL: {}\n", self.location);
        if self.queues.is_empty() {
            out.push_str("no jobs\n");
        } else {
            let width = self.queues.iter().map(|q| q.name.len()).max().unwrap_or(0).max(5);
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}",
                "QUEUE", "WAITING", "SCHEDULED", "RETRY", "RUNNING", "LATENCY"
            );
            for q in &self.queues {
                let _ = writeln!(
                    out,
                    "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8.1}s",
                    q.name, q.waiting, q.scheduled, q.retrying, q.running, q.latency_secs
                );
            }
        }
        let _ = writeln!(out, "dead {}   cancelled {}", self.dead, self.cancelled);
        out
    }
}
