//! The plugin manifest, `wasmjobs.toml`, that sits beside each component.
//!
//! A plugin's permissions are declared here, next to the plugin, not in the
//! runner's code or flags (as in Spin): which job classes it serves, which
//! hosts it may call, which host directories, environment variables and
//! databases it sees, and its limits. Anything not granted is denied; unknown keys are
//! rejected so a typo never silently grants or drops a permission.
//!
//! ```toml
//! component = "file_append_job.wasm"   # relative to this file
//! classes = ["FileAppendJob"]
//! env = ["API_TOKEN"]                  # passed through from the runner's environment
//! sql = ["main", { name = "local", mode = "ro" }]   # databases of the runner (`--db NAME=URL`) it may use
//!
//! [http]
//! allow = ["127.0.0.1:9292", "api.example.com", "*.example.org",
//!          { host = "api.internal:8080", h2 = true }]   # plain http:// over HTTP/2 (prior knowledge)
//!
//! [[files]]
//! host = "data"      # relative to this file; must stay inside the plugin directory
//! guest = "/data"    # the path the guest opens
//! mode = "rw"        # "ro" or "rw"
//! # outside = true   # needed to grant a host path outside the plugin directory
//!
//! [limits]           # each defaults to the runner's setting
//! memory = "64MiB"
//! timeout = "30s"
//! concurrency = 10   # most jobs of this plugin in flight in the process
//! fuel = 1_000_000_000   # instructions-ish per job; needs `--fuel` on the runner
//! log = { bytes = "1MiB", lines = 10000 }   # per job; lines past it are dropped
//! rate = "100/s"     # job starts, every process together (cluster_limits)
//!
//! [limits.per_key]   # per value at `key` in the job, every process together
//! key = "args.0"
//! rate = "10/min"
//! concurrency = 2    # jobs of one key value running at once, cluster-wide
//!
//! [[schedule]]       # periodic jobs (see `schedule` and docs/cron.md)
//! cron = "*/5 * * * *"
//! class = "FileAppendJob"
//!
//! [instances]        # see `instances`: fresh instance per job unless `reuse` > 1
//! reuse = 1000       # jobs one instance serves, one after another
//! idle_timeout = "10s"
//! max_idle = 100
//! ```
//!
//! Parsing checks each path lexically (no `..`, no absolute path without
//! `outside = true`); what a path resolves to on disk, and whether a
//! read-write grant reaches the plugin's own files, the plugins directory,
//! the data directory or another grant, is checked when the plugin loads
//! (`host::files::check`).
//!
//! Every error names the manifest file and, where it can, the line. The
//! property tests in `manifest/proptests.rs` hold the parser to that for
//! arbitrary and hostile text, and to never granting a host path outside the
//! plugin directory without `outside = true`.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use toml::Spanned;

use super::cluster_limits::ClusterLimits;
use super::instances::{InstancePolicy, RawInstances};
use super::limits::{PluginLimits, RawLimits};
use super::schedule::{RawSchedule, Schedule};
use crate::host::disk::DiskBudget;
use crate::host::files::{FileGrants, Handles};
pub use crate::host::files::{Mode, Preopen};
use crate::host::http::AllowList;
use crate::host::{Grants, SqlGrants};

/// The file name the plugin catalog looks for.
pub const MANIFEST_FILE: &str = "wasmjobs.toml";

