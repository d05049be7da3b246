//! `HttpGetJob`: an I/O-bound job, one HTTP GET (the benchmarks' `Net::HTTP`
//! job against a slow local endpoint).

use wasmjobs_guest::{Job, JobError, JobInfo, export_job, http, log};

/// `HttpGetJob.perform_async(url)`: GETs `url`. A transport error or a non-2xx
/// status fails the job retryably, with the URL and status in the message; a
/// URL the client can't use sends the job to the dead set (retrying can't fix
/// it).
pub struct HttpGetJob;

impl Job for HttpGetJob {
    type Args = (String,);

    fn perform(_job: &JobInfo, (url,): Self::Args) -> Result<(), JobError> {
        let response = http::get(&url).map_err(|error| match error.kind() {
            http::ErrorKind::InvalidUrl => JobError::dead(error.to_string()),
            _ => JobError::from(error),
        })?;
        log::debug!("GET {url}: status {}", response.status());
        response.error_for_status()?;
        Ok(())
    }
}

export_job!(HttpGetJob);
