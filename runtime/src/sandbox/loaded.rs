//! [`Loaded`]: what the sandbox needs to run a plugin version's jobs.
//!
//! The plugin layer builds one when a version loads (compiled and
//! pre-linked component, grants, limits, instance policy) and keeps it
//! beside the version's identity and manifest; the executor reads nothing
//! else of the plugin. Per-version instance state (the warm pool, the
//! concurrent lanes) lives here too: a reloaded version starts with none.

use std::sync::Arc;

use super::concurrent::Lanes;
use super::policy::{InstancePolicy, JobLimits};
use super::state::JobState;
use super::warm::WarmPool;
use crate::bindings::PluginPre;
use crate::bindings::concurrent::AsyncPluginPre;
use crate::host::Grants;

/// One plugin version, ready to run jobs.
pub struct Loaded {
    /// The plugin's name: its directory's (log lines, spans). Shared, as
    /// every job's labels carry it.
    pub name: Arc<str>,
    /// Which build of the plugin this is (content hash, 12 hex chars).
    pub version: Arc<str>,
    /// What its jobs may reach.
    pub grants: Grants,
    /// Its per-job bounds; `None` takes the runner's default.
    pub limits: JobLimits,
    /// How its instances serve jobs (`[instances]`).
    pub instances: InstancePolicy,
    pub(crate) pre: Prepared,
    /// Its idle warm instances (`[instances] reuse`).
    pub warm: Arc<WarmPool>,
    /// Its concurrent instances (`[instances] concurrent`).
    pub lanes: Arc<Lanes>,
}

impl Loaded {
    /// A version of plugin `name` ready to run `pre` under these grants,
    /// limits and instance policy, with no instance yet.
    pub(crate) fn new(
        name: String,
        version: String,
        grants: Grants,
        limits: JobLimits,
        instances: InstancePolicy,
        pre: Prepared,
    ) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            grants,
            limits,
            instances,
            pre,
            warm: Arc::default(),
            lanes: Arc::default(),
        }
    }
}

/// A plugin pre-linked for the world its engine serves.
#[derive(Clone)]
pub(crate) enum Prepared {
    /// `plugin`: one job per instance at a time.
    Serial(PluginPre<JobState>),
    /// `async-plugin`: up to `[instances] concurrent` jobs per instance.
    Concurrent(AsyncPluginPre<JobState>),
}