/// A parsed, validated manifest with paths resolved against its directory.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The manifest file itself.
    pub path: PathBuf,
    /// The plugin root: the directory holding the manifest. Host paths may
    /// not leave it.
    pub root: PathBuf,
    /// The component file (absolute).
    pub component: PathBuf,
    /// The job classes this plugin serves.
    pub classes: Vec<String>,
    /// Directories preopened for the guest.
    pub files: Vec<Preopen>,
    /// Hosts the guest may call over HTTP.
    pub http_allow: AllowList,
    /// Environment variables passed through from the runner.
    pub env: Vec<String>,
    /// Limits that override the runner's defaults.
    pub limits: PluginLimits,
    /// Cluster-wide limits (`limits.rate`, `[limits.per_key]`), enforced
    /// in Redis across every process.
    pub cluster_limits: ClusterLimits,
    /// Whether instances serve one job or several (`[instances]`).
    pub instances: InstancePolicy,
    /// Names of the runner's databases the guest may use (`sql = [...]`).
    /// A name the runner does not configure is not an error here: which
    /// databases exist is runner configuration, checked at query time.
    pub sql: Vec<String>,
    /// The names of `sql` granted read-only (`{ name = "main", mode = "ro" }`):
    /// every statement on them runs in a read-only transaction (PostgreSQL)
    /// or with `query_only` on (SQLite). The others are read-write.
    pub sql_read_only: Vec<String>,
    /// Periodic jobs (`[[schedule]]`), validated; the runner registers
    /// them in Redis when the plugin loads.
    pub schedules: Vec<Schedule>,
    /// Example args per class (`[examples]`, a JSON array each), for the
    /// commands that suggest a job to try (`wasmjobs build`).
    pub examples: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    component: Spanned<String>,
    classes: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    files: Vec<Spanned<RawPreopen>>,
    #[serde(default)]
    http: Option<RawHttp>,
    #[serde(default)]
    env: Vec<Spanned<String>>,
    #[serde(default)]
    limits: Option<RawLimits>,
    #[serde(default)]
    instances: Option<RawInstances>,
    #[serde(default)]
    sql: Vec<Spanned<RawSqlGrant>>,
    #[serde(default)]
    schedule: Vec<Spanned<RawSchedule>>,
    #[serde(default)]
    examples: std::collections::BTreeMap<String, Spanned<String>>,
}

