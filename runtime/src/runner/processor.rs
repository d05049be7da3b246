//! One job, from fetched text to a decision: parse the payload, find the
//! plugin for its class (dispatch), run it in the sandbox, and apply the
//! retry policy. Never fails: a malformed payload or an unknown class is a
//! job for the dead set with a clear `error_message`, not an error.

use tracing::Instrument;

use super::fetch::Fetched;
use super::job_retry::{self, Write};
use crate::job::Outcome;
use crate::plugin::Catalog;
use crate::redis::now_f64;
use crate::redis::payload::{self, Payload};
use crate::sandbox::{ExecOptions, Executor};

/// Runs `fetched` and decides what to write for it.
pub async fn process(executor: &Executor, catalog: &Catalog, fetched: &Fetched) -> Write {
    let payload = match Payload::parse(&fetched.raw) {
        Ok(payload) => payload,
        Err(error) => {
            tracing::warn!(queue = %fetched.queue, "malformed job sent to the dead set: {error}");
            let dead = payload::malformed(&fetched.raw, &error, &fetched.queue, now_f64());
            return Write::Dead {
                payload: dead.to_json(),
            };
        }
    };
    let job = payload.to_job();
    if tracing::enabled!(tracing::Level::DEBUG) && job.enqueued_at_ms > 0 {
        let waited_us = (now_f64() * 1e6) as i64 - (payload.time("enqueued_at").unwrap_or(0.0) * 1e6) as i64;
        tracing::debug!(jid = %job.jid, class = %job.class, queue_latency_us = waited_us, "job started");
    }
    let outcome = match catalog.get(&job.class) {
        Some(plugin) => executor.execute(plugin, &job, &ExecOptions::default()).await.outcome,
        None => {
            let span = tracing::warn_span!("job", jid = %job.jid, class = %job.class);
            async {
                tracing::warn!("no plugin serves this class; sent to the dead set");
            }
            .instrument(span)
            .await;
            Outcome::Dead(format!(
                "no plugin serves job class {:?} (add a plugin listing it in its wasmjobs.toml)",
                job.class
            ))
        }
    };
    job_retry::decide(&payload, &outcome, now_f64())
}
