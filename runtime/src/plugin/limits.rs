//! `[limits]` in a plugin manifest: per-plugin overrides of the runner's
//! per-job limits.
//!
//! - `memory` (e.g. `"64MiB"`): most linear memory one job may grow to;
//! - `timeout` (e.g. `"30s"`, `"500ms"`): wall-clock bound per job;
//! - `concurrency`: most jobs of this plugin in flight in the process — jobs
//!   beyond it wait without holding one of the runner's slots;
//! - `disk` (e.g. `"100MiB"`): most bytes the plugin's read-write
//!   directories may hold, all its jobs together (`crate::host::disk`);
//! - `fuel`: an instruction budget per job (needs the runner's `--fuel`,
//!   because metering slows every plugin by 10–25%).
//!
//! Unset keys fall back to the runner's settings.

use std::ops::Range;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use toml::Spanned;

use crate::sandbox::engine::parse_size;

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
    disk: Option<Spanned<String>>,
}

impl RawLimits {
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
