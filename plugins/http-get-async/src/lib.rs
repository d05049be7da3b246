//! `AsyncHttpGetJob`: `HttpGetJob` (one HTTP GET) as an async job, so that
//! one instance runs many of them at once (`[instances] concurrent` in its
//! `wasmjobs.toml`) instead of one instance per job.

use wasmjobs_guest::{AsyncJob, JobError, JobInfo, export_async_job, http, log};

/// `AsyncHttpGetJob.perform_async(url)`: GETs `url`, with `HttpGetJob`'s
/// outcomes: a transport error or a non-2xx status fails the job
/// retryably, a URL the client can't use sends it to the dead set.
pub struct AsyncHttpGetJob;

impl AsyncJob for AsyncHttpGetJob {
    type Args = (String,);

    async fn perform(_job: &JobInfo, (url,): Self::Args) -> Result<(), JobError> {
        let response = http::get_async(&url).await.map_err(|error| match error.kind() {
            http::ErrorKind::InvalidUrl => JobError::dead(error.to_string()),
            _ => JobError::from(error),
        })?;
        log::debug!("GET {url}: status {}", response.status());
        response.error_for_status()?;
        Ok(())
    }
}

export_async_job!(AsyncHttpGetJob);
