//! What a runner tells the cluster about its plugins: for each plugin its
//! version, classes, world, grants, limits and schedules; the plugins it
//! refused and why; and the last [`HISTORY`] loads and reloads.
//!
//! The heartbeat writes a [`Described`] as JSON into the process hash
//! (field `plugins`) with every beat, so it expires with the process; the
//! dashboard's Plugins page merges the reports of every live process (a
//! rolling deploy shows both versions, each with the processes running it).
//! This module only builds and reads the value: it never touches Redis.
//!
//! Everything here is display text, built once from the validated manifest
//! (`64.0 MiB`, `api.internal:8080 (h2)`, `/data → data (rw)`). What a
//! reader gets back from Redis is hostile input like any other value there:
//! it is parsed leniently (unknown fields ignored) and rendered escaped.
//! Texts a plugin's files can make long (load errors) are cut to
//! [`MAX_TEXT`] characters and at most [`MAX_BROKEN`] refused plugins are
//! named, so a report stays a few kilobytes per plugin loaded.

use std::collections::VecDeque;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::loaded::{Broken, Change, Plugin};
use super::manifest::Mode;
use super::manifest::plugin_name;
use crate::size::mib;

/// Loads and reloads a catalog remembers (the oldest go first).
pub const HISTORY: usize = 20;
/// Longest error text in a report, in characters.
pub const MAX_TEXT: usize = 2_000;
/// Most refused plugins a report names one by one (then how many more).
pub const MAX_BROKEN: usize = 50;

/// One process's plugins, as published with its heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Described {
    /// The plugins loaded now.
    pub plugins: Vec<PluginView>,
    /// The plugins refused now, and why.
    pub broken: Vec<BrokenView>,
    /// The last loads and reloads, oldest first.
    pub history: Vec<Reload>,
}

/// One loaded plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginView {
    /// Its directory name.
    pub name: String,
    /// Its version id (content hash of component and manifest).
    pub version: String,
    /// The job classes it serves.
    pub classes: Vec<String>,
    /// The component file, relative to the plugin directory.
    pub component: String,
    /// The world it implements.
    pub world: String,
    /// How its code was loaded: `cached` or `compiled`.
    pub load: String,
    /// How long loading took, ms.
    pub load_ms: u64,
    /// What it may reach: `http`, `files`, `env` and `sql` grants.
    pub grants: Vec<Setting>,
    /// Its limits and instance policy, where they differ from the runner's.
    pub limits: Vec<Setting>,
    /// Its periodic jobs: `name: cron → class`.
    pub schedules: Vec<String>,
}

/// A named value: one grant or one limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Setting {
    /// What it is (`http`, `memory`, …).
    pub name: String,
    /// Its value, as text.
    pub value: String,
}

/// A plugin the runner refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokenView {
    /// Its directory name.
    pub plugin: String,
    /// Why, naming the file.
    pub error: String,
}

/// One load or reload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reload {
    /// When, epoch seconds.
    pub at: f64,
    /// The plugin's directory name.
    pub plugin: String,
    /// `loaded` (at start), `added`, `replaced`, `removed` or `rejected`.
    pub event: String,
    /// The version loaded (or removed; for `rejected`, the one kept).
    pub version: Option<String>,
    /// The version replaced.
    pub previous: Option<String>,
    /// Why a version was rejected.
    pub error: Option<String>,
}

/// The last [`HISTORY`] loads and reloads of a catalog.
#[derive(Debug, Clone, Default)]
pub(crate) struct History(VecDeque<Reload>);

impl History {
    /// Records a plugin loaded with the catalog.
    pub(crate) fn loaded(&mut self, plugin: &Plugin) {
        self.push(Reload {
            event: "loaded".into(),
            version: Some(plugin.version.clone()),
            ..Reload::new(&plugin.name)
        });
    }

    /// Records a plugin refused when the catalog loaded.
    pub(crate) fn refused(&mut self, broken: &Broken) {
        self.push(Reload {
            event: "rejected".into(),
            error: Some(cut(&broken.error)),
            ..Reload::new(&broken.plugin())
        });
    }

