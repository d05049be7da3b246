//! `--db NAME=URL`: how a runner names its databases and how to reach them.
//!
//! Databases are runner configuration, not plugin configuration: the person
//! who runs wasmjobs decides where `main` lives and with which credentials,
//! and a plugin's manifest can only name databases it wants. The URL carries
//! the few settings wasmjobs itself needs as query parameters, which are
//! taken out before the rest of the URL reaches the driver:
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `pool=N` | most connections open at once | 10 (PostgreSQL), 4 (SQLite) |
//! | `timeout=SECS` | per-statement timeout; also bounds waiting for a free connection | 30 |
//! | `max_rows=N` | most rows one query may return | 100000 |
//! | `max_bytes=SIZE` | most bytes one query may return (`64MiB`, `1048576`, ...) | 64MiB |
//! | `max_size=SIZE` | SQLite only: most bytes the database file may grow to | unlimited |
//!
//! `postgres://user:pass@host:5432/db?pool=100` (or `postgresql://`): every
//! other parameter is tokio-postgres's (libpq-style, e.g. `connect_timeout`,
//! `application_name`, `options`). `sqlite://jobs.db` is a file under the
//! runner's data directory, `sqlite:///var/lib/app/jobs.db` an absolute path;
//! the file is created if missing.
//!
//! `NAME@PLUGIN=URL` is `NAME` for the plugin whose directory is named
//! `PLUGIN` only: its own credentials (and pool, caps and timeout), in place
//! of `NAME=URL`, which every other plugin granted `NAME` shares. On
//! PostgreSQL a role per plugin is what keeps plugins out of each other's
//! sessions (docs/sql.md, "One role per plugin").
//!
//! Nothing here echoes the text it refuses: a `--db` value holds a password,
//! so errors name the part that is wrong, never the whole value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::size::parse_size;

/// Default pool size of a PostgreSQL database: enough for typical job mixes
/// without exhausting a server's default `max_connections` (100) when a few
/// runners share it. Raise it with `?pool=N` for IO-bound jobs.
pub(crate) const DEFAULT_POSTGRES_POOL: usize = 10;
/// Default pool size of a SQLite database: WAL mode lets readers run in
/// parallel, but writers take turns, so more connections rarely help.
pub(crate) const DEFAULT_SQLITE_POOL: usize = 4;
/// Default per-statement timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default cap on the rows one query returns.
pub(crate) const DEFAULT_MAX_ROWS: usize = 100_000;
/// Default cap on the bytes one query returns.
pub(crate) const DEFAULT_MAX_BYTES: usize = 64 << 20;
/// Smallest SQLite size budget accepted (`max_size`): 16 pages of the
/// largest page size, room for a schema and a few rows.
const MIN_MAX_SIZE: usize = 1 << 20 >> 4;
/// Largest pool accepted: a typo should not open ten thousand connections.
const MAX_POOL: usize = 10_000;

/// Which engine serves a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A PostgreSQL server, reached over the network.
    Postgres,
    /// A SQLite file, embedded in the runner.
    Sqlite,
}

/// The wasmjobs-side settings of one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Most connections open at once.
    pub(crate) pool: usize,
    /// Per-statement timeout (and bound on waiting for a connection).
    pub(crate) timeout: Duration,
    /// Most rows one query may return.
    pub(crate) max_rows: usize,
    /// Most bytes one query may return (text and blob lengths, plus a small
    /// fixed cost per value).
    pub(crate) max_bytes: usize,
    /// SQLite only: the size budget of the database file, in bytes
    /// (enforced as SQLite's `max_page_count`); `None` for no budget.
    pub(crate) max_size: Option<u64>,
}

/// One `--db NAME=URL` (or `NAME@PLUGIN=URL`) option, parsed.
#[derive(Clone, PartialEq, Eq)]
pub struct DbSpec {
    /// The name plugins use (`sql = ["main"]`, `sql::query("main", ...)`).
    pub(crate) name: String,
    /// `Some(plugin)` for `NAME@PLUGIN=URL`: the database `name` of that
    /// plugin alone (by its directory's name); `None` for every plugin's.
    pub(crate) plugin: Option<String>,
    /// Which engine.
    pub(crate) backend: Backend,
    /// What the driver gets: the URL without wasmjobs's parameters
    /// (PostgreSQL), or the file path as written (SQLite).
    pub(crate) target: String,
    /// The URL as the operator wrote it (a secret: never logged).
    pub(crate) url: String,
    /// Pool size, timeout and caps.
    pub(crate) settings: Settings,
}