/// One `sql` grant: `"main"` (read-write) or `{ name = "main", mode = "ro" }`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawSqlGrant {
    Name(String),
    Table(RawSqlTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSqlTable {
    name: String,
    #[serde(default = "read_write")]
    mode: Mode,
}

fn read_write() -> Mode {
    Mode::ReadWrite
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    allow: Spanned<Vec<RawAllow>>,
}

/// One `http.allow` rule: `"host:port"` or `{ host = "host:port", h2 = true }`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawAllow {
    Pattern(String),
    Table(RawAllowTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAllowTable {
    host: String,
    #[serde(default)]
    h2: bool,
}

impl RawAllow {
    fn rule(&self) -> (String, bool) {
        match self {
            Self::Pattern(pattern) => (pattern.clone(), false),
            Self::Table(table) => (table.host.clone(), table.h2),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreopen {
    host: Spanned<String>,
    guest: Spanned<String>,
    mode: Mode,
    #[serde(default)]
    outside: bool,
}

/// A plugin's name: the name of its directory `root`.
pub fn plugin_name(root: &Path) -> String {
    root.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| root.display().to_string())
}

impl Manifest {
    /// What the file capability needs of this manifest: its grants and the
    /// paths a read-write grant must keep clear of.
    pub(crate) fn file_grants(&self) -> FileGrants<'_> {
        FileGrants {
            manifest: &self.path,
            root: &self.root,
            component: &self.component,
            files: &self.files,
        }
    }

    /// What a version of this plugin is granted: the manifest's grants,
    /// with the directories `handles` opened from them, the disk budget of
    /// its read-write ones, and the values of the granted environment
    /// variables (those the runner has).
    pub(crate) fn grants(&self, handles: Handles, disk: Option<Arc<DiskBudget>>) -> Grants {
        Grants {
            plugin: self.plugin_name().into(),
            manifest: self.path.as_path().into(),
            env: self
                .env
                .iter()
                .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
                .collect(),
            files: self.files.clone(),
            handles,
            sql: Arc::new(SqlGrants {
                names: self.sql.clone(),
                read_only: self.sql_read_only.clone(),
                concurrency: self.limits.concurrency.map(|n| n as usize),
            }),
            log: self.limits.log.unwrap_or_default(),
            http_allow: Arc::new(self.http_allow.clone()),
            http_stats: Arc::default(),
            http_pools: Arc::default(),
            disk,
        }
    }

    /// The plugin's name: the name of its directory.
    pub fn plugin_name(&self) -> String {
        plugin_name(&self.root)
    }

    /// The component's file name (as in "compiling greet.wasm").
    pub fn component_name(&self) -> String {
        self.component
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Reads and validates the manifest at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("{}: cannot read manifest", path.display()))?;
        Self::parse(path, &text)
    }

    /// Validates manifest `text` as if read from `path` (used for messages and
    /// to resolve relative paths).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
        let root = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let at = |span: Range<usize>| format!("{}:{}", path.display(), line_of(text, span.start));

        let component = inside_root(&root, raw.component.get_ref())
            .map_err(|e| anyhow!("{}: component: {e}", at(raw.component.span())))?;

        if raw.classes.get_ref().is_empty() {
            bail!("{}: classes: list at least one job class", at(raw.classes.span()));
        }
        let mut classes = Vec::new();
        for class in raw.classes.get_ref() {
            let name = class.get_ref();
            if !valid_class(name) {
                bail!(
                    "{}: classes: {name:?} is not a valid job class name (letters, digits, '_', ':', '.', '-')",
                    at(class.span())
                );
            }
            if classes.contains(name) {
                bail!("{}: classes: {name:?} is listed twice", at(class.span()));
            }
            classes.push(name.clone());
        }

        let mut files = Vec::new();
        let mut guests = HashSet::new();
        for entry in &raw.files {
            let raw_preopen = entry.get_ref();
            let host = if raw_preopen.outside {
                root.join(raw_preopen.host.get_ref())
            } else {
                inside_root(&root, raw_preopen.host.get_ref()).map_err(|e| {
                    anyhow!(
                        "{}: files.host: {e} (set `outside = true` to grant it anyway)",
                        at(raw_preopen.host.span())
                    )
                })?
            };
            let guest = raw_preopen.guest.get_ref();
            if !guest.starts_with('/') || Path::new(guest).components().any(|c| c == Component::ParentDir) {
                bail!(
                    "{}: files.guest: {guest:?} must be an absolute guest path without '..'",
                    at(raw_preopen.guest.span())
                );
            }
            if !guests.insert(guest.clone()) {
                bail!(
                    "{}: files.guest: {guest:?} is preopened twice",
                    at(raw_preopen.guest.span())
                );
            }
            files.push(Preopen {
                host,
                guest: guest.clone(),
                mode: raw_preopen.mode,
                outside: raw_preopen.outside,
            });
        }

        let http_allow = match &raw.http {
            Some(http) => {
                let rules: Vec<(String, bool)> = http.allow.get_ref().iter().map(RawAllow::rule).collect();
                AllowList::parse_rules(&rules).map_err(|e| anyhow!("{}: {e}", at(http.allow.span())))?
            }
            None => AllowList::default(),
        };
        let mut env = Vec::new();
        for name in &raw.env {
            let valid = !name.get_ref().is_empty()
                && name.get_ref().chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.get_ref().starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                bail!(
                    "{}: env: {:?} is not an environment variable name",
                    at(name.span()),
                    name.get_ref()
                );
            }
            env.push(name.get_ref().clone());
        }
        let mut sql: Vec<String> = Vec::new();
        let mut sql_read_only: Vec<String> = Vec::new();
        for grant in &raw.sql {
            let (text, mode) = match grant.get_ref() {
                RawSqlGrant::Name(name) => (name, Mode::ReadWrite),
                RawSqlGrant::Table(table) => (&table.name, table.mode),
            };
            let name = grant;
            let valid = !text.is_empty()
                && text.len() <= 64
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
            if !valid {
                bail!(
                    "{}: sql: {text:?} is not a database name (1-64 letters, digits, '_' or '-')",
                    at(name.span())
                );
            }
            if sql.contains(text) {
                bail!("{}: sql: {text:?} is listed twice", at(name.span()));
            }
            sql.push(text.clone());
            if mode == Mode::ReadOnly {
                sql_read_only.push(text.clone());
            }
        }
        let limits = match &raw.limits {
            Some(limits) => limits.resolve(&at)?,
            None => PluginLimits::default(),
        };
        let cluster_limits = match &raw.limits {
            Some(limits) => limits.cluster(&at)?,
            None => ClusterLimits::default(),
        };
        let instances = match &raw.instances {
            Some(instances) => instances.resolve(&at)?,
            None => InstancePolicy::default(),
        };
        let schedules = super::schedule::resolve(&raw.schedule, &classes, &at)?;
        let mut examples = std::collections::BTreeMap::new();
        for (class, args) in &raw.examples {
            if !classes.contains(class) {
                bail!(
                    "{}: examples: {class:?} is not one of this plugin's classes",
                    at(args.span())
                );
            }
            match serde_json::from_str::<serde_json::Value>(args.get_ref()) {
                Ok(serde_json::Value::Array(_)) => {}
                _ => bail!(
                    "{}: examples.{class}: {:?} is not a JSON array (a job's args, e.g. '[\"world\", 3]')",
                    at(args.span()),
                    args.get_ref()
                ),
            }
            examples.insert(class.clone(), args.get_ref().clone());
        }

        Ok(Self {
            path: path.to_path_buf(),
            root,
            component,
            classes,
            files,
            http_allow,
            env,
            limits,
            cluster_limits,
            instances,
            sql,
            sql_read_only,
            schedules,
            examples,
        })
    }
}

