//! What a job store cannot serve, refused when the runner starts (with the
//! reason and what to do) rather than silently left out.
//!
//! On the PostgreSQL store ([`Store::Postgres`]) the jobs, their retries,
//! schedule and dead set live in PostgreSQL, while the process's heartbeat,
//! counters, cancels, pauses and cluster limits stay in Redis. One thing
//! reads and changes *jobs* in Redis and is not built for PostgreSQL yet:
//! the dashboard's job lists and actions. `docs/postgres.md` says so.

use anyhow::{Result, bail};

use super::RunOptions;
use super::source::Store;

/// Fails if `options` ask for something the chosen store cannot do.
pub(crate) fn refuse_unsupported(options: &RunOptions) -> Result<()> {
    let Store::Postgres { pg, .. } = &options.store else {
        return Ok(());
    };
    if options.web.is_some() {
        bail!(
            "--web: the dashboard lists and changes jobs in Redis, and with --source {} they are in PostgreSQL: not supported yet (`wasmjobs stats --source URL` shows its queues; see docs/postgres.md)",
            pg.location
        );
    }
    Ok(())
}
