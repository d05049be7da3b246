//! A loaded plugin version ([`Plugin`]), a refused one ([`Broken`]), and
//! what a rescan did to a plugin directory ([`Change`]): what the catalog
//! holds and the plugin report ([`super::describe`]) reads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::cache::CacheUse;
use super::manifest::{Manifest, plugin_name};
use crate::sandbox::Loaded;

/// A loaded plugin version: its identity and manifest, the runner's
/// state for it, and what the sandbox runs ([`Loaded`]).
pub struct Plugin {
    /// The plugin's name: its directory name.
    pub name: String,
    /// Content hash of component + manifest (12 hex chars): which build of
    /// the plugin ran a job.
    pub version: String,
    /// The validated manifest.
    pub manifest: Manifest,
    /// Whether the compiled code came from the cache.
    pub cache: CacheUse,
    /// How long loading took (read, compile or load from cache, link).
    pub load_time: Duration,
    /// Slots of `limits.concurrency`, if the plugin sets it.
    pub slots: Option<Arc<Semaphore>>,
    /// What the sandbox runs: the pre-linked component with its grants
    /// (the granted directories opened, whatever happens to their names
    /// after load), limits, instance policy and instances.
    pub loaded: Loaded,
    /// A development build's hold on its unpacked sources, for as long as
    /// this version is loaded.
    pub(crate) _dev_sources: Option<super::dev_sources::InUse>,
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
