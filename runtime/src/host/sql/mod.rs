//! `wasmjobs:job/sql`: SQL databases the runner configured, for the plugins
//! whose manifest grants them.
//!
//! Why it looks like this:
//! - **Databases belong to the runner** (`--db main=postgres://...`, see
//!   [`config`]), opened once per process into [`Databases`] and shared by
//!   every job, so connections are reused across jobs and a plugin never
//!   sees a credential. A manifest only names what it may use
//!   (`sql = ["main"]`); the per-job [`SqlView`] enforces that.
//! - **A plugin may have credentials of its own** (`--db
//!   main@reports=postgres://reports@...`): the view of a plugin (by its
//!   directory's name) reaches its own pool for that name, the others the
//!   shared one. On PostgreSQL the role is what separates plugins from each
//!   other's sessions (statement text in `pg_stat_activity`,
//!   `pg_cancel_backend`/`pg_terminate_backend`, `ALTER ROLE`): plugins
//!   sharing a role are not separated there (docs/sql.md, "One role per
//!   plugin"). Sessions are named `wasmjobs/<plugin>` (`postgres.rs`).
//! - **Grants are checked before existence**: a name the manifest does not
//!   grant is `not-granted` whether or not the runner has it (a plugin
//!   cannot probe the runner's configuration); a granted name the runner
//!   lacks is `unknown-database`. Neither breaks the plugin at load time,
//!   because which databases exist is the runner's business.
//! - **Parameters, never interpolation**: statements are prepared and values
//!   bound by the driver (`postgres.rs`, `sqlite.rs`).
//! - **One statement per call, nothing left behind**: each call runs in
//!   autocommit on some pooled connection, shared with the jobs of every
//!   plugin. What a statement could leave on its connection is undone or
//!   refused by the database side, not by reading the SQL: PostgreSQL
//!   connections are reset (settings, temp tables, advisory locks,
//!   listeners, cursors) before they go back to the pool, SQLite
//!   connections run guest SQL under an authorizer that refuses pragma
//!   writes, `ATTACH`/`DETACH` and temp objects (`postgres.rs`,
//!   `sqlite.rs`). `check_statement` only turns the obvious cases
//!   (`BEGIN`, `SET`, ...) into a clear message.
//! - **Read-only grants** (`sql = [{ name = "main", mode = "ro" }]`) are
//!   enforced by the database: a `READ ONLY` transaction around each
//!   statement (PostgreSQL), `query_only` set by the host, which the guest
//!   cannot unset (SQLite).
//! - **Fair share of a pool**: a plugin with `limits.concurrency = N` holds
//!   at most N connections of a database at once (a semaphore per plugin
//!   and database, in [`Databases`]), so its slow statements cannot take
//!   every connection from other plugins. A plugin without the limit may
//!   use the whole pool: give untrusted plugins a concurrency limit, or a
//!   database (`--db`) of their own.
//! - **Bounded**: a per-statement timeout (the statement is cancelled), and
//!   a cap on rows and bytes returned (`Budget`) so a careless `SELECT *`
//!   cannot exhaust the host's memory.
//! - **Failures are values**: every problem becomes a `sql-error` for the
//!   guest, never a trap and never a host panic.

pub mod config;
mod pg_values;
mod postgres;
mod sqlite;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context, Result, bail};

pub use config::{Backend, DbSpec, Settings};

use super::grants::{Grants, SqlGrants};
use crate::bindings::sql::{Host, Rows, SqlError, Value};
use crate::otel::{HostSpan, JobTrace};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The databases of one runner process, by name. Built once at start-up and
/// shared (behind an `Arc`) by every job.
#[derive(Default)]
pub struct Databases {
    /// `--db NAME=URL`: every plugin's, unless it has its own.
    by_name: BTreeMap<String, Arc<Database>>,
    /// `--db NAME@PLUGIN=URL`: by name, then by plugin (directory name).
    own: BTreeMap<String, BTreeMap<String, Arc<Database>>>,
    /// Per (manifest, database): the plugin's cap and the semaphore that
    /// enforces it. Made on a plugin's first statement on the database.
    plugin_slots: Mutex<HashMap<(PathBuf, String), PluginSlots>>,
}

/// The connections one plugin may hold of one database.
struct PluginSlots {
    cap: usize,
    semaphore: Arc<Semaphore>,
}

