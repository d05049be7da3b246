//! The non-blocking fetch both modes share: one Lua call
//! ([`super::scripts::FETCH`]) takes up to *n* jobs from the queues in
//! order, moving them into the in-progress list (reliable) or popping them
//! (basic).

use anyhow::{Context, Result};
use redis::Script;

use super::MAX_BATCH;
use crate::redis::{Redis, keys};
use crate::runner::queues::Queues;

/// Takes up to `max` jobs from `queues` (in this fetch's order), into
/// `held_in` when given. Returns each job's bytes and queue name.
pub(super) async fn take(
    redis: &Redis,
    script: &Script,
    queues: &Queues,
    names: &[String],
    held_in: Option<&str>,
    max: usize,
) -> Result<Vec<(Vec<u8>, String)>> {
    let order = queues.fetch_order();
    let mut invocation = script.prepare_invoke();
    // Basic mode names no list; the script ignores KEYS[1] then.
    invocation.key(held_in.unwrap_or("wasmjobs:unused"));
    for &i in &order {
        invocation.key(keys::queue(&names[i]));
    }
    invocation
        .arg(max.min(MAX_BATCH))
        .arg(if held_in.is_some() { "1" } else { "0" });
    let flat: Vec<Vec<u8>> = invocation
        .invoke_async(&mut redis.conn())
        .await
        .context("fetching jobs")?;
    let mut jobs = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(position), Some(raw)) = (flat.next(), flat.next()) {
        let queue = std::str::from_utf8(&position)
            .ok()
            .and_then(|p| p.parse::<usize>().ok())
            .and_then(|p| order.get(p))
            .and_then(|&i| names.get(i))
            .context("the fetch script returned a bad queue index")?;
        jobs.push((raw, queue.to_owned()));
    }
    Ok(jobs)
}
