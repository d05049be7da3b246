//! Hot reload: watch the plugins directory, swap in new plugin versions.
//!
//! The live catalog is an [`ArcSwap`]: every job takes the current snapshot
//! when the manager takes it from the queue and keeps the `Arc<Plugin>` it
//! finds, so jobs in flight finish on the version they started with while
//! later jobs get the new one, and no job waits for a reload.
//!
//! Changes are seen through `notify` (inotify on Linux), one non-recursive
//! watch on the plugins directory and one per plugin directory (and on the
//! directory of a component kept in a subdirectory), so a plugin writing
//! into its own `data/` never triggers anything. Events are debounced per
//! plugin:
//! - a rename into place, a closed-after-write file, a removal: rescan
//!   after [`SETTLE_DONE`];
//! - a file being written (data modified, no close yet): wait until it has
//!   been quiet for [`SETTLE_WRITING`], so a slow copy is not loaded half
//!   written;
//! - a version that fails to load while its files changed within the last
//!   [`SETTLE_WRITING`] is tried again later instead of being reported, so
//!   an editor's or a copy's intermediate state never produces an error.
//!
//! The directory is used in its absolute form ([`absolute_dir`]): notify
//! reports absolute paths whatever form the watch was given in, so
//! `--plugins ./plugins` and `--plugins .` must be compared as absolute
//! paths too. The reloader logs once, at start, what it watches.
//!
//! Rescans run on the blocking pool (compiling is CPU-heavy), one at a
//! time. An unchanged version (same content hash) is a no-op. A version that
//! does not load is logged with the file and the reason, and the previous
//! version keeps serving. `SIGHUP` rescans every plugin. When the watches
//! are first set up, plugins whose files changed since the catalog's load
//! began are rescanned: a deploy during start-up, between the load and the
//! watches, would otherwise go unseen until the next change or `SIGHUP`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::cron::PluginSchedules;
use crate::metrics::Metrics;
use crate::plugin::catalog::{Change, absolute_dir, plugin_roots};
use crate::plugin::{Catalog, CompileCache, MANIFEST_FILE};
use crate::sandbox::Executor;

/// The catalog every job looks its plugin up in; swapped on reload.
pub(crate) type LiveCatalog = Arc<ArcSwap<Catalog>>;

/// Quiet time after a change that completes a file (rename, close after
/// write, removal) before the plugin is rescanned: lets a component and its
/// manifest renamed together land in one reload.
pub(crate) const SETTLE_DONE: Duration = Duration::from_millis(50);
/// Quiet time after a write to a file still open for writing.
pub(crate) const SETTLE_WRITING: Duration = Duration::from_secs(1);

/// What woke the reload loop.
enum Next {
    Stop,
    Event(Option<notify::Result<notify::Event>>),
    Hangup,
    Due,
}

/// Watches `dir` and keeps `live` current.
pub(crate) struct Reloader {
    dir: PathBuf,
    executor: Arc<Executor>,
    cache: CompileCache,
    live: LiveCatalog,
    served: Option<mpsc::UnboundedSender<Vec<String>>>,
    /// One per shard's cron poller.
    schedules: Vec<mpsc::UnboundedSender<PluginSchedules>>,
    metrics: Option<Arc<Metrics>>,
    /// One per shard's heartbeat.
    changed: Vec<Arc<tokio::sync::Notify>>,
}

impl Reloader {
    /// A reloader for the plugins in `dir`, compiled by `executor`. A
    /// relative `dir` is made absolute (against the current directory, as
    /// the catalog does): the watcher reports absolute paths, and a
    /// relative one would match none of them.
    pub(crate) fn new(dir: PathBuf, executor: Arc<Executor>, cache: CompileCache, live: LiveCatalog) -> Self {
        let dir = absolute_dir(&dir).unwrap_or(dir);
        Self {
            dir,
            executor,
            cache,
            live,
            served: None,
            schedules: Vec::new(),
            metrics: None,
            changed: Vec::new(),
        }
    }

    /// Counts reloads by outcome in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Sends the classes a reload starts serving (that no plugin served
    /// before) to `served`, so jobs waiting for them can be released.
    pub(crate) fn on_new_classes(mut self, served: mpsc::UnboundedSender<Vec<String>>) -> Self {
        self.served = Some(served);
        self
    }

