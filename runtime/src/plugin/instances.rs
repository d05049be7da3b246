//! `[instances]` in a plugin manifest: whether a plugin's instances serve
//! more than one job.
//!
//! ```toml
//! [instances]
//! reuse = 1000          # jobs one instance serves, one after another (default 1: a fresh instance per job)
//! idle_timeout = "10s"  # an idle warm instance is dropped after this long
//! max_idle = 100        # most idle warm instances kept for this plugin
//! concurrent = 50       # jobs one instance runs at once (async-plugin world only)
//! ```
//!
//! `concurrent = K` is for components built for the `async-plugin` world,
//! whose `perform` is an `async func`: one instance then runs up to K jobs
//! at once, switching between them while they await HTTP or SQL, and
//! serves up to `reuse` jobs in all (10,000 unless set), then retires.
//!
//! Fresh instances are the default because they are the simplest contract:
//! nothing a job leaves behind in its module's globals reaches the next
//! one. Interpreted guests (Python, JavaScript) pay milliseconds to warm up
//! an interpreter for every fresh instance, and may opt into reuse; what
//! persists and what is reset is the executor's business
//! (`crate::sandbox::warm`).

use std::ops::Range;

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use toml::Spanned;

pub use crate::sandbox::policy::{DEFAULT_IDLE_TIMEOUT, InstancePolicy};

/// Jobs one concurrent instance serves in all when `reuse` is not set: a
/// bound on what a guest can leak, high enough that instantiation is lost
/// in the noise.
pub const DEFAULT_CONCURRENT_REUSE: u32 = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInstances {
    reuse: Option<Spanned<i64>>,
    concurrent: Option<Spanned<i64>>,
    idle_timeout: Option<Spanned<String>>,
    max_idle: Option<Spanned<i64>>,
}

impl RawInstances {
    /// Validates; `at` turns a span into `file:line` for messages.
    pub(super) fn resolve(&self, at: &dyn Fn(Range<usize>) -> String) -> Result<InstancePolicy> {
        let mut policy = InstancePolicy::default();
        if let Some(reuse) = &self.reuse {
            policy.reuse = whole(reuse, "reuse", 1, at)?;
        }
        if let Some(concurrent) = &self.concurrent {
            policy.concurrent = Some(whole(concurrent, "concurrent", 1, at)?);
            if self.reuse.is_none() {
                policy.reuse = DEFAULT_CONCURRENT_REUSE;
            }
        }
        if let Some(max_idle) = &self.max_idle {
            policy.max_idle = Some(whole(max_idle, "max_idle", 0, at)?);
        }
        if let Some(idle) = &self.idle_timeout {
            let d = humantime::parse_duration(idle.get_ref()).map_err(|e| {
                anyhow!(
                    "{}: instances.idle_timeout: {:?} is not a duration ({e}; e.g. \"10s\", \"500ms\")",
                    at(idle.span()),
                    idle.get_ref()
                )
            })?;
            if d.is_zero() {
                bail!("{}: instances.idle_timeout must be more than zero", at(idle.span()));
            }
            policy.idle_timeout = d;
        }
        Ok(policy)
    }
}

/// A whole number ≥ `min` that fits a `u32`, or an error naming the key and line.
fn whole(value: &Spanned<i64>, key: &str, min: i64, at: &dyn Fn(Range<usize>) -> String) -> Result<u32> {
    Some(*value.get_ref())
        .filter(|&v| v >= min)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| anyhow!("{}: instances.{key} must be a whole number ≥ {min}", at(value.span())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy(text: &str) -> Result<InstancePolicy> {
        let raw: RawInstances = toml::from_str(text)?;
        raw.resolve(&|span| format!("at {}", span.start))
    }

    #[test]
    fn defaults_mean_a_fresh_instance_per_job() {
        let default = policy("").unwrap();
        assert_eq!(default, InstancePolicy::default());
        assert!(!default.reuses());
        assert!(!policy("reuse = 1").unwrap().reuses());
    }

    #[test]
    fn every_key_parses() {
        let p = policy("reuse = 1000\nidle_timeout = \"2s\"\nmax_idle = 0").unwrap();
        assert_eq!(p.reuse, 1000);
        assert!(p.reuses());
        assert_eq!(p.idle_timeout, Duration::from_secs(2));
        assert_eq!(p.max_idle, Some(0));
    }

    #[test]
    fn concurrent_instances_serve_many_jobs_unless_told_otherwise() {
        let p = policy("concurrent = 50").unwrap();
        assert_eq!(p.concurrent, Some(50));
        assert_eq!(p.reuse, DEFAULT_CONCURRENT_REUSE);
        assert_eq!(policy("concurrent = 8\nreuse = 100").unwrap().reuse, 100);
        assert_eq!(policy("").unwrap().concurrent, None);
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        for (text, wanted) in [
            ("reuse = 0", "instances.reuse must be a whole number ≥ 1"),
            ("reuse = -5", "instances.reuse"),
            ("reuse = 99999999999", "instances.reuse"),
            ("max_idle = -1", "instances.max_idle must be a whole number ≥ 0"),
            (
                "idle_timeout = \"soon\"",
                "instances.idle_timeout: \"soon\" is not a duration",
            ),
            ("idle_timeout = \"0s\"", "must be more than zero"),
        ] {
            let err = policy(text).unwrap_err().to_string();
            assert!(err.contains(wanted), "{text}: {err}");
        }
        assert!(policy("reuse_count = 3").is_err(), "unknown keys are refused");
        assert!(
            policy("concurrent = 0")
                .unwrap_err()
                .to_string()
                .contains("instances.concurrent must be a whole number ≥ 1")
        );
    }
}