/// One configured database.
struct Database {
    spec: DbSpec,
    engine: Engine,
}

enum Engine {
    Postgres(postgres::Postgres),
    Sqlite(sqlite::Sqlite),
}

/// Longest start-up wait for one database's connections ([`Databases::warm_up`]).
pub const WARM_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Databases {
    /// No databases: every query fails with `not-granted` or
    /// `unknown-database`. What tests and commands without `--db` use.
    pub fn empty() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Opens the databases of `specs`. SQLite files are created (relative
    /// paths under `data_dir`) and opened now, so a bad path stops the
    /// runner at start-up; PostgreSQL pools connect lazily, so a database
    /// that is down only fails the jobs that use it (as `connection`
    /// errors, which they retry).
    ///
    /// Each spec is a pool of its own: a plugin's own database
    /// (`NAME@PLUGIN=URL`) does not share connections with `NAME=URL`.
    pub fn open(specs: &[DbSpec], data_dir: &Path) -> Result<Self> {
        let mut by_name = BTreeMap::new();
        let mut own: BTreeMap<String, BTreeMap<String, Arc<Database>>> = BTreeMap::new();
        for spec in specs {
            let taken = match &spec.plugin {
                None => by_name.contains_key(&spec.name),
                Some(plugin) => own.get(&spec.name).is_some_and(|of| of.contains_key(plugin)),
            };
            if taken {
                bail!("--db {}: configured twice", spec.label());
            }
            let engine = match spec.backend {
                Backend::Postgres => Engine::Postgres(postgres::Postgres::open(spec)?),
                Backend::Sqlite => Engine::Sqlite(sqlite::Sqlite::open(spec, data_dir)?),
            };
            tracing::info!(db = %spec.label(), url = %spec.redacted(), pool = spec.settings.pool, "database configured");
            let database = Arc::new(Database {
                spec: spec.clone(),
                engine,
            });
            match &spec.plugin {
                None => by_name.insert(spec.name.clone(), database),
                Some(plugin) => own
                    .entry(spec.name.clone())
                    .or_default()
                    .insert(plugin.clone(), database),
            };
        }
        Ok(Self {
            by_name,
            own,
            plugin_slots: Mutex::default(),
        })
    }

    /// The semaphore capping the connections of `db` that the plugin of
    /// `manifest` holds at once to `cap`. A reloaded plugin with another
    /// cap gets a new semaphore (statements in flight keep the old one).
    fn plugin_slots(&self, manifest: &Path, db: &str, cap: usize) -> Arc<Semaphore> {
        let mut slots = self.plugin_slots.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = slots
            .entry((manifest.to_path_buf(), db.to_owned()))
            .or_insert_with(|| PluginSlots {
                cap,
                semaphore: Arc::new(Semaphore::new(cap)),
            });
        if entry.cap != cap {
            *entry = PluginSlots {
                cap,
                semaphore: Arc::new(Semaphore::new(cap)),
            };
        }
        entry.semaphore.clone()
    }

    /// Opens `specs` on a blocking thread (SQLite files are created and
    /// opened there), for callers on the async runtime.
    pub async fn open_async(specs: Vec<DbSpec>, data_dir: PathBuf) -> Result<Arc<Self>> {
        tokio::task::spawn_blocking(move || Self::open(&specs, &data_dir))
            .await
            .context("opening the databases panicked")?
            .map(Arc::new)
    }

    /// Opens up to `count` connections per PostgreSQL pool now (SQLite
    /// opens its files at start-up already), so jobs start on warm
    /// connections. Gives up on a database after [`WARM_UP_LIMIT`], so an
    /// unreachable server delays start-up by no more than that. Returns the
    /// connections opened.
    pub async fn warm_up(&self, count: usize) -> usize {
        let mut opened = 0;
        for database in self.all() {
            if let Engine::Postgres(pg) = &database.engine {
                let warmed = tokio::time::timeout(WARM_UP_LIMIT, pg.warm_up(count))
                    .await
                    .unwrap_or(0);
                tracing::info!(db = %database.spec.label(), connections = warmed, "connection pool warmed");
                opened += warmed;
            }
        }
        opened
    }

    /// Every configured database: every plugin's, then plugins' own.
    fn all(&self) -> impl Iterator<Item = &Arc<Database>> {
        self.by_name
            .values()
            .chain(self.own.values().flat_map(BTreeMap::values))
    }

    /// `(name, plugin)` of each plugin's own database (`--db
    /// NAME@PLUGIN=URL`), sorted.
    pub fn own(&self) -> impl Iterator<Item = (&str, &str)> {
        self.own
            .iter()
            .flat_map(|(name, of)| of.keys().map(move |plugin| (name.as_str(), plugin.as_str())))
    }

    /// Whether the plugin named `plugin` has a database `name` (its own or
    /// every plugin's).
    pub fn has(&self, name: &str, plugin: &str) -> bool {
        self.database(name, plugin).is_some()
    }

    /// The database `name` as the plugin named `plugin` reaches it: its own
    /// if it has one, else every plugin's.
    fn database(&self, name: &str, plugin: &str) -> Option<&Arc<Database>> {
        self.own
            .get(name)
            .and_then(|of| of.get(plugin))
            .or_else(|| self.by_name.get(name))
    }

    /// Whether no database is configured.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty() && self.own.is_empty()
    }
}

