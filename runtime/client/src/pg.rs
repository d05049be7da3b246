//! The PostgreSQL job store (feature `postgres`; `docs/postgres.md`): push
//! a job inside your own transaction, so it exists if and only if the
//! transaction commits.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> anyhow::Result<()> {
//! use wasmjobs_client::Job;
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO users (email) VALUES ($1)", &[&"a@example.com"]).await?;
//! let jid = wasmjobs_client::pg::push(&tx, &Job::new("WelcomeJob").args(serde_json::json!(["a@example.com"])).queue("mail")).await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```
//!
//! It calls the store's SQL function `wasmjobs.enqueue` — the one an
//! application in any language calls — with the payload the [`Job`]
//! builder checks and builds (extra fields, `retry`, the run time), so
//! the Rust client and SQL callers write the same rows. A unique job holds
//! its [`unique_key`](Job::unique_key) while it lives in the store; there is
//! no `unique_for` lifetime there.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio_postgres::GenericClient;

use crate::Job;

/// The fields `wasmjobs.enqueue` sets itself.
const SET_BY_THE_STORE: [&str; 7] = ["class", "args", "queue", "jid", "created_at", "enqueued_at", "at"];

/// Pushes `job` through `client` (a connection or a `Transaction`); returns
/// its jid, or `None` if a live job already holds its unique key.
pub async fn push<C: GenericClient>(client: &C, job: &Job) -> Result<Option<String>> {
    if job.unique_for.is_some() {
        bail!(
            "unique_for: in the PostgreSQL store a job holds its unique_key while it lives there, with no lifetime: give unique_key alone"
        );
    }
    let now = crate::now_f64();
    // The builder's checks and payload, without the Redis unique lock.
    let (payload, _) = Job {
        unique_key: None,
        ..job.clone()
    }
    .to_payload(now)?;
    push_payload(client, payload, job.run_at(now), job.unique_key.as_deref()).await
}

/// Pushes a payload built elsewhere (its class, args and queue, `retry`,
/// and every other field; the store gives it a new jid), due at `run_at`
/// (Unix seconds; now if none), holding `unique_key` if given.
pub async fn push_payload<C: GenericClient>(
    client: &C,
    payload: crate::Payload,
    run_at: Option<f64>,
    unique_key: Option<&str>,
) -> Result<Option<String>> {
    let mut fields = payload.into_map();
    let class = match fields.get("class") {
        Some(Value::String(class)) => class.clone(),
        _ => bail!("the payload has no class"),
    };
    let queue = match fields.get("queue") {
        Some(Value::String(queue)) => queue.clone(),
        _ => crate::job::DEFAULT_QUEUE.to_owned(),
    };
    let args = fields
        .get("args")
        .cloned()
        .unwrap_or(Value::Array(Vec::new()))
        .to_string();
    let retry = fields.remove("retry").unwrap_or(Value::Bool(true)).to_string();
    for key in SET_BY_THE_STORE {
        fields.remove(key);
    }
    let fields = Value::Object(fields).to_string();
    let row = client
        .query_one(
            "SELECT wasmjobs.enqueue($1, $2::text::jsonb, $3, to_timestamp($4::float8), $5, $6::text::jsonb, $7::text::jsonb)",
            &[&class, &args, &queue, &run_at, &unique_key, &retry, &fields],
        )
        .await
        .with_context(|| format!("enqueueing a {class} job into PostgreSQL"))?;
    Ok(row.get(0))
}
