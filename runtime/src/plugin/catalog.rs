//! The catalog: which plugin serves which job class.
//!
//! Built by scanning a plugins directory. A plugin that fails to load (bad
//! manifest, missing or invalid component, wrong world, a class already
//! served by another plugin) is recorded in [`Catalog::broken`] with the
//! reason, and every other plugin still loads: one bad plugin never takes
//! the others down.
//!
//! A catalog is an immutable snapshot. Hot reload ([`crate::runner::reloader`])
//! builds the next snapshot with [`Catalog::rescan`], which reloads one
//! plugin directory and returns a new catalog plus what changed; jobs hold
//! the `Arc<Plugin>` they started with, so they finish on that version.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result, bail};

use super::cache::{CacheUse, CompileCache, sha256_hex};
use super::describe::{self, Described, History};
use super::dev_sources::{self, DevSources};
pub use super::loaded::{Broken, Change, Plugin};
use super::manifest::plugin_name;
use super::manifest::{MANIFEST_FILE, Manifest};
use tokio::sync::Semaphore;

use crate::host::disk;
use crate::host::files;
use crate::sandbox::{Executor, JobLimits, Loaded};

/// Loaded plugins by job class, plus the ones that were refused.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    plugins: Vec<Arc<Plugin>>,
    by_class: BTreeMap<String, Arc<Plugin>>,
    broken: Vec<Broken>,
    /// The directory [`Catalog::load`] scanned: read-write grants may not
    /// reach it, nor other plugins' directories in it.
    plugins_dir: Option<PathBuf>,
    /// When [`Catalog::load`] began reading the directory: a file changed
    /// since may have been read before or after its change.
    scanned_at: Option<SystemTime>,
    /// The last loads and reloads (for the heartbeat's report).
    history: History,
}

impl Catalog {
    /// Loads every plugin under `dir`: `dir` itself if it holds a
    /// `wasmjobs.toml`, otherwise each immediate subdirectory that does.
    /// Fails only if `dir` cannot be read; broken plugins are collected.
    pub fn load(dir: &Path, executor: &Executor, cache: &CompileCache) -> Result<Self> {
        Self::load_serving(dir, executor, cache, None)
    }

    /// [`Catalog::load`], but with `class` given, only the plugins whose
    /// manifests list it are compiled (`wasmjobs exec` runs one job: the
    /// rest need no compile); the others are left out, not broken.
    pub fn load_serving(dir: &Path, executor: &Executor, cache: &CompileCache, class: Option<&str>) -> Result<Self> {
        let dir = &absolute_dir(dir)?;
        let mut catalog = Catalog {
            plugins_dir: Some(dir.to_path_buf()),
            scanned_at: Some(SystemTime::now()),
            ..Catalog::default()
        };
        let protected = catalog.protected(cache);
        for manifest in find_manifests(dir)? {
            let source = match read_plugin(&manifest) {
                Ok(source) if class.is_some_and(|class| !source.manifest.classes.iter().any(|c| c == class)) => {
                    continue;
                }
                other => other,
            };
            match source.and_then(|source| build_plugin(source, executor, cache, &protected)) {
                Ok(plugin) => {
                    let plugin = Arc::new(plugin);
                    match catalog.insert(plugin.clone()) {
                        Ok(()) => catalog.history.loaded(&plugin),
                        Err(broken) => {
                            catalog.history.refused(&broken);
                            catalog.broken.push(broken);
                        }
                    }
                }
                Err(err) => {
                    let broken = Broken {
                        manifest,
                        error: format!("{err:#}"),
                    };
                    catalog.history.refused(&broken);
                    catalog.broken.push(broken);
                }
            }
        }
        Ok(catalog)
    }

    /// What this catalog serves, refused and did lately, as the heartbeat
    /// publishes it.
    pub fn describe(&self) -> Described {
        describe::describe(&self.plugins, &self.broken, &self.history)
    }

    /// Reloads the plugin in directory `root` (whether or not it was loaded
    /// before) and returns the catalog with the result, and what changed.
    /// A version that does not load is recorded as broken while the version
    /// already loaded, if any, keeps serving. The change is recorded in the
    /// new catalog's history. Blocking (reads, compiles).
    pub fn rescan(&self, root: &Path, executor: &Executor, cache: &CompileCache) -> (Catalog, Change) {
        let (mut next, change) = self.rescan_unrecorded(root, executor, cache);
        next.history.changed(root, &change);
        (next, change)
    }

