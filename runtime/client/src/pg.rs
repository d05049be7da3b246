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
//! [`push_bulk`] enqueues a batch in one statement (one round trip).
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
    let now = crate::now_f64();
    let payload = checked(job, now)?;
    push_payload(client, payload, job.run_at(now), job.unique_key.as_deref()).await
}

/// Pushes many jobs in one statement (one round trip, `wasmjobs.enqueue`
/// called once per job, in order), through `client` — a `Transaction`
/// makes them commit together. Returns each job's jid, or `None` where a
/// live job already held its unique key. Several times the rate of one
/// statement per job: see `docs/postgres.md`.
pub async fn push_bulk<C: GenericClient>(client: &C, jobs: &[Job]) -> Result<Vec<Option<String>>> {
    let now = crate::now_f64();
    let mut rows = Columns::default();
    for job in jobs {
        rows.add(checked(job, now)?, job.run_at(now), job.unique_key.clone())?;
    }
    rows.send(client).await
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
    let mut rows = Columns::default();
    rows.add(payload, run_at, unique_key.map(str::to_owned))?;
    Ok(rows.send(client).await?.pop().flatten())
}

/// The builder's checks and payload, without the Redis unique lock.
fn checked(job: &Job, now: f64) -> Result<crate::Payload> {
    if job.unique_for.is_some() {
        bail!(
            "unique_for: in the PostgreSQL store a job holds its unique_key while it lives there, with no lifetime: give unique_key alone"
        );
    }
    let (payload, _) = Job {
        unique_key: None,
        ..job.clone()
    }
    .to_payload(now)?;
    Ok(payload)
}

/// `wasmjobs.enqueue`'s arguments for a batch of jobs, one array each.
#[derive(Default)]
struct Columns {
    class: Vec<String>,
    args: Vec<String>,
    queue: Vec<String>,
    run_at: Vec<Option<f64>>,
    unique_key: Vec<Option<String>>,
    retry: Vec<String>,
    fields: Vec<String>,
}

impl Columns {
    fn add(&mut self, payload: crate::Payload, run_at: Option<f64>, unique_key: Option<String>) -> Result<()> {
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
        self.class.push(class);
        self.args.push(args);
        self.queue.push(queue);
        self.run_at.push(run_at);
        self.unique_key.push(unique_key);
        self.retry.push(retry);
        self.fields.push(Value::Object(fields).to_string());
        Ok(())
    }

    /// One statement: `wasmjobs.enqueue` over the arrays, in their order.
    async fn send<C: GenericClient>(self, client: &C) -> Result<Vec<Option<String>>> {
        if self.class.is_empty() {
            return Ok(Vec::new());
        }
        let what = match self.class.as_slice() {
            [one] => format!("a {one} job"),
            many => format!("{} jobs", many.len()),
        };
        let rows = client
            .query(
                "SELECT wasmjobs.enqueue(c, a::jsonb, q, to_timestamp(r), u, rt::jsonb, f::jsonb)
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::text[], $6::text[], $7::text[])
                      WITH ORDINALITY AS t(c, a, q, r, u, rt, f, n)
                 ORDER BY n",
                &[
                    &self.class,
                    &self.args,
                    &self.queue,
                    &self.run_at,
                    &self.unique_key,
                    &self.retry,
                    &self.fields,
                ],
            )
            .await
            .with_context(|| format!("enqueueing {what} into PostgreSQL"))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
