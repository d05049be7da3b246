//! RustAsyncJob: a Rust component of the `async-plugin` world, built with
//! wit-bindgen alone. Args: `[url]`: awaits a GET of `url` through
//! `async-http`, logs `"<jid> <url> <status>"`, and fails as dead on a
//! 4xx (naming its jid) and as retry on a 5xx.

#[allow(clippy::too_many_arguments)] // the generated WASI bindings
mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "wasmjobs:job/async-plugin",
        // The WASI interfaces the world includes are generated here too
        // (no SDK to map them from).
        generate_all,
    });
}

use bindings::Guest;
use bindings::wasmjobs::job::async_http;
use bindings::wasmjobs::job::http::Request;
use bindings::wasmjobs::job::log::{Level, log};
use bindings::wasmjobs::job::types::{Job, JobError};

struct RustAsyncJob;

impl Guest for RustAsyncJob {
    async fn perform(job: Job) -> Result<(), JobError> {
        let args: Vec<String> =
            serde_json::from_str(&job.args).map_err(|err| JobError::Dead(format!("invalid args: {err}")))?;
        let Some(url) = args.first() else {
            return Err(JobError::Dead("invalid args: expected [url]".into()));
        };
        let request = Request {
            method: "GET".into(),
            url: url.clone(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout_ms: None,
        };
        let response = async_http::send(request)
            .await
            .map_err(|err| JobError::Retry(format!("GET {url}: {err:?}")))?;
        log(Level::Info, &format!("{} {url} {}", job.jid, response.status));
        match response.status {
            400..=499 => Err(JobError::Dead(format!("{} gave up", job.jid))),
            500.. => Err(JobError::Retry(format!("{}: HTTP {}", job.jid, response.status))),
            _ => Ok(()),
        }
    }
}

bindings::export!(RustAsyncJob with_types_in bindings);
