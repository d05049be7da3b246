//! The non-blocking fetch both modes share: one Lua call
//! ([`super::scripts::FETCH`]) takes up to *n* jobs from the queues in
//! order, moving them into the in-progress list (reliable) or popping them
//! (basic). Jobs over the payload limit are buried by the script itself
//! and never leave Redis.

use std::collections::HashSet;

use anyhow::{Context, Result};
use redis::Script;

use super::MAX_BATCH;
use super::dead::{DeadSet, oversized_buried};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::CancelMark;
use crate::runner::queues::Queues;

/// A job taken: its bytes, its queue, and the fetch script's cancel mark.
pub(super) type Taken = (Vec<u8>, String, CancelMark);

/// What a fetch does with payloads over the limit: bury them in `dead`
/// from inside Redis (0: no limit).
pub(super) struct Oversized<'a> {
    pub(super) dead: &'a DeadSet,
    pub(super) max_payload: usize,
}

/// Takes up to `max` jobs from `queues` (in this fetch's order), into
/// `held_in` when given, leaving out the queues in `paused`. A job over
/// the payload limit is buried instead, logged, and not returned.
#[allow(clippy::too_many_arguments)]
pub(super) async fn take(
    redis: &Redis,
    script: &Script,
    queues: &Queues,
    names: &[String],
    held_in: Option<&str>,
    paused: &HashSet<String>,
    oversized: &Oversized<'_>,
    max: usize,
) -> Result<Vec<Taken>> {
    let mut order = queues.fetch_order();
    if !paused.is_empty() {
        order.retain(|&i| !paused.contains(&names[i]));
        if order.is_empty() {
            return Ok(Vec::new());
        }
    }
    let mut invocation = script.prepare_invoke();
    // Basic mode names no list; the script ignores KEYS[1] then.
    invocation.key(held_in.unwrap_or("wasmjobs:unused"));
    for &i in &order {
        invocation.key(keys::queue(&names[i]));
    }
    invocation
        .arg(max.min(MAX_BATCH))
        .arg(if held_in.is_some() { "1" } else { "0" });
    if oversized.max_payload > 0 {
        invocation.key(keys::DEAD);
        oversized
            .dead
            .cap_args(&mut invocation, oversized.max_payload, now_f64());
    }
    let flat: Vec<Vec<u8>> = invocation
        .invoke_async(&mut redis.conn())
        .await
        .context("fetching jobs")?;
    let mut jobs = Vec::with_capacity(flat.len() / 3);
    let mut flat = flat.into_iter();
    while let (Some(position), Some(raw), Some(mark)) = (flat.next(), flat.next(), flat.next()) {
        let queue = std::str::from_utf8(&position)
            .ok()
            .and_then(|p| p.parse::<usize>().ok())
            .and_then(|p| order.get(p))
            .and_then(|&i| names.get(i))
            .context("the fetch script returned a bad queue index")?;
        if raw.is_empty() && oversized_buried(queue, &mark) {
            continue;
        }
        let mark = CancelMark::from_script(&raw, &mark);
        jobs.push((raw, queue.to_owned(), mark));
    }
    Ok(jobs)
}
