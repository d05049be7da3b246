//! One job, from fetched text to a decision: parse the payload, find the
//! plugin for its class (dispatch), run it in the sandbox, and apply the
//! retry policy. Never fails: a malformed payload or an unknown class is a
//! job for the dead set with a clear `error_message`, not an error.

use super::fetch::Fetched;
use super::job_retry::{self, Write};
use crate::job::Outcome;
use crate::plugin::Catalog;
use crate::redis::now_f64;
use crate::redis::payload::{self, Payload};
use crate::sandbox::{ExecOptions, Executor};

/// Runs `fetched` and decides what to write for it.
pub async fn process(executor: &Executor, catalog: &Catalog, fetched: &Fetched) -> Write {
    let (job, enqueued_at) = match payload::job_from_raw(&fetched.raw) {
        Ok(head) => head,
        Err(error) => return malformed(fetched, &error),
    };
    if tracing::enabled!(tracing::Level::DEBUG) && enqueued_at > 0.0 {
        let waited_us = ((now_f64() - enqueued_at) * 1e6) as i64;
        tracing::debug!(jid = %job.jid, class = %job.class, queue_latency_us = waited_us, "job started");
    }
    let outcome = match catalog.get(&job.class) {
        Some(plugin) => executor.execute(plugin, &job, &ExecOptions::default()).await.outcome,
        None => {
            tracing::warn!(jid = %job.jid, class = %job.class, "no plugin serves this class; sent to the dead set");
            Outcome::Dead(format!(
                "no plugin serves job class {:?} (add a plugin listing it in its wasmjobs.toml)",
                job.class
            ))
        }
    };
    match outcome {
        // Nothing to write into the payload: skip parsing it in full.
        Outcome::Success => Write::Ack,
        Outcome::Discard(_) => Write::Discard,
        failed => match Payload::parse(&fetched.raw) {
            Ok(payload) => job_retry::decide(&payload, &failed, now_f64()),
            Err(error) => malformed(fetched, &error),
        },
    }
}

/// A payload that cannot be parsed goes to the dead set, wrapped if needed.
fn malformed(fetched: &Fetched, error: &str) -> Write {
    tracing::warn!(queue = %fetched.queue, "malformed job sent to the dead set: {error}");
    let dead = payload::malformed(&fetched.raw, error, &fetched.queue, now_f64());
    Write::Dead {
        payload: dead.to_json(),
    }
}
