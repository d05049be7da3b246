//! `wasmjobs cancel --source`: jobs waiting in the PostgreSQL store (due,
//! scheduled or waiting for a retry, not claimed) are taken out in one
//! statement and kept in `wasmjobs.dead` as `cancelled`, with who and when,
//! as the Redis side keeps them in its cancelled set; a second cancel finds
//! them there ([`already`]). A claimed job is not
//! touched here: its process stops it when it hears the cancel on the
//! control channel (in Redis) and records it itself.
//!
//! The jobs are found by their payload's `jid` (no index: a scan of the
//! live jobs, which is what a queue table holds).

use std::collections::HashMap;

use anyhow::{Context, Result};

use super::Pg;

/// Where a cancelled job was waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Due in this queue.
    Queue(String),
    /// Due later, never run.
    Scheduled,
    /// Due later, after a failure.
    Retry,
}

/// The jobs of `jids` kept as cancelled in `wasmjobs.dead`: when (epoch
/// seconds) and from where (`cancelled_at`, `cancelled_from`), the latest
/// per jid. Found by the dead table's index on the jid.
pub async fn already(pg: &Pg, jids: &[&str]) -> Result<HashMap<String, (Option<f64>, String)>> {
    if jids.is_empty() {
        return Ok(HashMap::new());
    }
    let client = pg.client().await?;
    let rows = client
        .query(
            "SELECT DISTINCT ON (payload->>'jid') payload->>'jid',
                 CASE WHEN jsonb_typeof(payload->'cancelled_at') = 'number' THEN (payload->>'cancelled_at')::float8 END,
                 coalesce(payload->>'cancelled_from', 'the PostgreSQL store')
             FROM wasmjobs.dead
             WHERE kind = 'cancelled' AND payload->>'jid' = ANY($1::text[])
             ORDER BY payload->>'jid', died_at DESC",
            &[&jids],
        )
        .await
        .context("looking for cancelled jobs in wasmjobs.dead")?;
    Ok(rows.iter().map(|row| (row.get(0), (row.get(1), row.get(2)))).collect())
}

/// Takes the unclaimed jobs of `jids` out of the store, recorded as
/// cancelled `at` (epoch seconds) by `by`. Returns each one taken and where
/// it was; a jid not returned was not waiting there.
pub async fn take(pg: &Pg, jids: &[&str], by: &str, at: f64) -> Result<Vec<(String, Place)>> {
    if jids.is_empty() {
        return Ok(Vec::new());
    }
    let client = pg.client().await?;
    let rows = client
        .query(
            "WITH gone AS (
                 DELETE FROM wasmjobs.jobs
                 WHERE payload->>'jid' = ANY($1::text[]) AND owner IS NULL
                 RETURNING queue, payload,
                     CASE WHEN run_at <= now() THEN 'queue'
                          WHEN payload ? 'retry_count' THEN 'retry'
                          ELSE 'schedule' END AS place
             ),
             kept AS (
                 INSERT INTO wasmjobs.dead (kind, queue, payload)
                 SELECT 'cancelled', queue, payload || jsonb_build_object(
                     'cancelled_at', $2::float8,
                     'cancelled_by', $3::text,
                     'cancelled_from', CASE place WHEN 'queue' THEN 'queue ' || queue ELSE place END)
                 FROM gone
             )
             SELECT payload->>'jid', queue, place FROM gone",
            &[&jids, &at, &by],
        )
        .await
        .context("taking the cancelled jobs out of wasmjobs.jobs")?;
    Ok(rows
        .iter()
        .map(|row| {
            let place = match row.get::<_, &str>(2) {
                "queue" => Place::Queue(row.get(1)),
                "retry" => Place::Retry,
                _ => Place::Scheduled,
            };
            (row.get(0), place)
        })
        .collect())
}
