//! `EchoJob`: logs its arguments. Useful to check that a deployment works and
//! what a job's args look like once they reach a plugin.

use serde::de::IgnoredAny;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job, log};

/// `EchoJob.perform_async(...)`: logs `args: <the args as JSON>` at info level.
pub struct EchoJob;

impl Job for EchoJob {
    // Any JSON array; the raw text is in `job.args`.
    type Args = IgnoredAny;

    fn perform(job: &JobInfo, _args: IgnoredAny) -> Result<(), JobError> {
        log::info!("args: {}", job.args);
        Ok(())
    }
}

export_job!(EchoJob);
