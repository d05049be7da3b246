//! `NoopJob`: does nothing. The baseline for measuring the host's per-job
//! overhead (fetch, instantiate, call, acknowledge).

use serde::de::IgnoredAny;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job};

/// `NoopJob.perform_async(...)`: accepts any args and ignores them.
pub struct NoopJob;

impl Job for NoopJob {
    type Args = IgnoredAny;

    fn perform(_job: &JobInfo, _args: IgnoredAny) -> Result<(), JobError> {
        Ok(())
    }
}

export_job!(NoopJob);
