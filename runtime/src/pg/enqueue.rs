//! The producer side of the job store: one call of `wasmjobs.enqueue`, the
//! SQL function an application in any language calls inside its own
//! transaction (migration 1 defines it). Running it through a
//! `tokio_postgres::GenericClient` lets the caller pass a
//! `Transaction`: the job then commits or rolls back with the caller's data.

use anyhow::{Context, Result};
use tokio_postgres::GenericClient;

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    /// The job class (its plugin serves it).
    pub class: &'a str,
    /// The arguments: a JSON array.
    pub args: &'a serde_json::Value,
    /// The queue.
    pub queue: &'a str,
    /// When it may run (Unix seconds); now if none.
    pub run_at: Option<f64>,
    /// At most one live job holds a key: a second enqueue returns `None`.
    pub unique_key: Option<&'a str>,
    /// Sidekiq's `retry` option (`true`, `false` or a count).
    pub retry: &'a serde_json::Value,
}

/// Enqueues `job` through `client` (a connection or a transaction);
/// returns its jid, or `None` if a live job already holds its unique key.
pub async fn enqueue<C: GenericClient>(client: &C, job: &NewJob<'_>) -> Result<Option<String>> {
    let args = job.args.to_string();
    let retry = job.retry.to_string();
    let row = client
        .query_one(
            "SELECT wasmjobs.enqueue($1, $2::text::jsonb, $3, to_timestamp($4::float8), $5, $6::text::jsonb)",
            &[&job.class, &args, &job.queue, &job.run_at, &job.unique_key, &retry],
        )
        .await
        .with_context(|| format!("enqueueing a {} job", job.class))?;
    Ok(row.get(0))
}