/// What one job may reach: the runner's databases, filtered by the grants
/// of the job's plugin. Lives in the job's store (`JobState`); cloned out
/// of it by the `async-sql` import, which must not hold the store while a
/// statement runs.
#[derive(Clone)]
pub struct SqlView {
    databases: Arc<Databases>,
    /// The plugin's `sql` grants (shared by its jobs, as is the rest).
    grants: Arc<SqlGrants>,
    manifest: Arc<Path>,
    /// The plugin's name (its directory's): which database a name with a
    /// `--db NAME@PLUGIN=URL` reaches, and (as `application_name`) what
    /// PostgreSQL shows its sessions as.
    plugin: Arc<str>,
    /// The job's trace while it is sampled: each statement gets a span.
    trace: Option<JobTrace>,
}

impl SqlView {
    /// The view for a job of the plugin granted `grants`.
    pub fn new(databases: Arc<Databases>, grants: &Grants) -> Self {
        Self {
            databases,
            grants: grants.sql.clone(),
            manifest: grants.manifest.clone(),
            plugin: grants.plugin.clone(),
            trace: None,
        }
    }

    /// The same view, giving each statement a span under `trace`.
    pub(crate) fn with_trace(mut self, trace: Option<JobTrace>) -> Self {
        self.trace = trace;
        self
    }

    /// Gives each statement from now on a span under `trace` (or none).
    pub(crate) fn set_trace(&mut self, trace: Option<JobTrace>) {
        self.trace = trace;
    }

    /// The database `name`, if granted and configured.
    fn database(&self, name: &str) -> Result<Arc<Database>, SqlError> {
        if !self.grants.names.iter().any(|g| g == name) {
            return Err(SqlError::NotGranted(format!(
                "database {name:?} is not granted to this plugin: {} has {}",
                self.manifest.display(),
                if self.grants.names.is_empty() {
                    "no `sql` grants".to_owned()
                } else {
                    format!("sql = {:?}", self.grants.names)
                }
            )));
        }
        self.databases.database(name, &self.plugin).cloned().ok_or_else(|| {
            SqlError::UnknownDatabase(format!(
                "database {name:?} is granted but this runner has no such database \
                 (configure it with --db {name}=URL, or --db {name}@{}=URL for this plugin alone)",
                self.plugin
            ))
        })
    }

    async fn run(&self, db: &str, statement: String, params: Vec<Value>, want_rows: bool) -> Result<Output, SqlError> {
        let database = self.database(db)?;
        check_statement(&statement)?;
        let read_only = self.grants.read_only.iter().any(|g| g == db);
        let started = Instant::now();
        let mut span = match (&self.trace, &database.engine) {
            (Some(trace), Engine::Postgres(_)) => trace.sql(db, "postgresql", &statement),
            (Some(trace), Engine::Sqlite(_)) => trace.sql(db, "sqlite", &statement),
            (None, _) => HostSpan::default(),
        };
        let output = match self.plugin_permit(db, &database).await {
            Ok(_permit) => match &database.engine {
                Engine::Postgres(pg) => pg.run(&statement, &params, want_rows, read_only, &self.plugin).await,
                Engine::Sqlite(lite) => lite.run(statement, params, want_rows, read_only).await,
            },
            Err(error) => Err(error),
        };
        match &output {
            Ok(Output::Rows(rows)) => span.rows(rows.rows.len() as u64),
            Ok(Output::Affected(count)) => span.rows(*count),
            Err(error) => span.failed(error_kind(error), &error_message(error)),
        }
        match &output {
            Ok(_) => tracing::debug!(
                db,
                elapsed_us = started.elapsed().as_micros() as u64,
                "sql statement done"
            ),
            Err(SqlError::Connection(message)) => tracing::warn!(
                db = %database.spec.label(),
                plugin = %self.plugin,
                url = %database.spec.redacted(),
                "sql connection problem: {message}"
            ),
            Err(error) => tracing::debug!(db, "sql statement failed: {error:?}"),
        }
        output
    }
}