    fn rescan_unrecorded(&self, root: &Path, executor: &Executor, cache: &CompileCache) -> (Catalog, Change) {
        let manifest = root.join(MANIFEST_FILE);
        let old = self.plugin_at(root).cloned();
        if !manifest.is_file() {
            let mut next = self.clone();
            next.remove(root);
            return match old {
                Some(old) => (next, Change::Removed(old)),
                None => (next, Change::Unchanged),
            };
        }
        let built = read_plugin(&manifest).and_then(|source| match &old {
            Some(old) if old.version == source.version => Ok(None),
            _ => build_plugin(source, executor, cache, &self.protected(cache)).map(Some),
        });
        let mut next = self.clone();
        let plugin = match built {
            Ok(None) => {
                next.broken.retain(|b| b.manifest != manifest);
                return (next, Change::Unchanged);
            }
            Ok(Some(mut plugin)) => {
                if let Some(old) = &old {
                    plugin.inherit(old);
                }
                Arc::new(plugin)
            }
            Err(err) => {
                let error = format!("{err:#}");
                next.set_broken(Broken {
                    manifest,
                    error: error.clone(),
                });
                return (next, Change::Rejected { error, kept: old });
            }
        };
        next.remove_plugin(root);
        match next.insert(plugin.clone()) {
            Ok(()) => {
                next.broken.retain(|b| b.manifest != manifest);
                let change = match old {
                    Some(old) => Change::Replaced { old, new: plugin },
                    None => Change::Added(plugin),
                };
                (next, change)
            }
            Err(broken) => {
                let error = broken.error.clone();
                let mut kept = self.clone();
                kept.set_broken(broken);
                (kept, Change::Rejected { error, kept: old })
            }
        }
    }

    /// What read-write grants must keep clear of, besides each plugin's own
    /// files: the plugins directory and the compile cache's data directory.
    fn protected(&self, cache: &CompileCache) -> files::Protected {
        files::Protected {
            plugins: self.plugins_dir.clone(),
            cache: cache.dir().map(Path::to_path_buf),
        }
    }

    /// Adds `plugin`, unless another plugin already serves one of its classes.
    fn insert(&mut self, plugin: Arc<Plugin>) -> Result<(), Broken> {
        if let Some((class, other)) = plugin
            .manifest
            .classes
            .iter()
            .find_map(|c| self.by_class.get(c).map(|p| (c, p)))
        {
            return Err(Broken {
                manifest: plugin.manifest.path.clone(),
                error: format!(
                    "{}: class {class:?} is already served by {}",
                    plugin.manifest.path.display(),
                    other.manifest.path.display()
                ),
            });
        }
        for class in &plugin.manifest.classes {
            self.by_class.insert(class.clone(), plugin.clone());
        }
        self.plugins.push(plugin);
        self.plugins.sort_by(|a, b| a.manifest.root.cmp(&b.manifest.root));
        Ok(())
    }

    /// Drops the plugin loaded from `root`, if any.
    fn remove_plugin(&mut self, root: &Path) {
        self.plugins.retain(|p| p.manifest.root != root);
        self.by_class.retain(|_, p| p.manifest.root != root);
    }

    /// Forgets everything about `root`.
    fn remove(&mut self, root: &Path) {
        self.remove_plugin(root);
        self.broken.retain(|b| b.manifest.parent() != Some(root));
    }

    /// Records `broken`, replacing an earlier entry for the same manifest.
    fn set_broken(&mut self, broken: Broken) {
        self.broken.retain(|b| b.manifest != broken.manifest);
        self.broken.push(broken);
    }

    /// The plugin loaded from directory `root`.
    pub fn plugin_at(&self, root: &Path) -> Option<&Arc<Plugin>> {
        self.plugins.iter().find(|p| p.manifest.root == root)
    }

