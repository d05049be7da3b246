//! What a job store cannot serve, refused when the runner starts (with the
//! reason and what to do) rather than silently left out.
//!
//! On the PostgreSQL store ([`Store::Postgres`]) the jobs, their retries,
//! schedule and dead set live in PostgreSQL, while the process's heartbeat,
//! counters, cancels, pauses and cluster limits stay in Redis. Two things
//! read or write *jobs* in Redis and are not built for PostgreSQL yet: the
//! dashboard's job lists and actions, and plugin cron schedules (claimed
//! and enqueued by one Lua script). `docs/postgres.md` lists them.

use anyhow::{Result, bail};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::RunOptions;
use super::cron::PluginSchedules;
use super::source::Store;
use crate::plugin::Catalog;

/// Fails if `options` or the plugins in `catalog` ask for something the
/// chosen store cannot do.
pub(crate) fn refuse_unsupported(options: &RunOptions, catalog: &Catalog) -> Result<()> {
    let Store::Postgres { pg, .. } = &options.store else {
        return Ok(());
    };
    if options.web.is_some() {
        bail!(
            "--web: the dashboard lists and changes jobs in Redis, and with --source {} they are in PostgreSQL: not supported yet (query wasmjobs.jobs and wasmjobs.dead instead; see docs/postgres.md)",
            pg.location
        );
    }
    let scheduled: Vec<&str> = catalog
        .plugins()
        .iter()
        .filter(|plugin| !plugin.manifest.schedules.is_empty())
        .map(|plugin| plugin.name.as_str())
        .collect();
    if !scheduled.is_empty() {
        bail!(
            "plugin {} declares cron schedules ([[schedule]]), which the PostgreSQL source does not run yet: serve them from a runner on Redis, or remove the schedules (see docs/postgres.md)",
            scheduled.join(", ")
        );
    }
    Ok(())
}

/// Stands in for the cron poller on a store without cron: a plugin
/// reloaded with schedules is told, loudly, that they do not run.
pub(crate) async fn refuse_schedules(changes: &mut mpsc::UnboundedReceiver<PluginSchedules>, stop: CancellationToken) {
    loop {
        let change = tokio::select! {
            change = changes.recv() => change,
            () = stop.cancelled() => return,
        };
        match change {
            Some(PluginSchedules::Loaded { plugin, schedules }) if !schedules.is_empty() => tracing::error!(
                plugin = %plugin,
                "the plugin now declares cron schedules, which the PostgreSQL source does not run: they are ignored until it is served from Redis (see docs/postgres.md)"
            ),
            Some(_) => {}
            None => return,
        }
    }
}