    /// Records what a rescan of the plugin in `root` did.
    pub(crate) fn changed(&mut self, root: &Path, change: &Change) {
        let reload = match change {
            Change::Unchanged => return,
            Change::Added(plugin) => Reload {
                event: "added".into(),
                version: Some(plugin.version.clone()),
                ..Reload::new(&plugin.name)
            },
            Change::Replaced { old, new } => Reload {
                event: "replaced".into(),
                version: Some(new.version.clone()),
                previous: Some(old.version.clone()),
                ..Reload::new(&new.name)
            },
            Change::Removed(plugin) => Reload {
                event: "removed".into(),
                version: Some(plugin.version.clone()),
                ..Reload::new(&plugin.name)
            },
            Change::Rejected { error, kept } => Reload {
                event: "rejected".into(),
                version: kept.as_ref().map(|p| p.version.clone()),
                error: Some(cut(error)),
                ..Reload::new(&plugin_name(root))
            },
        };
        // A plugin that stays broken is refused again at every rescan
        // (SIGHUP, a touch): one entry says it, and real loads stay in view.
        let repeated = reload.event == "rejected"
            && self
                .0
                .iter()
                .rev()
                .find(|e| e.plugin == reload.plugin)
                .is_some_and(|last| last.event == reload.event && last.error == reload.error);
        if !repeated {
            self.push(reload);
        }
    }

    fn push(&mut self, reload: Reload) {
        if self.0.len() == HISTORY {
            self.0.pop_front();
        }
        self.0.push_back(reload);
    }

    /// The events, oldest first.
    pub(crate) fn events(&self) -> impl Iterator<Item = &Reload> {
        self.0.iter()
    }
}

impl Reload {
    fn new(plugin: &str) -> Self {
        Self {
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            plugin: plugin.to_owned(),
            ..Self::default()
        }
    }
}

/// The report of `plugins`, `broken` and `history`.
pub(crate) fn describe<'a>(
    plugins: impl IntoIterator<Item = &'a std::sync::Arc<Plugin>>,
    broken: &[Broken],
    history: &History,
) -> Described {
    Described {
        plugins: plugins.into_iter().map(|p| view(p)).collect(),
        broken: broken
            .iter()
            .take(MAX_BROKEN)
            .map(|b| BrokenView {
                plugin: b.plugin(),
                error: cut(&b.error),
            })
            .chain((broken.len() > MAX_BROKEN).then(|| BrokenView {
                plugin: "…".into(),
                error: format!(
                    "{} more plugins refused (`wasmjobs plugins` lists them all)",
                    broken.len() - MAX_BROKEN
                ),
            }))
            .collect(),
        history: history.events().cloned().collect(),
    }
}

fn view(plugin: &Plugin) -> PluginView {
    let manifest = &plugin.manifest;
    let world = match manifest.instances.concurrent {
        Some(_) => crate::bindings::concurrent::WORLD,
        None => crate::bindings::WORLD,
    };
    PluginView {
        name: plugin.name.clone(),
        version: plugin.version.clone(),
        classes: manifest.classes.clone(),
        component: relative(&manifest.component, &manifest.root),
        world: world.to_owned(),
        load: plugin.cache.label().to_owned(),
        load_ms: plugin.load_time.as_millis() as u64,
        grants: grants(manifest),
        limits: limits(manifest),
        schedules: manifest
            .schedules
            .iter()
            .map(|s| format!("{}: {} ({}) → {}", s.name, s.cron.expression(), s.cron.zone(), s.class))
            .collect(),
    }
}

fn grants(manifest: &super::Manifest) -> Vec<Setting> {
    let mut grants = Vec::new();
    for (pattern, h2) in manifest.http_allow.rules() {
        let h2 = if h2 { " (h2)" } else { "" };
        grants.push(setting("http", format!("{pattern}{h2}")));
    }
    for preopen in &manifest.files {
        let mode = match preopen.mode {
            Mode::ReadOnly => "ro",
            Mode::ReadWrite => "rw",
        };
        let host = relative(&preopen.host, &manifest.root);
        grants.push(setting("files", format!("{} → {host} ({mode})", preopen.guest)));
    }
    for name in &manifest.env {
        grants.push(setting("env", name.clone()));
    }
    for name in &manifest.sql {
        let mode = if manifest.sql_read_only.contains(name) {
            "ro"
        } else {
            "rw"
        };
        grants.push(setting("sql", format!("{name} ({mode})")));
    }
    grants
}