    /// When [`Catalog::load`] began reading the plugins directory (`None`
    /// for a catalog not built by `load`).
    pub fn scanned_at(&self) -> Option<SystemTime> {
        self.scanned_at
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
    Ok(plugin_roots(dir)?
        .into_iter()
        .map(|root| root.join(MANIFEST_FILE))
        .filter(|manifest| manifest.is_file())
        .collect())
}

/// `dir` as an absolute path, without resolving symlinks (so a symlinked
/// plugins directory keeps its name, and a re-pointed symlink is followed
/// by a rescan): the one form of the plugins directory every part uses.
/// The watcher reports absolute paths, and a plugin is named after its
/// directory, which `.` does not have.
pub fn absolute_dir(dir: &Path) -> Result<PathBuf> {
    std::path::absolute(dir).with_context(|| format!("cannot resolve the plugins directory {}", dir.display()))
}

/// The directories under `dir` that are (or may become) plugins: `dir`
/// itself if it holds a `wasmjobs.toml`, else each immediate subdirectory
/// whose name does not start with `.` (hidden directories are staging
/// areas for atomic deploys), sorted.
pub fn plugin_roots(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join(MANIFEST_FILE).is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read plugins directory {}", dir.display()))?;
    let mut roots = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read plugins directory {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with('.') || !entry.path().is_dir() {
            continue;
        }
        roots.push(entry.path());
    }
    roots.sort();
    Ok(roots)
}

/// A plugin's files, read but not compiled.
struct Source {
    started: Instant,
    manifest: Manifest,
    /// The component as the engine compiles it (without the sources a
    /// development build carries).
    bytes: Vec<u8>,
    /// The SHA-256 of `bytes`: the compile cache's key.
    content_hash: String,
    /// Of the component file and the manifest together.
    version: String,
    /// The sources of a development build ([`dev_sources`]).
    dev: Option<DevSources>,
}

/// What a plugin whose component does not exist yet (just scaffolded,
/// its first build under way) is refused with: not an error to shout.
pub(crate) const NOT_BUILT: &str = "is not built yet";

/// The job classes the manifests under `dir` list, sorted, read without
/// compiling anything (a manifest that cannot be read lists none).
pub fn listed_classes(dir: &Path) -> Vec<String> {
    let mut classes: Vec<String> = find_manifests(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|path| {
            let text = std::fs::read(path).ok()?;
            Manifest::parse(path, &String::from_utf8_lossy(&text)).ok()
        })
        .flat_map(|manifest| manifest.classes)
        .collect();
    classes.sort();
    classes.dedup();
    classes
}

/// Reads and checks the manifest and component of one plugin, and computes
/// its version: cheap next to compiling, so an unchanged plugin is skipped.
fn read_plugin(manifest_path: &Path) -> Result<Source> {
    let started = Instant::now();
    let manifest_text =
        std::fs::read(manifest_path).with_context(|| format!("{}: cannot read manifest", manifest_path.display()))?;
    let manifest = Manifest::parse(manifest_path, &String::from_utf8_lossy(&manifest_text))?;
    let bytes = match std::fs::read(&manifest.component) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
            "{}: component {} {NOT_BUILT}: `wasmjobs build {}` builds it, and the plugin loads once it exists",
            manifest_path.display(),
            manifest.component.display(),
            manifest_path.parent().unwrap_or(Path::new(".")).display()
        ),
        Err(err) => {
            return Err(err).with_context(|| {
                format!(
                    "{}: cannot read component {}",
                    manifest_path.display(),
                    manifest.component.display()
                )
            });
        }
    };
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
    let file_hash = sha256_hex(&bytes);
    let version = sha256_hex(format!("{file_hash}\n{}", sha256_hex(&manifest_text)).as_bytes())[..12].to_owned();
    let (compiled, dev) = dev_sources::split(&bytes)
        .with_context(|| format!("{}: {}", manifest_path.display(), manifest.component.display()))?;
    let (bytes, content_hash) = match compiled {
        Cow::Borrowed(_) => (bytes, file_hash),
        Cow::Owned(compiled) => {
            let hash = sha256_hex(&compiled);
            (compiled, hash)
        }
    };
    Ok(Source {
        started,
        manifest,
        bytes,
        content_hash,
        version,
        dev,
    })
}

/// Checks that `bytes` is a component of the job world (`async-plugin` if
/// `concurrent`) that this host can link (compiling it through `cache`, so
/// a runner using the same cache then loads it at once): what `wasmjobs
/// build` asks of its result.
pub fn check_component(
    executor: &Executor,
    cache: &CompileCache,
    bytes: &[u8],
    label: &str,
    concurrent: bool,
) -> Result<CacheUse> {
    if !is_component(bytes) {
        bail!("not a WebAssembly component");
    }
    let (bytes, _) = dev_sources::split(bytes)?;
    let engine = executor.engine_for(false, concurrent).unwrap_or(executor.engine());
    let (component, cache_use) = cache.component(engine, &bytes, &sha256_hex(&bytes), label)?;
    executor.prepare(&component)?;
    Ok(cache_use)
}

