//! How a plugin's instances serve jobs ([`InstancePolicy`]) and the bounds
//! of one job ([`JobLimits`]): plain values the plugin layer reads from a
//! manifest and the sandbox enforces.

use std::time::Duration;

/// The bounds of one job of a plugin; `None` takes the runner's default
/// ([`super::Limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLimits {
    /// Linear memory, bytes.
    pub memory: Option<usize>,
    /// Wall-clock time.
    pub timeout: Option<Duration>,
    /// Fuel (only on a runner that meters it).
    pub fuel: Option<u64>,
}

/// How long an idle warm instance is kept by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// A plugin's instance policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstancePolicy {
    /// Most jobs one instance serves (1: a fresh instance per job).
    pub reuse: u32,
    /// How long an idle warm instance is kept.
    pub idle_timeout: Duration,
    /// Most idle warm instances kept for the plugin; `None`: up to the
    /// runner's budget for idle instances (its `--concurrency`, ≤ 1,024).
    pub max_idle: Option<u32>,
    /// Most jobs one instance runs at once; `None`: one (and the component
    /// targets the `plugin` world). Set, the component must target
    /// `async-plugin`.
    pub concurrent: Option<u32>,
}

impl Default for InstancePolicy {
    fn default() -> Self {
        Self {
            reuse: 1,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_idle: None,
            concurrent: None,
        }
    }
}

impl InstancePolicy {
    /// Whether instances may serve more than one job.
    pub fn reuses(&self) -> bool {
        self.reuse > 1
    }
}