impl SqlView {
    /// Waits (up to the database's timeout) until this plugin holds fewer
    /// than its `limits.concurrency` connections of `db`. `None` when the
    /// plugin has no such limit, or it is at least the pool size.
    async fn plugin_permit(&self, db: &str, database: &Database) -> Result<Option<OwnedSemaphorePermit>, SqlError> {
        let settings = database.spec.settings;
        let Some(cap) = self.grants.concurrency.filter(|cap| *cap < settings.pool) else {
            return Ok(None);
        };
        let semaphore = self.databases.plugin_slots(&self.manifest, db, cap);
        match tokio::time::timeout(settings.timeout, semaphore.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) => Err(SqlError::Connection(format!("{db:?}: the database is closed"))),
            Err(_) => Err(SqlError::Timeout(format!(
                "{db:?}: this plugin already held its {cap} connections (limits.concurrency) for {:?}",
                settings.timeout
            ))),
        }
    }
}

/// The `error.type` of a failed statement's span.
fn error_kind(error: &SqlError) -> &'static str {
    match error {
        SqlError::NotGranted(_) => "not-granted",
        SqlError::UnknownDatabase(_) => "unknown-database",
        SqlError::Connection(_) => "connection",
        SqlError::Query(_) => "query",
        SqlError::Timeout(_) => "timeout",
        SqlError::Limit(_) => "limit",
    }
}

/// The message of a failed statement.
fn error_message(error: &SqlError) -> &str {
    match error {
        SqlError::NotGranted(m)
        | SqlError::UnknownDatabase(m)
        | SqlError::Connection(m)
        | SqlError::Query(m)
        | SqlError::Timeout(m)
        | SqlError::Limit(m) => m,
    }
}

/// What a statement produced.
pub(crate) enum Output {
    /// The rows of a query.
    Rows(Rows),
    /// The row count of an `execute`.
    Affected(u64),
}

impl SqlView {
    /// `query`: the statement's rows (none for a statement that returns
    /// none). Shared by the `sql` import and the `async-sql` one.
    pub(crate) async fn rows(&self, db: &str, statement: String, params: Vec<Value>) -> Result<Rows, SqlError> {
        match self.run(db, statement, params, true).await? {
            Output::Rows(rows) => Ok(rows),
            Output::Affected(_) => Ok(Rows {
                columns: Vec::new(),
                rows: Vec::new(),
            }),
        }
    }

    /// `execute`: how many rows the statement affected (or returned).
    pub(crate) async fn affected(&self, db: &str, statement: String, params: Vec<Value>) -> Result<u64, SqlError> {
        match self.run(db, statement, params, false).await? {
            Output::Affected(count) => Ok(count),
            Output::Rows(rows) => Ok(rows.rows.len() as u64),
        }
    }
}

impl Host for SqlView {
    async fn query(&mut self, db: String, statement: String, params: Vec<Value>) -> Result<Rows, SqlError> {
        self.rows(&db, statement, params).await
    }

    async fn execute(&mut self, db: String, statement: String, params: Vec<Value>) -> Result<u64, SqlError> {
        self.affected(&db, statement, params).await
    }
}

/// Statements that would leave state on a pooled connection for the next
/// caller (another job, maybe another plugin): an open transaction, a
/// session setting, a named prepared statement, a listener, an attached
/// file. The first keyword decides, after leading blanks and comments.
const SESSION_KEYWORDS: &[&str] = &[
    "BEGIN",
    "START",
    "COMMIT",
    "END",
    "ROLLBACK",
    "ABORT",
    "SAVEPOINT",
    "RELEASE",
    "SET",
    "RESET",
    "PREPARE",
    "DEALLOCATE",
    "DISCARD",
    "LISTEN",
    "UNLISTEN",
    "ATTACH",
    "DETACH",
];

