//! A job to push, built step by step ([`Job`]); the small facts every
//! payload shares (job ids, the default queue, the class length bound)
//! live in [`crate::fields`] and are re-exported here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use serde_json::Value;

pub use crate::fields::{DEFAULT_QUEUE, MAX_CLASS_LEN, new_jid, preview};
use crate::payload::Payload;
use crate::unique::{Lock, UniqueUntil};

/// Longest queue name a [`Job`] accepts, in bytes.
pub const MAX_QUEUE_LEN: usize = 256;

/// Longest explicit unique key ([`Job::unique_key`]), in bytes.
pub const MAX_UNIQUE_KEY_LEN: usize = 1024;

/// Longest `unique_for` accepted: ten years.
pub const MAX_UNIQUE_FOR: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// A job to push: class, args, queue, and the options Sidekiq clients set.
///
/// ```
/// use std::time::Duration;
/// use wasmjobs_client::{Job, UniqueUntil};
///
/// let job = Job::new("Mailer")
///     .args(serde_json::json!([42, "welcome"]))
///     .queue("mail")
///     .retry(5)
///     // Not pushed again while one with the same class, queue and args
///     // is queued, scheduled, retrying or running: at most 10 minutes.
///     .unique_for(Duration::from_secs(600))
///     .unique_until(UniqueUntil::Success);
/// assert_eq!(job.class_name(), "Mailer");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub(crate) class: String,
    pub(crate) args: Value,
    pub(crate) queue: String,
    pub(crate) at: Option<SystemTime>,
    pub(crate) unique_for: Option<Duration>,
    pub(crate) unique_key: Option<String>,
    pub(crate) unique_until: UniqueUntil,
    pub(crate) fields: Vec<(String, Value)>,
}

impl Job {
    /// A job of `class`, no args, on the `default` queue, pushed now.
    pub fn new(class: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            args: Value::Array(Vec::new()),
            queue: DEFAULT_QUEUE.to_owned(),
            at: None,
            unique_for: None,
            unique_key: None,
            unique_until: UniqueUntil::Success,
            fields: Vec::new(),
        }
    }

    /// The class.
    pub fn class_name(&self) -> &str {
        &self.class
    }

    /// The arguments: a JSON array (anything else is refused at push).
    pub fn args(mut self, args: Value) -> Self {
        self.args = args;
        self
    }

    /// The queue (default `default`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Sidekiq's `retry`: `true` (25 retries), `false` (none, and no dead
    /// set), or the most retries.
    pub fn retry(self, retry: impl Into<Value>) -> Self {
        self.field("retry", retry.into())
    }

    /// Any other payload field (`tags`, `dead`, your own); the fields
    /// wasmjobs sets itself (class, args, queue, jid, times, unique fields)
    /// are refused at push.
    pub fn field(mut self, key: impl Into<String>, value: Value) -> Self {
        self.fields.push((key.into(), value));
        self
    }

    /// Runs the job at `time` rather than now (a time in the past pushes
    /// it now).
    pub fn at(mut self, time: SystemTime) -> Self {
        self.at = Some(time);
        self
    }

    /// Makes the job unique for `ttl` (Sidekiq Enterprise's `unique_for`,
    /// rounded up to whole seconds): while a job with the same class, queue
    /// and args (or the same [`unique_key`](Job::unique_key)) is queued,
    /// scheduled, retrying or running, and for at most `ttl` (after its run
    /// time, for a scheduled job), pushing this one is refused as a
    /// [`Duplicate`](crate::Pushed::Duplicate).
    pub fn unique_for(mut self, ttl: Duration) -> Self {
        self.unique_for = Some(ttl);
        self
    }

    /// Unique on `key` instead of (class, queue, args). The key is global:
    /// jobs of any class or queue sharing it are duplicates of each other.
    /// Needs [`unique_for`](Job::unique_for).
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// When the lock is released besides expiry: on success (the default;
    /// also when the job is discarded, dies or is dropped) or when the job
    /// starts (Sidekiq Enterprise's `unique_until: :start`).
    pub fn unique_until(mut self, until: UniqueUntil) -> Self {
        self.unique_until = until;
        self
    }

    /// When the job is to run, epoch seconds, if later than `now`.
    pub fn run_at(&self, now: f64) -> Option<f64> {
        let at = self.at?.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
        (at > now).then_some(at)
    }

    /// The payload Sidekiq's client would write (fresh jid, `created_at`
    /// = `now`), and the unique lock it must take, after checking every
    /// field.
    pub fn to_payload(&self, now: f64) -> Result<(Payload, Option<Lock>)> {
        if self.class.trim().is_empty() {
            bail!("the job class must not be empty");
        }
        if self.class.len() > MAX_CLASS_LEN {
            bail!(
                "the job class is {} bytes long, more than the {MAX_CLASS_LEN} allowed",
                self.class.len()
            );
        }
        if self.queue.trim().is_empty() || self.queue.len() > MAX_QUEUE_LEN {
            bail!("the queue name must be 1 to {MAX_QUEUE_LEN} bytes long and not blank");
        }
        let Value::Array(args) = &self.args else {
            bail!("job args must be a JSON array, got {}", preview(&self.args.to_string()));
        };
        let mut payload = Payload::new(&self.class, args.clone(), &self.queue, now);
        for (key, value) in &self.fields {
            if RESERVED.contains(&key.as_str()) {
                bail!("the payload field {key:?} is set by wasmjobs; use the builder's own method");
            }
            payload.set(key, value.clone());
        }
        let lock = match self.unique_for {
            None if self.unique_key.is_some() || self.unique_until != UniqueUntil::Success => {
                bail!("unique_key and unique_until need unique_for (how long the job stays unique)")
            }
            None => None,
            Some(ttl) => {
                let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
                if secs == 0 || ttl > MAX_UNIQUE_FOR {
                    bail!(
                        "unique_for must be between 1 second and {} days",
                        MAX_UNIQUE_FOR.as_secs() / 86_400
                    );
                }
                if let Some(key) = &self.unique_key
                    && (key.is_empty() || key.len() > MAX_UNIQUE_KEY_LEN)
                {
                    bail!("the unique key must be 1 to {MAX_UNIQUE_KEY_LEN} bytes long");
                }
                let lock = Lock::for_job(&payload, self.unique_key.as_deref());
                lock.mark(&mut payload, secs, self.unique_until);
                Some(lock)
            }
        };
        Ok((payload, lock))
    }
}