fn limits(manifest: &super::Manifest) -> Vec<Setting> {
    let limits = &manifest.limits;
    let mut out = Vec::new();
    if let Some(memory) = limits.memory {
        out.push(setting("memory", mib(memory)));
    }
    if let Some(timeout) = limits.timeout {
        out.push(setting("timeout", humantime::format_duration(timeout).to_string()));
    }
    if let Some(concurrency) = limits.concurrency {
        out.push(setting("concurrency", format!("{concurrency} per process")));
    }
    if let Some(fuel) = limits.fuel {
        out.push(setting("fuel", fuel.to_string()));
    }
    if let Some(log) = &limits.log {
        out.push(setting("log", format!("{} lines, {} bytes", log.lines, log.bytes)));
    }
    if let Some(disk) = limits.disk {
        out.push(setting("disk", mib(usize::try_from(disk).unwrap_or(usize::MAX))));
    }
    if let Some(rate) = &manifest.cluster_limits.rate {
        out.push(setting("rate", format!("{rate} (cluster)")));
    }
    if let Some(per_key) = &manifest.cluster_limits.per_key {
        let mut parts = Vec::new();
        if let Some(rate) = &per_key.rate {
            parts.push(format!("rate {rate}"));
        }
        if let Some(concurrency) = per_key.concurrency {
            parts.push(format!("concurrency {concurrency}"));
        }
        out.push(setting(
            "per key",
            format!("{}: {} (cluster)", per_key.key, parts.join(", ")),
        ));
    }
    let instances = &manifest.instances;
    if let Some(concurrent) = instances.concurrent {
        out.push(setting("instances", format!("{concurrent} jobs at once per instance")));
    }
    if instances.reuse > 1 {
        out.push(setting(
            "reuse",
            format!(
                "{} jobs per instance, idle {}",
                instances.reuse,
                humantime::format_duration(instances.idle_timeout)
            ),
        ));
    }
    out
}

fn setting(name: &str, value: String) -> Setting {
    Setting {
        name: name.to_owned(),
        value,
    }
}

/// `path` relative to `root`, or whole when outside it.
fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// `text` cut to [`MAX_TEXT`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_the_last_events() {
        let mut history = History::default();
        for i in 0..HISTORY + 5 {
            history.refused(&Broken {
                manifest: format!("/plugins/p{i}/wasmjobs.toml").into(),
                error: "bad".into(),
            });
        }
        let names: Vec<&str> = history.events().map(|e| e.plugin.as_str()).collect();
        assert_eq!(names.len(), HISTORY);
        assert_eq!(names[0], "p5");
        assert_eq!(names[HISTORY - 1], format!("p{}", HISTORY + 4));
    }

    #[test]
    fn a_plugin_refused_again_for_the_same_reason_is_recorded_once() {
        let mut history = History::default();
        let root = Path::new("/plugins/bad");
        let rejected = |error: &str| Change::Rejected {
            error: error.into(),
            kept: None,
        };
        history.changed(root, &rejected("no component"));
        history.changed(root, &rejected("no component"));
        history.changed(Path::new("/plugins/other"), &rejected("no component"));
        history.changed(root, &rejected("no component"));
        history.changed(root, &rejected("bad manifest"));
        let events: Vec<(&str, Option<&str>)> = history
            .events()
            .map(|e| (e.plugin.as_str(), e.error.as_deref()))
            .collect();
        assert_eq!(
            events,
            [
                ("bad", Some("no component")),
                ("other", Some("no component")),
                ("bad", Some("bad manifest"))
            ]
        );
    }

    #[test]
    fn long_errors_are_cut() {
        let error = "é".repeat(MAX_TEXT * 3);
        let mut history = History::default();
        history.refused(&Broken {
            manifest: "/plugins/x/wasmjobs.toml".into(),
            error: error.clone(),
        });
        let described = describe(
            [],
            &[Broken {
                manifest: "/plugins/x/wasmjobs.toml".into(),
                error,
            }],
            &history,
        );
        assert_eq!(described.broken[0].plugin, "x");
        assert_eq!(described.broken[0].error.chars().count(), MAX_TEXT + 1);
        let kept = described.history[0].error.as_deref().unwrap_or_default();
        assert_eq!(kept.chars().count(), MAX_TEXT + 1);
    }

    #[test]
    fn refused_plugins_are_named_up_to_a_bound() {
        let broken: Vec<Broken> = (0..MAX_BROKEN + 7)
            .map(|i| Broken {
                manifest: format!("/plugins/p{i}/wasmjobs.toml").into(),
                error: "bad".into(),
            })
            .collect();
        let described = describe([], &broken, &History::default());
        assert_eq!(described.broken.len(), MAX_BROKEN + 1);
        assert!(described.broken[MAX_BROKEN].error.starts_with("7 more plugins refused"));
    }

    #[test]
    fn reports_are_read_leniently() {
        let described: Described =
            serde_json::from_str(r#"{"plugins":[{"name":"a","extra":1}],"unknown":true}"#).unwrap_or_default();
        assert_eq!(described.plugins.len(), 1);
        assert_eq!(described.plugins[0].name, "a");
        assert!(described.plugins[0].grants.is_empty());
        let round: Described =
            serde_json::from_str(&serde_json::to_string(&described).unwrap_or_default()).unwrap_or_default();
        assert_eq!(round, described);
    }
}