/// Compiles (or takes from the cache), checks and pre-links one plugin.
/// The granted directories are checked and opened first: a plugin whose
/// grants are refused is not compiled.
fn build_plugin(
    source: Source,
    executor: &Executor,
    cache: &CompileCache,
    protected: &files::Protected,
) -> Result<Plugin> {
    let Source {
        started,
        mut manifest,
        bytes,
        content_hash,
        version,
        dev,
    } = source;
    let manifest_path = manifest.path.clone();
    super::caps::check(&manifest, &executor.limits(), executor.disk(), executor.protected_env())?;
    let dev_sources = match &dev {
        Some(sources) => Some(grant_dev_sources(&mut manifest, cache, sources)?),
        None => None,
    };
    let handles = files::check(manifest.file_grants(), protected)?;
    // Refused before compiling: no artifact for a plugin that cannot run.
    let concurrent = manifest.instances.concurrent.is_some();
    if concurrent && manifest.limits.fuel.is_some() {
        bail!(
            "{}: limits.fuel cannot be combined with [instances] concurrent: fuel is counted per instance, and the jobs running in one would share one budget",
            manifest_path.display()
        );
    }
    let Some(engine) = executor.engine_for(manifest.limits.fuel.is_some(), concurrent) else {
        bail!(
            "{}: limits.fuel needs fuel metering, which is off: start the runner with --fuel (only plugins that set limits.fuel are metered; it slows them by 10–25%)",
            manifest_path.display()
        );
    };
    let label = manifest.component_name();
    let (component, cache_use) = cache
        .component(engine, &bytes, &content_hash, &label)
        .with_context(|| {
            format!(
                "{}: cannot compile {}",
                manifest_path.display(),
                manifest.component.display()
            )
        })
        .map_err(|err| match concurrent {
            // The plain engine has no component-model async: an
            // async-plugin component (an async perform, or a blocking one
            // calling async-http / async-sql) fails to parse there.
            false if format!("{err:#}").contains("component model async") => err.context(format!(
                "{}: this component uses component-model async (the async-plugin world: an async perform, or the async-http / async-sql imports), which runs only with [instances] concurrent = K in its manifest",
                manifest_path.display()
            )),
            _ => err,
        })?;
    let pre = executor
        .prepare(&component)
        .with_context(|| format!("{}: {}", manifest_path.display(), manifest.component.display()))?;
    let slots = manifest
        .limits
        .concurrency
        .map(|n| Arc::new(Semaphore::new(n as usize)));
    let name = plugin_name(&manifest.root);
    let disk = disk::budget(manifest.file_grants(), manifest.limits.disk, &name, executor.disk())?.map(Arc::new);
    let grants = manifest.grants(handles, disk);
    let limits = JobLimits {
        memory: manifest.limits.memory,
        timeout: manifest.limits.timeout,
        fuel: manifest.limits.fuel,
    };
    let loaded = Loaded::new(name.clone(), version.clone(), grants, limits, manifest.instances, pre);
    Ok(Plugin {
        name,
        version,
        manifest,
        cache: cache_use,
        load_time: started.elapsed(),
        slots,
        loaded,
        _dev_sources: dev_sources,
    })
}

/// Grants a development build the sources it carries: unpacked into the
/// compile cache's directory, read-only at [`dev_sources::GUEST_DIR`]
/// (added to the manifest's grants, so they are opened and shown like
/// any other).
fn grant_dev_sources(
    manifest: &mut Manifest,
    cache: &CompileCache,
    sources: &DevSources,
) -> Result<dev_sources::InUse> {
    let display = manifest.path.display().to_string();
    let reserved = Path::new(dev_sources::GUEST_DIR).parent().unwrap_or(Path::new("/"));
    if let Some(clash) = manifest
        .files
        .iter()
        .find(|f| Path::new(&f.guest).starts_with(reserved))
    {
        bail!(
            "{display}: files: {} is where a development build (`wasmjobs build --dev`) sees its own sources; grant another guest path",
            clash.guest
        );
    }
    let Some(dir) = cache.dir() else {
        bail!(
            "{display}: a development build (`wasmjobs build --dev`) needs the compile cache, where its sources are unpacked"
        );
    };
    let (host, held) = dev_sources::unpack(dir, sources)
        .with_context(|| format!("{display}: cannot unpack the sources of this development build"))?;
    tracing::warn!(
        plugin = %manifest.plugin_name(),
        "a development build (`wasmjobs build --dev`): its {} Python file(s) are imported when an instance starts its first job; build without --dev for production",
        sources.files.len()
    );
    manifest.files.push(files::Preopen {
        host,
        guest: dev_sources::GUEST_DIR.to_owned(),
        mode: files::Mode::ReadOnly,
        outside: true,
    });
    Ok(held)
}

impl Plugin {
    /// Carries per-plugin state over from the version this one replaces:
    /// the HTTP counters, the concurrency slots when the limit is
    /// unchanged (so old and new versions together stay within it), and
    /// the disk budget when it covers the same directories (so the old
    /// version's jobs still running stay counted), with the new limit.
    fn inherit(&mut self, old: &Plugin) {
        let (grants, old_grants) = (&mut self.loaded.grants, &old.loaded.grants);
        grants.http_stats = old_grants.http_stats.clone();
        if let (Some(new), Some(old)) = (&grants.disk, &old_grants.disk)
            && new.dirs() == old.dirs()
        {
            old.set_limit(new.limit());
            grants.disk = Some(old.clone());
        }
        if self.manifest.limits.concurrency == old.manifest.limits.concurrency {
            self.slots = old.slots.clone();
        }
    }
}

/// Component binaries start with `\0asm` and the component layer/version
/// (`0d 00 01 00`); core modules have `01 00 00 00` there.
fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..4] == b"\0asm" && bytes[4..8] == [0x0d, 0x00, 0x01, 0x00]
}
