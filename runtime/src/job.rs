//! A job as the host sees it, and what became of it.
//!
//! [`Job`] is the host-side twin of the WIT `job` record: the fields a guest
//! receives. The Redis layer (Sidekiq's payload format) converts to and from
//! it; `wasmjobs exec` builds one from the command line. [`Outcome`] is the
//! decision the sandbox reaches after running a job, which the outcome stage
//! turns into ack, retry or dead.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::bindings::types as wit;

pub use wasmjobs_client::activejob::Context as ActiveJobContext;
pub use wasmjobs_client::job::{DEFAULT_QUEUE, MAX_CLASS_LEN, new_jid, preview};

/// One job to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Job id, 24 lowercase hex characters (Sidekiq's format).
    pub jid: String,
    /// The class that selects the plugin.
    pub class: String,
    /// The queue it came from.
    pub queue: String,
    /// The arguments: a JSON array, as text, passed to the guest untouched.
    pub args: String,
    /// Retries before this run (0 on the first run).
    pub retry_count: u32,
    /// Enqueue time, milliseconds since the Unix epoch.
    pub enqueued_at_ms: u64,
    /// For a job a Rails app enqueued through ActiveJob: what the
    /// `activejob` import gives the guest. `class` and `args` are then the
    /// job's own class and its decoded arguments, not the wrapper's.
    pub activejob: Option<Arc<ActiveJob>>,
}

/// The ActiveJob side of a [`Job`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveJob {
    /// The ActiveJob hash as Ruby wrote it (`args[0]`, JSON text); its
    /// context is read from it when a guest asks ([`ActiveJob::context`]).
    pub hash: String,
    /// Why the job cannot run as a plugin, if it cannot: an argument only
    /// Ruby can decode (an application's own serializer), or a wrapper
    /// without an ActiveJob hash. A plugin serving the class sends it to
    /// the dead set with this message.
    pub refused: Option<String>,
}

impl ActiveJob {
    /// The context in the hash (read now: most jobs never ask).
    pub fn context(&self) -> ActiveJobContext {
        wasmjobs_client::activejob::context(&self.hash)
    }
}

impl Job {
    /// A new job for `class` with `args`, enqueued now on the `default` queue.
    ///
    /// Fails if `args` is not a JSON array: that is the one shape every
    /// client (Sidekiq's included) agrees on, and catching it here gives a
    /// clear error before anything runs.
    pub fn new(class: &str, args: &str) -> Result<Self> {
        validate_args(args)?;
        Ok(Self {
            jid: new_jid(),
            class: class.to_owned(),
            queue: DEFAULT_QUEUE.to_owned(),
            args: args.to_owned(),
            retry_count: 0,
            enqueued_at_ms: now_ms(),
            activejob: None,
        })
    }

    /// The WIT record handed to the guest.
    pub(crate) fn to_wit(&self) -> wit::Job {
        wit::Job {
            jid: self.jid.clone(),
            class: self.class.clone(),
            queue: self.queue.clone(),
            args: self.args.clone(),
            retry_count: self.retry_count,
            enqueued_at_ms: self.enqueued_at_ms,
        }
    }
}

/// Checks that `args` is a JSON array (of anything).
pub fn validate_args(args: &str) -> Result<()> {
    let value: serde_json::Value =
        serde_json::from_str(args).with_context(|| format!("job args are not valid JSON: {}", preview(args)))?;
    if !value.is_array() {
        bail!("job args must be a JSON array, got {}", preview(args));
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Sidekiq caps `error_message` at this many characters; a guest's error
/// string is cut to it as it enters the host ([`Outcome`]'s `From`), so the
/// job's log line and its `error_message` show the same text and a guest
/// cannot write megabytes to the log through its error.
pub const MAX_ERROR_CHARS: usize = 10_000;

/// `message` cut to [`MAX_ERROR_CHARS`] characters.
pub fn cap_error(message: &str) -> &str {
    match message.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => &message[..cut],
        None => message,
    }
}

fn cap_owned(mut message: String) -> String {
    let cut = cap_error(&message).len();
    message.truncate(cut);
    message
}

/// What running a job decided.
///
/// Every failure carries a message meant for a person reading the dead set or
/// the logs; it becomes Sidekiq's `error_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `perform` returned `ok`: acknowledge the job.
    Success,
    /// A transient failure (a `retry` error, a trap, a timeout): retry the
    /// job following its retry policy.
    Retry(String),
    /// The guest asked for the job to be dropped.
    Discard(String),
    /// The job can never succeed: move it to the dead set.
    Dead(String),
}

impl Outcome {
    /// Whether the job succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success)
    }

    /// A short name of the outcome: `ok`, `retry`, `discard` or `dead`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Success => "ok",
            Outcome::Retry(_) => "retry",
            Outcome::Discard(_) => "discard",
            Outcome::Dead(_) => "dead",
        }
    }

    /// The failure message, if the job failed.
    pub fn message(&self) -> Option<&str> {
        match self {
            Outcome::Success => None,
            Outcome::Retry(m) | Outcome::Discard(m) | Outcome::Dead(m) => Some(m),
        }
    }
}

impl From<wit::JobError> for Outcome {
    fn from(err: wit::JobError) -> Self {
        match err {
            wit::JobError::Retry(m) => Outcome::Retry(cap_owned(m)),
            wit::JobError::Discard(m) => Outcome::Discard(cap_owned(m)),
            wit::JobError::Dead(m) => Outcome::Dead(cap_owned(m)),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.message() {
            None => f.write_str(self.kind()),
            Some(m) => write!(f, "{}: {m}", self.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_errors_are_cut_on_a_character_boundary() {
        let long = format!("{}{}", "é".repeat(MAX_ERROR_CHARS - 1), "xyz");
        let Outcome::Retry(cut) = Outcome::from(wit::JobError::Retry(long)) else {
            panic!("kind changed");
        };
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert!(cut.ends_with("éx"), "{}", &cut[cut.len() - 8..]);
        assert_eq!(cap_error("short"), "short");
    }

    #[test]
    fn args_must_be_a_json_array() {
        assert!(validate_args("[1, \"a\", {\"k\": null}]").is_ok());
        assert!(validate_args("[]").is_ok());
        let err = validate_args("{\"a\": 1}").unwrap_err().to_string();
        assert!(err.contains("must be a JSON array"), "{err}");
        let err = validate_args("[1,").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
