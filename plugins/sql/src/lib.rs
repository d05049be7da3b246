//! `SqlJob`: runs one SQL statement on a database of the runner and logs
//! the row count and the first row. A small tool for trying the `sql`
//! capability (`wasmjobs exec --db main=... SqlJob '["main", "SELECT 1"]'`).

use wasmjobs_guest::{Job, JobError, JobInfo, export_job, log, sql};

/// `SqlJob.perform_async(db, statement)`: runs `statement` (no parameters)
/// on `db`. A database the manifest does not grant, or the runner does not
/// have, sends the job to the dead set (retrying cannot fix configuration);
/// any other SQL error is retried.
pub struct SqlJob;

impl Job for SqlJob {
    type Args = (String, String);

    fn perform(_job: &JobInfo, (db, statement): Self::Args) -> Result<(), JobError> {
        let rows = sql::query(&db, &statement, &[]).map_err(|error| match error.kind() {
            sql::ErrorKind::NotGranted | sql::ErrorKind::UnknownDatabase => JobError::dead(error.to_string()),
            _ => JobError::from(error),
        })?;
        log::info!("{db}: {} row(s)", rows.len());
        if let Some(first) = rows.first() {
            log::info!("{db}: first row: {first}");
        }
        Ok(())
    }
}

export_job!(SqlJob);