/// Payload fields only the builder sets.
const RESERVED: [&str; 11] = [
    "class",
    "args",
    "queue",
    "jid",
    "created_at",
    "enqueued_at",
    "at",
    "unique_for",
    "unique_until",
    crate::unique::LOCK_FIELD,
    crate::unique::KEY_FIELD,
];

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn jids_look_like_sidekiqs() {
        let jid = new_jid();
        assert_eq!(jid.len(), 24);
        assert!(jid.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(jid, new_jid());
    }

    #[test]
    fn a_plain_job_is_sidekiqs_payload() {
        let (payload, lock) = Job::new("Mailer")
            .args(json!([1, "a"]))
            .queue("mail")
            .retry(false)
            .field("tags", json!(["x"]))
            .to_payload(1_764_500_000.5)
            .unwrap();
        assert!(lock.is_none());
        assert_eq!(payload.class(), "Mailer");
        assert_eq!(payload.queue(), "mail");
        assert_eq!(payload.get("args"), Some(&json!([1, "a"])));
        assert_eq!(payload.get("retry"), Some(&json!(false)));
        assert_eq!(payload.get("tags"), Some(&json!(["x"])));
        assert_eq!(payload.time("created_at"), Some(1_764_500_000.5));
        assert_eq!(payload.get("unique_for"), None);
    }

    #[test]
    fn a_unique_job_carries_ents_fields_and_its_lock() {
        let (payload, lock) = Job::new("Mailer")
            .args(json!([1]))
            .unique_for(Duration::from_millis(1500))
            .unique_until(UniqueUntil::Start)
            .to_payload(1.0)
            .unwrap();
        let lock = lock.expect("a lock");
        assert_eq!(
            payload.get("unique_for"),
            Some(&json!(2)),
            "rounded up to whole seconds"
        );
        assert_eq!(payload.str("unique_until"), Some("start"));
        assert_eq!(payload.str(crate::unique::LOCK_FIELD), Some(lock.key()));
        assert_eq!(lock.jid(), payload.jid());
    }

    #[test]
    fn bad_jobs_are_refused_with_a_reason() {
        let cases = [
            (Job::new(""), "class must not be empty"),
            (Job::new("C".repeat(MAX_CLASS_LEN + 1)), "more than the 256"),
            (Job::new("X").queue(""), "queue name"),
            (Job::new("X").args(json!({"a": 1})), "must be a JSON array"),
            (Job::new("X").field("jid", json!("j")), "set by wasmjobs"),
            (Job::new("X").unique_key("k"), "need unique_for"),
            (Job::new("X").unique_for(Duration::ZERO), "between 1 second"),
            (Job::new("X").unique_for(MAX_UNIQUE_FOR * 2), "between 1 second"),
            (
                Job::new("X").unique_for(Duration::from_secs(1)).unique_key(""),
                "unique key must be",
            ),
        ];
        for (job, expected) in cases {
            let err = job.to_payload(1.0).unwrap_err().to_string();
            assert!(err.contains(expected), "{job:?}: {err}");
        }
    }
}
