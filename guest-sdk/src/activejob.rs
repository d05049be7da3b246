//! Jobs a Rails app enqueued through ActiveJob.
//!
//! `WelcomeJob.perform_later(user, tag: :vip)` in a Rails app pushes a
//! wrapper job; the host unwraps it, so a plugin listing `WelcomeJob` in
//! its manifest runs it, and [`Job::Args`](crate::Job::Args) are decoded
//! from its ActiveJob arguments as plain JSON: `["gid://app/User/42",
//! {"tag": "vip"}]` (keyword arguments are the last element, an object;
//! a record passed by GlobalID is its `gid://` string; symbols, times,
//! durations and decimals are strings or numbers). The rest of the
//! ActiveJob hash is here:
//!
//! ```no_run
//! use wasmjobs_guest::{activejob, Job, JobError, JobInfo};
//!
//! struct WelcomeJob;
//!
//! impl Job for WelcomeJob {
//!     type Args = (String, serde_json::Value);
//!
//!     fn perform(_job: &JobInfo, (user, options): Self::Args) -> Result<(), JobError> {
//!         if let Some(aj) = activejob::context() {
//!             wasmjobs_guest::log::info!("{user} (ActiveJob {}, locale {:?})", aj.job_id, aj.locale);
//!         }
//!         // Or the hash exactly as Ruby wrote it, arguments undecoded:
//!         let _raw: Option<String> = activejob::raw();
//!         let _ = options;
//!         Ok(())
//!     }
//! }
//! ```

use crate::bindings::wasmjobs::job::activejob as wit;

/// ActiveJob's fields of the job being run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Context {
    /// ActiveJob's id (a UUID), not the Sidekiq jid.
    pub job_id: String,
    /// `job_class`: the job's class as Rails named it.
    pub job_class: String,
    /// `executions`: the runs before this one that Ruby's `retry_on`
    /// counted (the host's own retries are [`JobInfo::retry_count`](crate::JobInfo)).
    pub executions: u32,
    /// `priority`, if the job set one.
    pub priority: Option<i64>,
    /// `locale` (e.g. `"en"`), if set.
    pub locale: Option<String>,
    /// `timezone` (e.g. `"UTC"`), if set.
    pub timezone: Option<String>,
    /// `enqueued_at`, ISO 8601, if set.
    pub enqueued_at: Option<String>,
    /// `scheduled_at`, ISO 8601, for a job enqueued with `wait` or `wait_until`.
    pub scheduled_at: Option<String>,
}

/// The ActiveJob context of the job being run; `None` for a job not
/// enqueued through ActiveJob.
pub fn context() -> Option<Context> {
    wit::current().map(|c| Context {
        job_id: c.job_id,
        job_class: c.job_class,
        executions: c.executions,
        priority: c.priority,
        locale: c.locale,
        timezone: c.timezone,
        enqueued_at: c.enqueued_at,
        scheduled_at: c.scheduled_at,
    })
}

/// The ActiveJob hash (`job_class`, `arguments` undecoded, `executions`,
/// ...) exactly as Ruby wrote it, as JSON text; `None` for a job not
/// enqueued through ActiveJob. For arguments only Ruby's own serializers
/// produce, decode them here yourself.
pub fn raw() -> Option<String> {
    wit::raw()
}