impl DbSpec {
    /// `NAME`, or `NAME@PLUGIN` for one plugin's own: how the operator wrote
    /// it, for logs and errors.
    pub(crate) fn label(&self) -> String {
        match &self.plugin {
            Some(plugin) => format!("{}@{plugin}", self.name),
            None => self.name.clone(),
        }
    }

    /// The target with any password replaced by `***`, for logs and errors.
    pub(crate) fn redacted(&self) -> String {
        match self.backend {
            Backend::Postgres => crate::redact::postgres_url(&self.target),
            Backend::Sqlite => format!("sqlite://{}", self.target),
        }
    }
}

impl fmt::Debug for DbSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbSpec")
            .field("name", &self.name)
            .field("plugin", &self.plugin)
            .field("target", &self.redacted())
            .field("settings", &self.settings)
            .finish()
    }
}

impl FromStr for DbSpec {
    type Err = anyhow::Error;

    /// Parses `NAME=URL` or `NAME@PLUGIN=URL`.
    fn from_str(text: &str) -> Result<Self> {
        const EXPECTED: &str = "expected NAME=URL or NAME@PLUGIN=URL, e.g. main=postgres://user@localhost/app";
        let (key, url) = text.split_once('=').ok_or_else(|| anyhow!(EXPECTED))?;
        if key.contains("://") {
            // `postgres://user:pass@host/db?sslmode=disable` without `NAME=`:
            // the text before the first '=' holds the password.
            bail!("{EXPECTED} (the text before the first '=' is a URL: is NAME= missing?)");
        }
        let (db, plugin) = match key.trim().split_once('@') {
            Some((db, plugin)) => (db, Some(plugin)),
            None => (key.trim(), None),
        };
        if !valid_name(db) {
            bail!(
                "{} is not a valid database name (1-64 letters, digits, '_' or '-')",
                shown(db)
            );
        }
        if let Some(plugin) = plugin
            && !valid_plugin_name(plugin)
        {
            bail!(
                "database {db:?}: {} is not a valid plugin name in NAME@PLUGIN (the name of the plugin's \
                 directory: 1-255 letters, digits, '.', '_' or '-', not starting with '.')",
                shown(plugin)
            );
        }
        // Errors below name the database as the operator wrote it.
        let label = match plugin {
            Some(plugin) => format!("{db}@{plugin}"),
            None => db.to_owned(),
        };
        let name = label.as_str();
        let (backend, rest) = if let Some(rest) = url.strip_prefix("sqlite://") {
            (Backend::Sqlite, rest)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url)
        } else {
            bail!("database {name:?}: the URL must start with postgres://, postgresql:// or sqlite://");
        };
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut settings = Settings {
            pool: match backend {
                Backend::Postgres => DEFAULT_POSTGRES_POOL,
                Backend::Sqlite => DEFAULT_SQLITE_POOL,
            },
            timeout: DEFAULT_TIMEOUT,
            max_rows: DEFAULT_MAX_ROWS,
            max_bytes: DEFAULT_MAX_BYTES,
            max_size: None,
        };
        let mut passed = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let context = || format!("database {name:?}: {key}={value}");
            match key {
                "pool" => {
                    settings.pool = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_POOL).contains(n))
                        .ok_or_else(|| {
                            anyhow!("{}: expected a number of connections from 1 to {MAX_POOL}", context())
                        })?;
                }
                "timeout" => {
                    settings.timeout = value
                        .parse::<f64>()
                        .ok()
                        .filter(|s| *s > 0.0)
                        .and_then(|s| Duration::try_from_secs_f64(s).ok())
                        .ok_or_else(|| anyhow!("{}: expected a positive number of seconds", context()))?;
                }
                "max_rows" => {
                    settings.max_rows = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| anyhow!("{}: expected a positive number of rows", context()))?;
                }
                "max_bytes" => settings.max_bytes = parse_size(value).with_context(context)?,
                "max_size" if backend == Backend::Sqlite => {
                    let size = parse_size(value).with_context(context)?;
                    if size < MIN_MAX_SIZE {
                        bail!("{}: the size budget must be at least {MIN_MAX_SIZE} bytes", context());
                    }
                    settings.max_size = Some(size as u64);
                }
                "max_size" => bail!(
                    "database {name:?}: max_size is for sqlite:// (bound a PostgreSQL database's size on the server)"
                ),
                _ if backend == Backend::Postgres => passed.push(pair),
                _ => bail!(
                    "database {name:?}: unknown parameter {key:?} (sqlite:// takes pool, timeout, max_rows, max_bytes, max_size)"
                ),
            }
        }
        let target = match backend {
            Backend::Postgres if passed.is_empty() => base.to_owned(),
            Backend::Postgres => format!("{base}?{}", passed.join("&")),
            Backend::Sqlite if base.is_empty() => bail!("database {name:?}: sqlite:// needs a file path"),
            Backend::Sqlite => base.to_owned(),
        };
        Ok(DbSpec {
            name: db.to_owned(),
            plugin: plugin.map(str::to_owned),
            backend,
            target,
            url: url.to_owned(),
            settings,
        })
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// A name a plugin directory can have and the catalog loads (it skips
/// hidden directories), in the characters that need no quoting anywhere:
/// `application_name`, logs, shells.
fn valid_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// `text` quoted for an error, unless it could be part of a URL (and so of
/// a password): then only that it is not shown.
fn shown(text: &str) -> String {
    if text.contains([':', '/', '@', '?', '#', '%']) || text.len() > 64 {
        "the text before '=' (not shown: it looks like part of a URL)".to_owned()
    } else {
        format!("{text:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_postgres_and_takes_out_our_parameters() {
        let spec: DbSpec = "main=postgres://u:pw@db:5432/app?pool=100&connect_timeout=5&timeout=2.5"
            .parse()
            .unwrap();
        assert_eq!(spec.name, "main");
        assert_eq!(spec.backend, Backend::Postgres);
        assert_eq!(spec.target, "postgres://u:pw@db:5432/app?connect_timeout=5");
        assert_eq!(spec.settings.pool, 100);
        assert_eq!(spec.settings.timeout, Duration::from_millis(2500));
        assert_eq!(spec.settings.max_rows, DEFAULT_MAX_ROWS);
        assert_eq!(spec.redacted(), "postgres://u:***@db:5432/app?connect_timeout=5");
        assert!(!format!("{spec:?}").contains("pw"));
    }

    #[test]
    fn parses_sqlite() {
        let spec: DbSpec = "local=sqlite://data/local.db?max_rows=10&max_bytes=1MiB"
            .parse()
            .unwrap();
        assert_eq!(spec.backend, Backend::Sqlite);
        assert_eq!(spec.target, "data/local.db");
        assert_eq!(spec.settings.pool, DEFAULT_SQLITE_POOL);
        assert_eq!(spec.settings.max_rows, 10);
        assert_eq!(spec.settings.max_bytes, 1 << 20);
        assert_eq!(spec.settings.max_size, None);
        let absolute: DbSpec = "a=sqlite:///tmp/x.db?max_size=64MiB".parse().unwrap();
        assert_eq!(absolute.target, "/tmp/x.db");
        assert_eq!(absolute.settings.max_size, Some(64 << 20));
    }

    #[test]
    fn parses_a_plugins_own_database() {
        let spec: DbSpec = "main@reports-v2.1=postgres://reporter:pw@db/app?pool=2"
            .parse()
            .unwrap();
        assert_eq!(spec.name, "main");
        assert_eq!(spec.plugin.as_deref(), Some("reports-v2.1"));
        assert_eq!(spec.label(), "main@reports-v2.1");
        assert_eq!(spec.target, "postgres://reporter:pw@db/app");
        assert_eq!(spec.settings.pool, 2);
        let shown = format!("{spec:?}");
        assert!(shown.contains("reports-v2.1") && !shown.contains("pw"), "{shown}");
        let every: DbSpec = "main=postgres://db/app".parse().unwrap();
        assert_eq!((every.plugin.as_deref(), every.label().as_str()), (None, "main"));
        let lite: DbSpec = "local@a_b=sqlite://a.db".parse().unwrap();
        assert_eq!((lite.plugin.as_deref(), lite.target.as_str()), (Some("a_b"), "a.db"));
    }

    #[test]
    fn errors_never_show_the_url() {
        let url = "postgres://u:Zq-secret@h/db";
        for (text, needle) in [
            (format!("main@={url}"), "not a valid plugin name"),
            (format!("main@../x={url}"), "not a valid plugin name"),
            (format!("main@.hidden={url}"), "\".hidden\" is not a valid plugin name"),
            (format!("main@a b={url}"), "\"a b\" is not a valid plugin name"),
            (format!("main@{}={url}", "p".repeat(256)), "not a valid plugin name"),
            (format!("main@a@b={url}"), "not a valid plugin name"),
            (format!("@a={url}"), "\"\" is not a valid database name"),
            (format!("{url}?sslmode=disable"), "NAME= missing"),
            (url.to_owned(), "expected NAME=URL"),
            (format!("u:Zq-secret={url}"), "not shown"),
            (format!("main@p={url}?pool=0"), "database \"main@p\": pool=0"),
        ] {
            let err = format!("{:#}", text.parse::<DbSpec>().unwrap_err());
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains("Zq"), "{text}: {err}");
        }
        assert!("main@x.y-z_1=sqlite://a".parse::<DbSpec>().is_ok());
    }

    #[test]
    fn rejects_bad_specs() {
        for (text, needle) in [
            ("main", "NAME=URL"),
            ("m a=sqlite://x", "not a valid database name"),
            ("m=mysql://x", "must start with"),
            ("m=sqlite://x?pool=0", "pool=0"),
            ("m=sqlite://x?cache=shared", "unknown parameter"),
            ("m=sqlite://x?max_size=1KiB", "at least"),
            ("m=sqlite://x?max_size=lots", "max_size=lots"),
            ("m=sqlite://", "needs a file path"),
            ("m=postgres://h/db?timeout=-1", "positive number of seconds"),
            ("m=postgres://h/db?max_size=1MiB", "for sqlite://"),
        ] {
            let err = text.parse::<DbSpec>().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn redacts_passwords() {
        let wrong = [
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://u:p@ss@h/db", "postgres://u:***@h/db"),
            (
                "postgres://h/db?user=u&password=x",
                "postgres://h/db?user=u&password=***",
            ),
            ("postgres://u:p%40ss@h/db", "postgres://u:***@h/db"),
            ("postgres://u:pa:ss@h/db", "postgres://u:***@h/db"),
            ("postgres://:pw@h/db", "postgres://:***@h/db"),
            ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
            (
                "postgres://u:pw@%2Frun%2Fpostgresql/db",
                "postgres://u:***@%2Frun%2Fpostgresql/db",
            ),
            (
                "postgres:///db?host=/run/postgresql&PASSWORD=pw&sslpassword=pw",
                "postgres:///db?host=/run/postgresql&PASSWORD=***&sslpassword=***",
            ),
            // tokio-postgres reads credentials up to the first '@', so these
            // are passwords with '/', '?' or '#' in them: unparseable as URLs,
            // or parsed with the password in the path.
            ("postgres://u:p/ss@h/db", "postgres://***"),
            ("postgres://u:p?ss@h/db", "postgres://***"),
            ("postgres://u:p#ss@h/db", "postgres://***"),
            ("postgres://u:5432/ss@h/db", "postgres://***"),
            // Several hosts are not a URL the url crate parses.
            ("postgres://u:pw@h1:5432,h2:5432/db", "postgres://***"),
        ]
        .into_iter()
        .filter(|(url, shown)| crate::redact::postgres_url(url) != *shown)
        .map(|(url, shown)| format!("{url}: {} instead of {shown}", crate::redact::postgres_url(url)))
        .collect::<Vec<_>>();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    proptest::proptest! {
        #![proptest_config(crate::proptest_config::config(500))]

        /// Wherever a password goes, it never shows (it starts with `Zq`,
        /// found nowhere else).
        #[test]
        fn a_password_never_shows(
            scheme in "postgres(ql)?://",
            user in "[a-z%:]{0,4}",
            password in "Zq[a-zA-Z0-9%:@/?#&=]{4,10}",
            host in "(h|\\[::1\\]|%2Frun)?(:5432)?",
            path in "(/db)?",
            params in "((user=u|password=|sslmode=disable)&){0,2}",
        ) {
            for url in [
                format!("{scheme}{user}:{password}@{host}{path}?{params}"),
                // A raw '&' ends a query value for every parser.
                format!("{scheme}{host}{path}?{params}password={}", password.replace('&', "%26")),
            ] {
                let shown = crate::redact::postgres_url(&url);
                proptest::prop_assert!(!shown.contains("Zq"), "{url} shown as {shown}");
            }
        }
    }
}
