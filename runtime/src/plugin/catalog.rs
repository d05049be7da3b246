//! The catalog: which plugin serves which job class.
//!
//! Built by scanning a plugins directory. A plugin that fails to load (bad
//! manifest, missing or invalid component, wrong world, a class already
//! served by another plugin) is recorded in [`Catalog::broken`] with the
//! reason, and every other plugin still loads: one bad plugin never takes
//! the others down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cache::{CacheUse, CompileCache, sha256_hex};
use super::manifest::{MANIFEST_FILE, Manifest};
use crate::bindings::PluginPre;
use tokio::sync::Semaphore;

use crate::host::files;
use crate::host::http::{AllowList, HttpStats};
use crate::sandbox::{Executor, JobState};

/// A loaded plugin, ready to instantiate.
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
    /// Outgoing HTTP grants (parsed `http.allow`).
    pub http_allow: Arc<AllowList>,
    /// Outgoing HTTP counters of this plugin.
    pub http_stats: Arc<HttpStats>,
    /// Slots of `limits.concurrency`, if the plugin sets it.
    pub slots: Option<Arc<Semaphore>>,
    pub(crate) pre: PluginPre<JobState>,
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

/// Loaded plugins by job class, plus the ones that were refused.
#[derive(Debug, Default)]
pub struct Catalog {
    plugins: Vec<Arc<Plugin>>,
    by_class: BTreeMap<String, Arc<Plugin>>,
    broken: Vec<Broken>,
}

impl Catalog {
    /// Loads every plugin under `dir`: `dir` itself if it holds a
    /// `wasmjobs.toml`, otherwise each immediate subdirectory that does.
    /// Fails only if `dir` cannot be read; broken plugins are collected.
    pub fn load(dir: &Path, executor: &Executor, cache: &CompileCache) -> Result<Self> {
        let mut catalog = Catalog::default();
        for manifest in find_manifests(dir)? {
            match load_plugin(&manifest, executor, cache) {
                Ok(plugin) => catalog.add(plugin, manifest),
                Err(err) => catalog.broken.push(Broken {
                    manifest,
                    error: format!("{err:#}"),
                }),
            }
        }
        Ok(catalog)
    }

    fn add(&mut self, plugin: Plugin, manifest: PathBuf) {
        if let Some((class, other)) = plugin
            .manifest
            .classes
            .iter()
            .find_map(|c| self.by_class.get(c).map(|p| (c, p)))
        {
            let error = format!(
                "{}: class {class:?} is already served by {}",
                manifest.display(),
                other.manifest.path.display()
            );
            self.broken.push(Broken { manifest, error });
            return;
        }
        let plugin = Arc::new(plugin);
        for class in &plugin.manifest.classes {
            self.by_class.insert(class.clone(), plugin.clone());
        }
        self.plugins.push(plugin);
    }

    /// The plugin serving `class`, if any.
    pub fn get(&self, class: &str) -> Option<&Arc<Plugin>> {
        self.by_class.get(class)
    }

    /// Loaded plugins, in directory order.
    pub fn plugins(&self) -> &[Arc<Plugin>] {
        &self.plugins
    }

    /// Served classes, sorted, with their plugin.
    pub fn classes(&self) -> impl Iterator<Item = (&str, &Arc<Plugin>)> {
        self.by_class.iter().map(|(c, p)| (c.as_str(), p))
    }

    /// Plugins that were refused, with reasons.
    pub fn broken(&self) -> &[Broken] {
        &self.broken
    }
}

/// Manifests under `dir`, sorted for a stable load order.
fn find_manifests(dir: &Path) -> Result<Vec<PathBuf>> {
    let own = dir.join(MANIFEST_FILE);
    if own.is_file() {
        return Ok(vec![own]);
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read plugins directory {}", dir.display()))?;
    let mut manifests = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read plugins directory {}", dir.display()))?;
        let candidate = entry.path().join(MANIFEST_FILE);
        if candidate.is_file() {
            manifests.push(candidate);
        }
    }
    manifests.sort();
    Ok(manifests)
}

/// Reads, compiles, checks and pre-links one plugin.
fn load_plugin(manifest_path: &Path, executor: &Executor, cache: &CompileCache) -> Result<Plugin> {
    let started = Instant::now();
    let manifest_text =
        std::fs::read(manifest_path).with_context(|| format!("{}: cannot read manifest", manifest_path.display()))?;
    let manifest = Manifest::parse(manifest_path, &String::from_utf8_lossy(&manifest_text))?;
    let bytes = std::fs::read(&manifest.component).with_context(|| {
        format!(
            "{}: cannot read component {} (was it built? scripts/build-plugins.sh builds the examples)",
            manifest_path.display(),
            manifest.component.display()
        )
    })?;
    if !is_component(&bytes) {
        bail!(
            "{}: {} is not a WebAssembly component{}",
            manifest_path.display(),
            manifest.component.display(),
            if bytes.starts_with(b"\0asm") {
                " (it is a core module; wrap it with `wasm-tools component new`)"
            } else {
                ""
            }
        );
    }
    let content_hash = sha256_hex(&bytes);
    let version = sha256_hex(format!("{content_hash}\n{}", sha256_hex(&manifest_text)).as_bytes())[..12].to_owned();
    let (component, cache_use) = cache
        .component(executor.engine(), &bytes, &content_hash)
        .with_context(|| {
            format!(
                "{}: cannot compile {}",
                manifest_path.display(),
                manifest.component.display()
            )
        })?;
    let pre = executor
        .prepare(&component)
        .with_context(|| format!("{}: {}", manifest_path.display(), manifest.component.display()))?;
    files::check(&manifest)?;
    if manifest.limits.fuel.is_some() && !executor.fuel() {
        bail!(
            "{}: limits.fuel needs fuel metering, which is off: start the runner with --fuel (it slows every plugin by 10–25%)",
            manifest_path.display()
        );
    }
    let slots = manifest
        .limits
        .concurrency
        .map(|n| Arc::new(Semaphore::new(n as usize)));
    let http_allow = Arc::new(manifest.http_allow.clone());
    let name = manifest
        .root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| manifest.root.display().to_string());
    Ok(Plugin {
        name,
        version,
        manifest,
        cache: cache_use,
        load_time: started.elapsed(),
        http_allow,
        http_stats: Arc::new(HttpStats::default()),
        slots,
        pre,
    })
}

/// Component binaries start with `\0asm` and the component layer/version
/// (`0d 00 01 00`); core modules have `01 00 00 00` there.
fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..4] == b"\0asm" && bytes[4..8] == [0x0d, 0x00, 0x01, 0x00]
}
