//! A loaded plugin version ([`Plugin`]), a refused one ([`Broken`]), and
//! what a rescan did to a plugin directory ([`Change`]): what the catalog
//! holds and the plugin report ([`super::describe`]) reads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::cache::CacheUse;
use super::manifest::{Manifest, plugin_name};
use crate::host::disk::DiskBudget;
use crate::host::http::{AllowList, HttpStats, PluginPools};
use crate::sandbox::concurrent::Lanes;
use crate::sandbox::executor::Prepared;
use crate::sandbox::warm::WarmPool;

/// A loaded plugin, ready to instantiate.
pub struct Plugin {
    /// The plugin's name: its directory name.
    pub name: String,
    /// Content hash of component + manifest (12 hex chars): which build of
    /// the plugin ran a job.
    pub version: String,
    /// The validated manifest, with its granted directories opened (the
    /// handles every job of this version gets, whatever happens to the
    /// directories' names after load).
    pub manifest: Manifest,
    /// Whether the compiled code came from the cache.
    pub cache: CacheUse,
    /// How long loading took (read, compile or load from cache, link).
    pub load_time: Duration,
    /// Outgoing HTTP grants (parsed `http.allow`).
    pub http_allow: Arc<AllowList>,
    /// Outgoing HTTP counters of this plugin.
    pub http_stats: Arc<HttpStats>,
    /// This version's own HTTP connections (never shared with another
    /// plugin; a reloaded version starts afresh, as its grants may differ).
    pub http_pools: Arc<PluginPools>,
    /// Slots of `limits.concurrency`, if the plugin sets it.
    pub slots: Option<Arc<Semaphore>>,
    /// The budget of its read-write directories (`limits.disk`), if it has any.
    pub disk: Option<Arc<DiskBudget>>,
    pub(crate) pre: Prepared,
    /// This version's idle warm instances (`[instances] reuse`); a
    /// reloaded version starts with none.
    pub warm: Arc<WarmPool>,
    /// This version's concurrent instances (`[instances] concurrent`).
    pub lanes: Arc<Lanes>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("classes", &self.manifest.classes)
            .finish_non_exhaustive()
    }
}

/// A plugin that could not be loaded, and why.
#[derive(Debug, Clone)]
pub struct Broken {
    /// The manifest of the refused plugin.
    pub manifest: PathBuf,
    /// What is wrong, naming the file (and line, for manifest errors).
    pub error: String,
}

impl Broken {
    /// The name of the refused plugin: its directory's.
    pub fn plugin(&self) -> String {
        self.manifest.parent().map(plugin_name).unwrap_or_default()
    }
}

/// What [`Catalog::rescan`] did to one plugin directory.
#[derive(Debug)]
pub enum Change {
    /// Same component and manifest as the version loaded (or still absent).
    Unchanged,
    /// A new plugin.
    Added(Arc<Plugin>),
    /// A new version of a loaded plugin.
    Replaced {
        /// The version jobs started before the swap finish on.
        old: Arc<Plugin>,
        /// The version every later job gets.
        new: Arc<Plugin>,
    },
    /// The directory or its manifest is gone.
    Removed(Arc<Plugin>),
    /// The new files do not load; `kept` (if any) keeps serving.
    Rejected {
        /// Why, naming the file.
        error: String,
        /// The version that stays in service.
        kept: Option<Arc<Plugin>>,
    },
}