/// Refuses statements that would leave session state behind (see
/// [`SESSION_KEYWORDS`]). This is a guard against accidents, not the
/// security boundary: that is the database user in the runner's URL.
pub(crate) fn check_statement(statement: &str) -> Result<(), SqlError> {
    let keyword = crate::sql_text::first_keyword(statement);
    if SESSION_KEYWORDS.contains(&keyword.as_str()) {
        return Err(SqlError::Query(format!(
            "{keyword} statements are not allowed: each call runs on its own pooled connection in autocommit, \
             so session state (transactions, settings, prepared statements) would leak to other jobs; \
             use a single statement (a CTE, INSERT ... ON CONFLICT, a function) for atomic work"
        )));
    }
    Ok(())
}

/// Approximate cost of one value in a result: its payload plus the size of
/// the value itself, so a million NULLs count too.
const VALUE_OVERHEAD: usize = 16;

/// Counts a result as it streams in and stops it at the database's caps.
pub(crate) struct Budget<'a> {
    db: &'a str,
    settings: Settings,
    rows: usize,
    bytes: usize,
}

impl<'a> Budget<'a> {
    /// A budget for one query on `db`.
    pub(crate) fn new(db: &'a str, settings: Settings) -> Self {
        Self {
            db,
            settings,
            rows: 0,
            bytes: 0,
        }
    }

    /// Counts the column names.
    pub(crate) fn columns(&mut self, columns: &[String]) -> Result<(), SqlError> {
        self.bytes += columns.iter().map(|c| c.len() + VALUE_OVERHEAD).sum::<usize>();
        self.check()
    }

    /// Counts one more row.
    pub(crate) fn row(&mut self, row: &[Value]) -> Result<(), SqlError> {
        self.rows += 1;
        self.bytes += row.iter().map(value_size).sum::<usize>();
        self.check()
    }

    fn check(&self) -> Result<(), SqlError> {
        if self.rows > self.settings.max_rows {
            return Err(SqlError::Limit(format!(
                "the result of this query on {:?} has more than {} rows (max_rows); select fewer (LIMIT, paging)",
                self.db, self.settings.max_rows
            )));
        }
        if self.bytes > self.settings.max_bytes {
            return Err(SqlError::Limit(format!(
                "the result of this query on {:?} is larger than {} bytes (max_bytes); select fewer rows or columns",
                self.db, self.settings.max_bytes
            )));
        }
        Ok(())
    }
}

fn value_size(value: &Value) -> usize {
    VALUE_OVERHEAD
        + match value {
            Value::Text(text) => text.len(),
            Value::Blob(bytes) => bytes.len(),
            _ => 0,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_statements_are_refused_after_comments() {
        for statement in [
            "BEGIN",
            "  begin;",
            "-- c\nCOMMIT",
            "/* a /* nested */ b */ set search_path = x",
            "Rollback",
            "ATTACH DATABASE '/etc/passwd' AS p",
            "; ;BEGIN",
        ] {
            assert!(
                matches!(check_statement(statement), Err(SqlError::Query(_))),
                "{statement}"
            );
        }
        for statement in [
            "SELECT 1",
            "select begin_date from t",
            "-- BEGIN\nSELECT 1",
            "INSERT INTO settings VALUES (1)",
            "",
        ] {
            assert!(check_statement(statement).is_ok(), "{statement}");
        }
    }

    #[test]
    fn the_budget_stops_at_rows_and_bytes() {
        let settings = Settings {
            pool: 1,
            timeout: config::DEFAULT_TIMEOUT,
            max_rows: 2,
            max_bytes: 100,
            max_size: None,
        };
        let mut budget = Budget::new("db", settings);
        budget.row(&[Value::Int(1)]).unwrap();
        budget.row(&[Value::Null]).unwrap();
        assert!(matches!(budget.row(&[Value::Int(3)]), Err(SqlError::Limit(_))));
        let mut budget = Budget::new("db", settings);
        assert!(matches!(
            budget.row(&[Value::Text("x".repeat(100))]),
            Err(SqlError::Limit(m)) if m.contains("max_bytes")
        ));
    }
}