/// Resolves `relative` against `root`, refusing absolute paths and `..`, so a
/// manifest can only grant what lies inside its own plugin directory.
fn inside_root(root: &Path, relative: &str) -> Result<PathBuf> {
    let p = Path::new(relative);
    if relative.is_empty() {
        bail!("empty path");
    }
    if p.is_absolute() {
        bail!("{relative:?} is absolute; paths are relative to the manifest's directory");
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        bail!("{relative:?} leaves the plugin directory ('..' is not allowed)");
    }
    Ok(root.join(p))
}

fn valid_class(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-'))
}

/// 1-based line number of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest> {
        Manifest::parse(Path::new("/p/x/wasmjobs.toml"), text)
    }

    #[test]
    fn parses_a_full_manifest() {
        let m = parse(
            r#"
component = "x.wasm"
classes = ["XJob", "Other::Job"]
[[files]]
host = "data/in"
guest = "/in"
mode = "ro"
[[files]]
host = "out"
guest = "/out"
mode = "rw"
"#,
        )
        .unwrap();
        assert_eq!(m.component, PathBuf::from("/p/x/x.wasm"));
        assert_eq!(m.classes, ["XJob", "Other::Job"]);
        assert_eq!(
            m.files[0],
            Preopen {
                host: "/p/x/data/in".into(),
                guest: "/in".into(),
                mode: Mode::ReadOnly,
                outside: false
            }
        );
        assert_eq!(m.files[1].mode, Mode::ReadWrite);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\n[[files]]\nhost = \"../etc\"\nguest = \"/etc\"\nmode = \"ro\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:4: files.host"), "{err}");
        assert!(err.contains("leaves the plugin directory"), "{err}");

        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nthreads = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/p/x/wasmjobs.toml") && err.contains("line 3") && err.contains("unknown field"),
            "{err}"
        );

        let err = parse("component = \"/abs.wasm\"\nclasses = [\"A\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:1: component"), "{err}");

        let err = parse("component = \"x.wasm\"\nclasses = []\n").unwrap_err().to_string();
        assert!(err.contains(":2: classes"), "{err}");

        let err = parse("component = \"x.wasm\"\nclasses = [\"A B\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a valid job class"), "{err}");

        let err = parse(
            "component = \"x.wasm\"\nclasses = [\"A\"]\n[[files]]\nhost = \"d\"\nguest = \"/d\"\nmode = \"rwx\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 6"), "{err}");

        let err =
            parse("component = \"x.wasm\"\nclasses = [\"A\"]\n[[files]]\nhost = \"d\"\nguest = \"d\"\nmode = \"ro\"\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains(":5: files.guest"), "{err}");
    }

    #[test]
    fn http_rules_may_ask_for_h2() {
        let base = "component = \"x.wasm\"\nclasses = [\"A\"]\n";
        let m = parse(&format!(
            "{base}[http]\nallow = [\"a.test\", {{ host = \"b.test:8080\", h2 = true }}, {{ host = \"c.test\" }}]\n"
        ))
        .unwrap();
        assert_eq!(m.http_allow.grant("http", "a.test", 80).map(|g| g.h2), Some(false));
        assert_eq!(m.http_allow.grant("http", "b.test", 8080).map(|g| g.h2), Some(true));
        assert_eq!(m.http_allow.grant("http", "c.test", 80).map(|g| g.h2), Some(false));
        for bad in [
            "{ host = \"b.test\", h2 = \"yes\" }",
            "{ host = \"b.test\", http3 = true }",
            "{ h2 = true }",
            "{ host = \"*\", h2 = true }",
        ] {
            assert!(parse(&format!("{base}[http]\nallow = [{bad}]\n")).is_err(), "{bad}");
        }
    }

    #[test]
    fn grants_and_limits_parse() {
        let m = parse(
            r#"
component = "x.wasm"
classes = ["A"]
env = ["API_TOKEN", "REGION"]
[http]
allow = ["127.0.0.1:9292", "*.example.org"]
[limits]
memory = "64MiB"
timeout = "1.5s"
concurrency = 3
fuel = 1000
[[files]]
host = "/srv/shared"
guest = "/shared"
mode = "ro"
outside = true
"#,
        )
        .unwrap();
        assert!(m.http_allow.allows("http", "127.0.0.1", 9292));
        assert!(!m.http_allow.allows("http", "127.0.0.1", 80));
        assert_eq!(m.env, ["API_TOKEN", "REGION"]);
        assert_eq!(m.limits.memory, Some(64 << 20));
        assert_eq!(m.limits.timeout, Some(std::time::Duration::from_millis(1500)));
        assert_eq!(m.limits.concurrency, Some(3));
        assert_eq!(m.limits.fuel, Some(1000));
        assert_eq!(m.files[0].host, PathBuf::from("/srv/shared"));
        assert!(m.files[0].outside);

        let defaults = parse("component = \"x.wasm\"\nclasses = [\"A\"]\n").unwrap();
        assert!(defaults.http_allow.is_empty() && defaults.env.is_empty());
        assert_eq!(defaults.limits, PluginLimits::default());
    }

    #[test]
    fn bad_grants_name_the_line() {
        let base = "component = \"x.wasm\"\nclasses = [\"A\"]\n";
        let err = parse(&format!("{base}[http]\nallow = [\"*\"]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/p/x/wasmjobs.toml:4:") && err.contains("http.allow"),
            "{err}"
        );
        let err = parse(&format!("{base}env = [\"A-B\"]\n")).unwrap_err().to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:3: env"), "{err}");
        let err = parse(&format!("{base}[limits]\nmemory = \"lots\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:4: limits.memory"), "{err}");
        let err = parse(&format!("{base}[limits]\ntimeout = \"soon\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:4: limits.timeout"), "{err}");
        let err = parse(&format!("{base}[limits]\nconcurrency = 0\n"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:4: limits.concurrency"), "{err}");
        let err = parse(&format!("{base}[limits]\ncpu = 1\n")).unwrap_err().to_string();
        assert!(err.contains("unknown field") && err.contains("line 4"), "{err}");
        let err = parse(&format!(
            "{base}[[files]]\nhost = \"/etc\"\nguest = \"/etc\"\nmode = \"ro\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("outside = true"), "{err}");
    }

    #[test]
    fn sql_grants_are_names_and_default_to_none() {
        assert!(
            parse("component = \"x.wasm\"\nclasses = [\"A\"]\n")
                .unwrap()
                .sql
                .is_empty()
        );
        let m = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nsql = [\"main\", \"local-2\"]\n").unwrap();
        assert_eq!(m.sql, ["main", "local-2"]);
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nsql = [\"main\", \"a b\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:3: sql"), "{err}");
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nsql = [\"m\",\n  \"m\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains(":4: sql") && err.contains("listed twice"), "{err}");
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nsql = \"main\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn sql_grants_may_be_read_only() {
        let m = parse(
            "component = \"x.wasm\"\nclasses = [\"A\"]\nsql = [\"a\", { name = \"b\", mode = \"ro\" }, { name = \"c\", mode = \"rw\" }, { name = \"d\" }]\n",
        )
        .unwrap();
        assert_eq!(m.sql, ["a", "b", "c", "d"]);
        assert_eq!(m.sql_read_only, ["b"]);
        for bad in [
            "sql = [{ name = \"b\", mode = \"write\" }]",
            "sql = [{ name = \"b\", mode = \"ro\", extra = 1 }]",
            "sql = [{ mode = \"ro\" }]",
            "sql = [{ name = \"a b\", mode = \"ro\" }]",
        ] {
            let err = parse(&format!("component = \"x.wasm\"\nclasses = [\"A\"]\n{bad}\n"));
            assert!(err.is_err(), "{bad}");
        }
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\nsql = [\"b\", { name = \"b\", mode = \"ro\" }]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listed twice"), "{err}");
    }

    #[test]
    fn cluster_limits_parse_beside_the_process_ones() {
        let m = parse(
            "component = \"x.wasm\"\nclasses = [\"A\"]\n[limits]\nconcurrency = 3\nrate = \"100/s\"\n[limits.per_key]\nkey = \"args.0.user_id\"\nrate = \"10/min\"\nconcurrency = 2\n",
        )
        .unwrap();
        assert_eq!(m.limits.concurrency, Some(3));
        assert_eq!(
            m.cluster_limits.rate.map(|r| (r.count, r.period.as_secs())),
            Some((100, 1))
        );
        let per_key = m.cluster_limits.per_key.as_ref().unwrap();
        assert_eq!(per_key.key.segments(), ["args", "0", "user_id"]);
        assert_eq!(per_key.concurrency, Some(2));
        assert!(
            !parse("component = \"x.wasm\"\nclasses = [\"A\"]\n")
                .unwrap()
                .cluster_limits
                .any()
        );
        let err = parse("component = \"x.wasm\"\nclasses = [\"A\"]\n[limits]\nrate = \"100/day\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/p/x/wasmjobs.toml:4: limits.rate"), "{err}");
        let err =
            parse("component = \"x.wasm\"\nclasses = [\"A\"]\n[limits.per_key]\nkey = \"args.0\"\nconcurrency = 0\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.starts_with("/p/x/wasmjobs.toml:5: limits.per_key.concurrency"),
            "{err}"
        );
    }

    #[test]
    fn schedules_parse_with_defaults() {
        let m = parse(
            "component = \"x.wasm\"\nclasses = [\"A\", \"B\"]\n[[schedule]]\ncron = \"*/5 * * * *\"\nclass = \"A\"\n[[schedule]]\ncron = \"*/1 * * * * *\"\ntimezone = \"Europe/Berlin\"\nclass = \"B\"\nargs = [1, \"two\"]\nqueue = \"reports\"\nname = \"every-second\"\ncatch_up = true\n",
        )
        .unwrap();
        let [a, b] = &m.schedules[..] else {
            panic!("{:?}", m.schedules)
        };
        assert_eq!(
            (a.name.as_str(), a.class.as_str(), a.queue.as_str()),
            ("A", "A", "default")
        );
        assert!(a.args.is_empty() && !a.catch_up);
        assert_eq!((a.cron.expression(), a.cron.zone()), ("*/5 * * * *", "UTC"));
        assert_eq!((b.name.as_str(), b.queue.as_str()), ("every-second", "reports"));
        assert_eq!(b.args, [serde_json::json!(1), serde_json::json!("two")]);
        assert!(b.catch_up);
        assert_eq!(b.cron.zone(), "Europe/Berlin");
        assert!(
            parse("component = \"x.wasm\"\nclasses = [\"A\"]\n")
                .unwrap()
                .schedules
                .is_empty()
        );
    }

    #[test]
    fn bad_schedules_refuse_the_plugin_with_the_line() {
        let base = "component = \"x.wasm\"\nclasses = [\"A\"]\n[[schedule]]\nclass = \"A\"\n";
        for (extra, line, says) in [
            ("cron = \"61 * * * *\"\n", ":5: schedule", "not valid"),
            ("cron = \"* * * *\"\n", ":5: schedule", "4 fields"),
            (
                "cron = \"* * * * *\"\ntimezone = \"Mars/Base\"\n",
                ":6: schedule",
                "unknown time zone",
            ),
            (
                "cron = \"* * * * *\"\nname = \"a b\"\n",
                ":6: schedule.name",
                "not a schedule name",
            ),
            (
                "cron = \"* * * * *\"\nqueue = \"\"\n",
                ":6: schedule.queue",
                "not a queue name",
            ),
            (
                "cron = \"* * * * *\"\nargs = {a = 1}\n",
                ":6: schedule.args",
                "must be an array",
            ),
            ("cron = \"* * * * *\"\nevery = 5\n", "line 6", "unknown field"),
        ] {
            let err = parse(&format!("{base}{extra}")).unwrap_err().to_string();
            assert!(err.contains(line) && err.contains(says), "{extra}: {err}");
        }
        let err =
            parse("component = \"x.wasm\"\nclasses = [\"A\"]\n[[schedule]]\ncron = \"* * * * *\"\nclass = \"Other\"\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains(":5: schedule.class") && err.contains("not one of"),
            "{err}"
        );
        let twice = "[[schedule]]\ncron = \"* * * * *\"\nclass = \"A\"\n";
        let err = parse(&format!("component = \"x.wasm\"\nclasses = [\"A\"]\n{twice}{twice}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("used twice") && err.contains("need a `name`"), "{err}");
        let many = twice.repeat(101);
        let err = parse(&format!("component = \"x.wasm\"\nclasses = [\"A\"]\n{many}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than 100"), "{err}");
    }

    #[test]
    fn missing_keys_are_reported() {
        let err = parse("classes = [\"A\"]\n").unwrap_err().to_string();
        assert!(err.contains("missing field `component`"), "{err}");
    }
}