    /// Notifies `changed` after every reload that changed something (the
    /// heartbeat then publishes the new catalog at once); each call adds
    /// one.
    pub(crate) fn on_change(mut self, changed: Arc<tokio::sync::Notify>) -> Self {
        self.changed.push(changed);
        self
    }

    /// Sends each loaded or removed plugin's schedules to `schedules` (the
    /// cron poller registers them in Redis); each call adds one.
    pub(crate) fn on_schedules(mut self, schedules: mpsc::UnboundedSender<PluginSchedules>) -> Self {
        self.schedules.push(schedules);
        self
    }

    /// Watches until `stop`. Without a working watcher (e.g. the
    /// inotify watch limit is reached) it logs why and still rescans on
    /// `SIGHUP`.
    pub(crate) async fn run(self, stop: tokio_util::sync::CancellationToken) {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut watcher = match notify::recommended_watcher(move |event| {
            let _ = events_tx.send(event);
        }) {
            Ok(watcher) => Some(watcher),
            Err(err) => {
                tracing::error!(dir = %self.dir.display(), "cannot watch the plugins directory: {err}; hot reload is off (SIGHUP still rescans)");
                None
            }
        };
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(hup) => Some(hup),
            Err(err) => {
                tracing::warn!("cannot install the SIGHUP handler: {err}");
                None
            }
        };
        let mut watched = BTreeSet::new();
        if let Some(watcher) = watcher.as_mut() {
            let _ = self.update_watches(watcher, &mut watched);
            if watched.contains(&self.dir) {
                tracing::info!(
                    dir = %self.dir.display(),
                    directories = watched.len(),
                    "hot reload: watching the plugins directory and each plugin's directory"
                );
            } else {
                tracing::error!(dir = %self.dir.display(), "hot reload is off: the plugins directory cannot be watched (SIGHUP still rescans)");
            }
        }
        // A plugin replaced between the catalog's load and the watches
        // above was seen by neither: rescan what changed since the load
        // began (a rescan of an unchanged plugin changes nothing).
        let mut pending: BTreeMap<PathBuf, Instant> = BTreeMap::new();
        if let Some(since) = self.live.load().scanned_at() {
            let now = Instant::now();
            for root in self.all_roots().into_iter().filter(|r| self.changed_since(r, since)) {
                pending.insert(root, now);
            }
        }
        loop {
            let next_due = pending.values().min().copied();
            let sleep = async {
                match next_due {
                    Some(due) => tokio::time::sleep_until(due.into()).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                () = stop.cancelled() => Next::Stop,
                event = events.recv(), if watcher.is_some() => Next::Event(event),
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => Next::Hangup,
                () = sleep => Next::Due,
            };
            match next {
                Next::Stop => return,
                Next::Event(Some(Ok(event))) => self.note(&event, &mut pending),
                Next::Event(Some(Err(err))) => tracing::warn!(dir = %self.dir.display(), "plugin watcher: {err}"),
                Next::Event(None) => watcher = None,
                Next::Hangup => {
                    tracing::info!("SIGHUP: rescanning every plugin");
                    // Watch anew: a re-pointed symlink (the plugins
                    // directory or a plugin's) is followed from now on.
                    if let Some(watcher) = watcher.as_mut() {
                        for path in std::mem::take(&mut watched) {
                            let _ = watcher.unwatch(&path);
                        }
                        let _ = self.update_watches(watcher, &mut watched);
                    }
                    let now = Instant::now();
                    for root in self.all_roots() {
                        pending.insert(root, now);
                    }
                }
                Next::Due => {
                    let now = Instant::now();
                    let due: Vec<PathBuf> = pending
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(root, _)| root.clone())
                        .collect();
                    for root in due {
                        pending.remove(&root);
                        if let Some(retry_at) = self.rescan(&root).await {
                            pending.insert(root, retry_at);
                        }
                    }
                    if let Some(watcher) = watcher.as_mut() {
                        for path in self.update_watches(watcher, &mut watched) {
                            if let Some(root) = self.relevant_root(&path) {
                                pending.entry(root).or_insert_with(|| Instant::now() + SETTLE_DONE);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Records what `event` means for the plugins it touches.
    fn note(&self, event: &notify::Event, pending: &mut BTreeMap<PathBuf, Instant>) {
        let settle = match event.kind {
            // Our own reads (and anyone's) open and close files.
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => SETTLE_DONE,
            EventKind::Access(_) => return,
            EventKind::Modify(ModifyKind::Data(_)) | EventKind::Create(CreateKind::File | CreateKind::Any) => {
                SETTLE_WRITING
            }
            _ => SETTLE_DONE,
        };
        for path in &event.paths {
            if let Some(root) = self.relevant_root(path) {
                // The latest event decides: a close after writes shortens the wait.
                pending.insert(root, Instant::now() + settle);
            }
        }
    }

    /// The plugin directory a change to `path` may affect, if any: the
    /// plugin directory itself, its manifest, a `.wasm` file, or the file
    /// its manifest names as component. Anything else (data files, editor
    /// swap files) is ignored.
    fn relevant_root(&self, path: &Path) -> Option<PathBuf> {
        let single = self.dir.join(MANIFEST_FILE).is_file() || path == self.dir.join(MANIFEST_FILE);
        let relative = path.strip_prefix(&self.dir).ok()?;
        let mut parts = relative.components();
        let root = if single {
            self.dir.clone()
        } else {
            let first = parts.next()?.as_os_str().to_string_lossy().into_owned();
            if first.starts_with('.') {
                return None;
            }
            let root = self.dir.join(first);
            if parts.clone().next().is_none() {
                // The plugin directory itself appeared, went or was renamed.
                return Some(root);
            }
            root
        };
        let name = path.file_name()?.to_string_lossy();
        let component = self.live.load().plugin_at(&root).map(|p| p.manifest.component.clone());
        if name == MANIFEST_FILE || name.ends_with(".wasm") || component.as_deref() == Some(path) {
            Some(root)
        } else {
            None
        }
    }

    /// Whether the plugin directory `root`, its manifest, its loaded
    /// component or that component's directory was modified at or after
    /// `since` (a rename into a directory changes the directory's time, so
    /// a component deployed with an old mtime is seen too). Unreadable
    /// times count as changed.
    fn changed_since(&self, root: &Path, since: SystemTime) -> bool {
        let mut paths = vec![root.to_path_buf(), root.join(MANIFEST_FILE)];
        if let Some(plugin) = self.live.load().plugin_at(root) {
            paths.push(plugin.manifest.component.clone());
            paths.extend(plugin.manifest.component.parent().map(Path::to_path_buf));
        }
        paths
            .iter()
            .any(|path| match std::fs::metadata(path).and_then(|m| m.modified()) {
                Ok(modified) => modified >= since,
                Err(err) => err.kind() != std::io::ErrorKind::NotFound || path == root,
            })
    }

    /// Every plugin directory on disk or loaded (a loaded one may be gone).
    fn all_roots(&self) -> BTreeSet<PathBuf> {
        let mut roots: BTreeSet<PathBuf> = plugin_roots(&self.dir).unwrap_or_default().into_iter().collect();
        let catalog = self.live.load();
        roots.extend(catalog.plugins().iter().map(|p| p.manifest.root.clone()));
        roots.extend(
            catalog
                .broken()
                .iter()
                .filter_map(|b| b.manifest.parent().map(Path::to_path_buf)),
        );
        roots
    }

    /// Watches the plugins directory, every plugin directory and every
    /// component's directory (non-recursively), dropping watches on what is
    /// gone. Returns the directories newly watched: files written into them
    /// before the watch existed were not seen, so they need a rescan.
    fn update_watches(
        &self,
        watcher: &mut notify::RecommendedWatcher,
        watched: &mut BTreeSet<PathBuf>,
    ) -> Vec<PathBuf> {
        let mut added = Vec::new();
        let mut wanted: BTreeSet<PathBuf> = BTreeSet::from([self.dir.clone()]);
        wanted.extend(plugin_roots(&self.dir).unwrap_or_default());
        for plugin in self.live.load().plugins() {
            if let Some(parent) = plugin.manifest.component.parent() {
                wanted.insert(parent.to_path_buf());
            }
        }
        for gone in watched.difference(&wanted).cloned().collect::<Vec<_>>() {
            let _ = watcher.unwatch(&gone);
            watched.remove(&gone);
        }
        for path in wanted {
            if watched.contains(&path) || !path.is_dir() {
                continue;
            }
            match watcher.watch(&path, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    watched.insert(path.clone());
                    added.push(path);
                }
                Err(err) => tracing::warn!(path = %path.display(), "cannot watch for plugin changes: {err}"),
            }
        }
        added
    }

    /// Reloads the plugin in `root` and swaps the result in. Returns when to
    /// try again if the files are still being written.
    async fn rescan(&self, root: &Path) -> Option<Instant> {
        let current = self.live.load_full();
        let executor = self.executor.clone();
        let cache = self.cache.clone();
        let path = root.to_path_buf();
        let rescanned = tokio::task::spawn_blocking(move || current.rescan(&path, &executor, &cache)).await;
        let (next, change) = match rescanned {
            Ok(result) => result,
            Err(err) => {
                tracing::error!(plugin = %root.display(), "reloading the plugin panicked: {err}");
                return None;
            }
        };
        if let Change::Rejected { .. } = &change
            && let Some(changed) = last_change(root)
            && let Ok(age) = SystemTime::now().duration_since(changed)
            && age < SETTLE_WRITING
        {
            tracing::debug!(plugin = %root.display(), "files still changing; trying again");
            return Some(Instant::now() + SETTLE_WRITING - age);
        }
        self.live.store(Arc::new(next));
        report(&change);
        if !matches!(change, Change::Unchanged) {
            for changed in &self.changed {
                changed.notify_one();
            }
        }
        if let Some(metrics) = &self.metrics {
            let gauges = &metrics.process;
            let counter = match &change {
                Change::Unchanged => None,
                Change::Added(_) => Some(&gauges.reloads_added),
                Change::Replaced { .. } => Some(&gauges.reloads_replaced),
                Change::Removed(_) => Some(&gauges.reloads_removed),
                Change::Rejected { .. } => Some(&gauges.reloads_rejected),
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let new_classes: Vec<String> = match &change {
            Change::Added(plugin) => plugin.manifest.classes.clone(),
            Change::Replaced { old, new } => new
                .manifest
                .classes
                .iter()
                .filter(|c| !old.manifest.classes.contains(c))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        if !new_classes.is_empty()
            && let Some(served) = &self.served
        {
            let _ = served.send(new_classes);
        }
        if !self.schedules.is_empty() {
            let event = match &change {
                Change::Added(plugin) | Change::Replaced { new: plugin, .. } => Some(PluginSchedules::Loaded {
                    plugin: plugin.name.clone(),
                    schedules: plugin.manifest.schedules.clone(),
                }),
                Change::Removed(plugin) => Some(PluginSchedules::Removed {
                    plugin: plugin.name.clone(),
                }),
                Change::Unchanged | Change::Rejected { .. } => None,
            };
            if let Some(event) = event {
                for schedules in &self.schedules {
                    let _ = schedules.send(event.clone());
                }
            }
        }
        None
    }
}

/// Logs what a rescan did.
fn report(change: &Change) {
    match change {
        Change::Unchanged => {}
        Change::Added(plugin) => {
            tracing::info!(plugin = %plugin.name, version = %plugin.version, classes = ?plugin.manifest.classes, "plugin added")
        }
        Change::Replaced { old, new } => tracing::info!(
            plugin = %new.name,
            version = %new.version,
            previous = %old.version,
            classes = ?new.manifest.classes,
            "plugin replaced: jobs already running finish on the previous version"
        ),
        Change::Removed(plugin) => tracing::info!(
            plugin = %plugin.name,
            version = %plugin.version,
            "plugin removed: jobs of its classes will retry until a plugin serves them again"
        ),
        Change::Rejected { error, kept } => match kept {
            Some(kept) => tracing::error!(
                plugin = %kept.name,
                version = %kept.version,
                "new version refused, the previous one keeps serving: {error}"
            ),
            // Scaffolded, its first build not done: it loads when it is.
            None if error.contains(crate::plugin::catalog::NOT_BUILT) => tracing::info!("plugin waiting: {error}"),
            None => tracing::error!("plugin refused: {error}"),
        },
    }
}

/// When the manifest or any `.wasm` file in `root` last changed.
fn last_change(root: &Path) -> Option<SystemTime> {
    let entries = std::fs::read_dir(root).ok()?;
    entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name == MANIFEST_FILE || name.ends_with(".wasm")
        })
        .filter_map(|entry| entry.metadata().and_then(|m| m.modified()).ok())
        .max()
}

/// Loads the catalog for `run`: [`Catalog::load`] wrapped for swapping.
pub(crate) fn live(catalog: Catalog) -> LiveCatalog {
    Arc::new(ArcSwap::from_pointee(catalog))
}
