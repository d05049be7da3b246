//! `[limits]` in a plugin manifest: per-plugin overrides of the runner's
//! per-job limits.
//!
//! - `memory` (e.g. `"64MiB"`): most linear memory one job may grow to;
//! - `timeout` (e.g. `"30s"`, `"500ms"`): wall-clock bound per job;
//! - `concurrency`: most jobs of this plugin in flight in the process — jobs
//!   beyond it wait without holding one of the runner's slots;
//! - `disk` (e.g. `"100MiB"`): most bytes the plugin's read-write
//!   directories may hold, all its jobs together (`crate::host::disk`);
//! - `fuel`: an instruction budget per job (needs the runner's `--fuel`;
//!   such a plugin runs on a metered engine of its own, 10–25% slower,
//!   and the others are not metered);
//! - `log` (e.g. `{ bytes = "1MiB", lines = 10000 }`): the most log lines
//!   and bytes one job may write, the `log` import, stdout and stderr
//!   counted together; lines past it are dropped and one line says how
//!   many (`host::log`). Either key may be left out: it keeps its default
//!   (1 MiB, 10,000 lines).
//!
//! Unset keys fall back to the runner's settings.
//!
//! `rate` and `[limits.per_key]` are cluster-wide limits, every process
//! together; they are parsed in [`super::cluster_limits`].

use std::ops::Range;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use toml::Spanned;

use super::cluster_limits::{self, ClusterLimits, RawPerKey};
use crate::host::log::LogBudget;
use crate::size::parse_size;

/// A plugin's limits; `None` means the runner's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginLimits {
    /// Linear memory cap per job, bytes.
    pub memory: Option<usize>,
    /// Wall-clock bound per job.
    pub timeout: Option<Duration>,
    /// Jobs of this plugin in flight at once.
    pub concurrency: Option<u32>,
    /// Fuel per job.
    pub fuel: Option<u64>,
    /// Log lines and bytes per job.
    pub log: Option<LogBudget>,
    /// Bytes the plugin's read-write directories may hold.
    pub disk: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    memory: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    fuel: Option<Spanned<i64>>,
    log: Option<RawLogBudget>,
    disk: Option<Spanned<String>>,
    rate: Option<Spanned<String>>,
    per_key: Option<Spanned<RawPerKey>>,
}

/// `limits.log = { bytes = "1MiB", lines = 10000 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLogBudget {
    bytes: Option<Spanned<String>>,
    lines: Option<Spanned<i64>>,
}

impl RawLogBudget {
    fn resolve(&self, at: &dyn Fn(Range<usize>) -> String) -> Result<LogBudget> {
        let mut budget = LogBudget::default();
        if let Some(bytes) = &self.bytes {
            let size =
                parse_size(bytes.get_ref()).map_err(|e| anyhow!("{}: limits.log.bytes: {e}", at(bytes.span())))?;
            if size == 0 {
                bail!("{}: limits.log.bytes must be more than zero", at(bytes.span()));
            }
            budget.bytes = size as u64;
        }
        if let Some(lines) = &self.lines {
            budget.lines = at_least_one(lines, "log.lines", at)?;
        }
        Ok(budget)
    }
}

impl RawLimits {
    /// The cluster-wide limits (`rate`, `[limits.per_key]`), validated.
    pub(super) fn cluster(&self, at: &dyn Fn(Range<usize>) -> String) -> Result<ClusterLimits> {
        cluster_limits::resolve(self.rate.as_ref(), self.per_key.as_ref(), at)
    }

    /// Validates; `at` turns a span into `file:line` for messages.
    pub(super) fn resolve(&self, at: &dyn Fn(Range<usize>) -> String) -> Result<PluginLimits> {
        let memory = match &self.memory {
            Some(m) => Some(parse_size(m.get_ref()).map_err(|e| anyhow!("{}: limits.memory: {e}", at(m.span())))?),
            None => None,
        };
        let timeout = match &self.timeout {
            Some(t) => {
                let d = humantime::parse_duration(t.get_ref()).map_err(|e| {
                    anyhow!(
                        "{}: limits.timeout: {:?} is not a duration ({e}; e.g. \"30s\", \"500ms\")",
                        at(t.span()),
                        t.get_ref()
                    )
                })?;
                if d.is_zero() {
                    bail!("{}: limits.timeout must be more than zero", at(t.span()));
                }
                Some(d)
            }
            None => None,
        };
        let concurrency = self
            .concurrency
            .as_ref()
            .map(|c| at_least_one(c, "concurrency", at))
            .transpose()?;
        let fuel = self.fuel.as_ref().map(|f| at_least_one(f, "fuel", at)).transpose()?;
        let log = self.log.as_ref().map(|l| l.resolve(at)).transpose()?;
        let disk = match &self.disk {
            Some(d) => {
                let bytes = parse_size(d.get_ref()).map_err(|e| anyhow!("{}: limits.disk: {e}", at(d.span())))?;
                if bytes == 0 {
                    bail!("{}: limits.disk must be more than zero", at(d.span()));
                }
                Some(bytes as u64)
            }
            None => None,
        };
        Ok(PluginLimits {
            memory,
            timeout,
            concurrency,
            fuel,
            log,
            disk,
        })
    }
}

/// A whole number ≥ 1 that fits `T`, or an error naming the key and line.
fn at_least_one<T: TryFrom<i64>>(value: &Spanned<i64>, key: &str, at: &dyn Fn(Range<usize>) -> String) -> Result<T> {
    Some(*value.get_ref())
        .filter(|&v| v > 0)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| anyhow!("{}: limits.{key} must be a whole number ≥ 1", at(value.span())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(text: &str) -> Result<PluginLimits> {
        let raw: RawLimits = toml::from_str(text)?;
        raw.resolve(&|span| format!("at {}", span.start))
    }

    #[test]
    fn the_log_budget_parses_with_defaults_for_missing_keys() {
        let both = limits("log = { bytes = \"2KiB\", lines = 5 }").unwrap();
        assert_eq!(both.log, Some(LogBudget { lines: 5, bytes: 2048 }));
        let lines = limits("log = { lines = 7 }").unwrap();
        assert_eq!(
            lines.log,
            Some(LogBudget {
                lines: 7,
                ..LogBudget::default()
            })
        );
        assert_eq!(limits("").unwrap().log, None);
        for bad in [
            "log = { lines = 0 }",
            "log = { bytes = \"0\" }",
            "log = { bytes = \"lots\" }",
            "log = { words = 3 }",
        ] {
            assert!(limits(bad).is_err(), "{bad} accepted");
        }
        let err = limits("log = { lines = -1 }").unwrap_err().to_string();
        assert!(err.contains("limits.log.lines must be a whole number"), "{err}");
    }
}
