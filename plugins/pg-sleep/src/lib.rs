//! `PgSleepJob`: `SELECT pg_sleep(0.1)` on the runner's `main` database.
//!
//! The database counterpart of `HttpGetJob`: each job spends ~100 ms
//! waiting on PostgreSQL and almost no CPU, so a runner with
//! `--concurrency 100` and a pool of 100 connections (`--db
//! main=postgres://...?pool=100`) should finish about 1,000 of them a
//! second. It measures how well jobs overlap their waits on a shared pool.

use serde::de::IgnoredAny;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job, sql};

/// `PgSleepJob.perform_async(...)`: ignores its args, sleeps 100 ms in
/// PostgreSQL.
pub struct PgSleepJob;

impl Job for PgSleepJob {
    type Args = IgnoredAny;

    fn perform(_job: &JobInfo, _args: IgnoredAny) -> Result<(), JobError> {
        sql::query("main", "SELECT pg_sleep(0.1)", &[])?;
        Ok(())
    }
}

export_job!(PgSleepJob);
