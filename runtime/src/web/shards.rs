//! `/shards`: the fleet, when the dashboard serves several Redis shards
//! (`--shard`, `docs/shards.md`). One row per shard: whether it answers,
//! its counters, set sizes and live processes, and a link to its own
//! pages (the default shard's at `/`, the others' under `/shard/NAME`);
//! the fleet's totals above. Each shard is read at once, each within
//! [`crate::redis::RESPONSE_TIMEOUT`], so a shard that is down is shown
//! as down and the others still are.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use minijinja::context;
use serde::Serialize;

use super::{Failure, Web};
use crate::redis::{RESPONSE_TIMEOUT, api};

/// Every shard's dashboard, the default shard's first.
pub(crate) struct Fleet {
    pub(crate) sites: Vec<Arc<Web>>,
}

/// One shard's row.
#[derive(Debug, Default, Serialize)]
struct Row {
    name: String,
    href: String,
    location: String,
    up: bool,
    error: Option<String>,
    processed: u64,
    failed: u64,
    enqueued: u64,
    scheduled: u64,
    retries: u64,
    dead: u64,
    processes: usize,
    busy: u64,
    capacity: u64,
    /// Its live processes' identities and concurrency: a process serving
    /// several shards is registered in each, and counted once in the
    /// fleet's capacity.
    #[serde(skip)]
    slots: Vec<(String, u64)>,
}

pub(super) async fn page(State(fleet): State<Arc<Fleet>>) -> Result<Html<String>, Failure> {
    let rows = futures_util::future::join_all(fleet.sites.iter().map(|web| async move {
        let mut row = Row {
            name: web.name.clone(),
            href: web.nav_home(),
            location: web.location.clone(),
            ..Row::default()
        };
        let mut conn = web.conn();
        match tokio::time::timeout(RESPONSE_TIMEOUT, api::stats(&mut conn)).await {
            Ok(Ok(stats)) => {
                row.up = true;
                row.processed = stats.processed;
                row.failed = stats.failed;
                row.enqueued = stats.enqueued;
                row.scheduled = stats.scheduled;
                row.retries = stats.retries;
                row.dead = stats.dead;
                row.processes = stats.processes.len();
                row.busy = stats.processes.iter().map(|p| p.busy).sum();
                row.capacity = stats.processes.iter().map(|p| p.concurrency).sum();
                row.slots = stats
                    .processes
                    .iter()
                    .map(|p| (p.identity.clone(), p.concurrency))
                    .collect();
            }
            Ok(Err(err)) => row.error = Some(format!("{err:#}")),
            Err(_) => row.error = Some(format!("no answer within {RESPONSE_TIMEOUT:?}")),
        }
        row
    }))
    .await;
    let up: Vec<&Row> = rows.iter().filter(|row| row.up).collect();
    let total = |f: fn(&Row) -> u64| -> u64 { up.iter().map(|row| f(row)).sum() };
    let capacity: u64 = up
        .iter()
        .flat_map(|row| row.slots.iter().cloned())
        .collect::<std::collections::HashMap<String, u64>>()
        .values()
        .sum();
    let totals = context! {
        processed => total(|r| r.processed),
        failed => total(|r| r.failed),
        enqueued => total(|r| r.enqueued),
        scheduled => total(|r| r.scheduled),
        retries => total(|r| r.retries),
        dead => total(|r| r.dead),
        busy => total(|r| r.busy),
        capacity => capacity,
    };
    let default = fleet.sites.first().ok_or_else(|| Failure::not_found("no shard"))?;
    default.view.render(
        "shards.html",
        context! {
            active => "/shards",
            location => default.location,
            up => up.len(),
            rows,
            totals,
        },
    )
}
