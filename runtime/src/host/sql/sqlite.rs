//! SQLite: an embedded database file, the zero-setup default.
//!
//! - **Where**: `sqlite://jobs.db` lives under the runner's data directory,
//!   `sqlite:///abs/path.db` anywhere; the file (and its directory) is
//!   created at start-up if missing, so a bad path stops the runner early.
//! - **Off the async threads**: SQLite calls block, so every statement runs
//!   on tokio's blocking pool; the async side only waits.
//! - **Pooled, WAL**: `?pool=N` connections (default 4) are opened at
//!   start-up and reused. WAL journaling lets readers proceed while one
//!   writer writes; writers wait for each other up to the timeout
//!   (`busy_timeout`), with `synchronous = NORMAL`, WAL's usual pairing.
//! - **Timeouts**: a progress handler stops the statement once its deadline
//!   passes or the job waiting for it is gone (a sticky flag, so it works
//!   even if the blocking thread starts late); the guest gets a `timeout`
//!   error at once, and the connection goes back to the pool when the
//!   statement has stopped.
//! - **Contained**: a guest's SQL cannot reach other files: `ATTACH` (and
//!   `VACUUM INTO`, which attaches) is disabled by limiting attached
//!   databases to zero, extension loading is off (SQLite's default), and
//!   defensive mode forbids corrupting the file through `writable_schema`.
//! - **Nothing left for the next job**: connections are shared by the jobs
//!   of every plugin, so guest SQL is prepared under an authorizer
//!   ([`guest_authorizer`]) that refuses what would outlive the statement
//!   on its connection: pragma writes (`query_only`, `journal_mode`,
//!   `max_page_count`, ...; the schema-reading pragmas and plain pragma
//!   reads are allowed), `ATTACH`/`DETACH`, and temp tables, views,
//!   triggers and indexes (which would shadow or spy on the real ones).
//!   The host's own pragmas run with the authorizer off. A transaction a
//!   statement leaves open is rolled back before the connection is reused.
//! - **Read-only grants**: the host turns `query_only` on for the
//!   statement and off after it; the authorizer keeps the guest from
//!   changing it, and SQLite refuses every write.
//! - **Size budget** (`?max_size=64MiB`): SQLite's `max_page_count`, set on
//!   every connection (the guest cannot change it). A statement that would
//!   grow the file past it fails with `SQLITE_FULL`, which the guest gets
//!   as a `limit` error naming the budget, as it does for a full disk;
//!   the statement is rolled back and the next one works. The budget
//!   bounds the database file; the WAL beside it grows by up to the
//!   writes since the last checkpoint. A file already larger than its
//!   budget keeps its size but cannot grow.
//! - **Placeholders**: `?`, `?NNN` and `$NNN` (the N-th parameter, as in
//!   PostgreSQL, in any order); named ones (`:name`, `@name`) are refused.
//! - **Values**: SQLite's storage classes map one to one (NULL, INTEGER →
//!   int, REAL → float, TEXT → text, BLOB → blob); booleans are stored as
//!   0/1 and come back as ints; text that is not valid UTF-8 is repaired
//!   with U+FFFD.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context, Result};
use rusqlite::config::DbConfig;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, Statement, ToSql};
use tokio::sync::Semaphore;

use super::{Budget, DbSpec, Output, Settings};
use crate::bindings::sql::{Rows, SqlError, Value};

/// SQLite VM instructions between two checks of a statement's deadline.
const PROGRESS_STEPS: i32 = 1_000;

/// One SQLite database: its file, its idle connections, its settings.
pub(crate) struct Sqlite {
    name: String,
    path: PathBuf,
    settings: Settings,
    idle: Arc<Mutex<Vec<Connection>>>,
    slots: Arc<Semaphore>,
}

impl Sqlite {
    /// Creates (if needed) and opens the file of `spec`, relative paths
    /// under `data_dir`, with all the pool's connections.
    pub(crate) fn open(spec: &DbSpec, data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(&spec.target);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("--db {}: cannot create {}", spec.label(), parent.display()))?;
        }
        let connections = (0..spec.settings.pool)
            .map(|_| connect(&path, spec.settings))
            .collect::<rusqlite::Result<Vec<_>>>()
            .with_context(|| format!("--db {}: cannot open SQLite database {}", spec.label(), path.display()))?;
        Ok(Self {
            name: spec.name.clone(),
            path,
            settings: spec.settings,
            idle: Arc::new(Mutex::new(connections)),
            slots: Arc::new(Semaphore::new(spec.settings.pool)),
        })
    }

    /// Runs one statement on a pooled connection, on the blocking pool.
    /// `read_only` runs it with `query_only` on.
    pub(crate) async fn run(
        &self,
        statement: String,
        params: Vec<Value>,
        want_rows: bool,
        read_only: bool,
    ) -> Result<Output, SqlError> {
        let timeout = self.settings.timeout;
        let permit = match tokio::time::timeout(timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(SqlError::Connection(format!("{:?}: the database is closed", self.name))),
            Err(_) => {
                return Err(SqlError::Timeout(format!(
                    "{:?}: no connection became free within {timeout:?} (all {} in use; raise ?pool=N)",
                    self.name, self.settings.pool
                )));
            }
        };
        let pooled = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let connection = match pooled {
            Some(connection) => connection,
            // Only after a statement panicked and took its connection along:
            // open a replacement (quick, rare, so not worth a thread hop).
            None => connect(&self.path, self.settings).map_err(|e| error(&self.name, self.settings, e))?,
        };
        let deadline = Instant::now() + timeout;
        let cancel = Cancel(Arc::new(AtomicBool::new(false)));
        let cancelled = cancel.0.clone();
        let idle = self.idle.clone();
        let name = self.name.clone();
        let settings = self.settings;
        let task = tokio::task::spawn_blocking(move || {
            let mut connection = connection;
            let stop = move || cancelled.load(Ordering::Relaxed) || Instant::now() >= deadline;
            let prepared = connection
                .progress_handler(PROGRESS_STEPS, Some(stop))
                .and_then(|()| connection.pragma_update(None, "query_only", read_only))
                .and_then(|()| connection.authorizer(Some(guest_authorizer)));
            let output = match prepared {
                Ok(()) => execute(&connection, &name, settings, &statement, &params, want_rows),
                Err(e) => Err(error(&name, settings, e)),
            };
            let clean = connection
                .authorizer(None::<fn(AuthContext<'_>) -> Authorization>)
                .and_then(|()| connection.progress_handler(0, None::<fn() -> bool>))
                .and_then(|()| {
                    if connection.is_autocommit() {
                        Ok(())
                    } else {
                        // Never hand an open transaction to the next job.
                        connection.execute_batch("ROLLBACK")
                    }
                })
                .and_then(|()| connection.pragma_update(None, "query_only", false));
            match clean {
                Ok(()) => idle.lock().unwrap_or_else(PoisonError::into_inner).push(connection),
                // Closed rather than reused in an unknown state; the next
                // caller opens a replacement.
                Err(e) => tracing::warn!(db = %name, "closing a connection that could not be reset: {e}"),
            }
            drop(permit);
            output
        });
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(output)) => output,
            Ok(Err(join)) => Err(SqlError::Query(format!(
                "{:?}: the statement failed: {join}",
                self.name
            ))),
            // `cancel` is dropped on return and stops the statement.
            Err(_) => Err(SqlError::Timeout(format!(
                "{:?}: the statement took longer than {timeout:?} and was interrupted",
                self.name
            ))),
        }
    }
}

/// Stops the statement still running for a call when dropped: on a
/// timeout, or when the job waiting for it is gone.
struct Cancel(Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Opens one connection, configured as the module docs describe.
fn connect(path: &Path, settings: Settings) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)?;
    connection.busy_timeout(settings.timeout)?;
    let _mode: String = connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    connection.execute_batch("PRAGMA synchronous = NORMAL")?;
    connection.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    if let Some(max_size) = settings.max_size {
        let page_size: i64 = connection.query_row("PRAGMA page_size", [], |row| row.get(0))?;
        let max_size = i64::try_from(max_size).unwrap_or(i64::MAX);
        let pages = (max_size / page_size.max(1)).max(1);
        let _pages: i64 = connection.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |row| row.get(0))?;
    }
    Ok(connection)
}

/// Pragmas that only describe the schema or the file, allowed with an
/// argument (a table or index name, a row limit).
const INFO_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "collation_list",
    "function_list",
    "module_list",
    "pragma_list",
    "compile_options",
];

/// The authorizer of guest statements (see the module docs): refuses what
/// would change the connection for the next job. A refusal fails the
/// statement at prepare time with "not authorized".
fn guest_authorizer(context: AuthContext<'_>) -> Authorization {
    match context.action {
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let name = pragma_name.to_ascii_lowercase();
            if pragma_value.is_none() || INFO_PRAGMAS.contains(&name.as_str()) {
                Authorization::Allow
            } else {
                Authorization::Deny
            }
        }
        AuthAction::Attach { .. }
        | AuthAction::Detach { .. }
        | AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempIndex { .. } => Authorization::Deny,
        AuthAction::CreateVtable { .. } if context.database_name == Some("temp") => Authorization::Deny,
        _ => Authorization::Allow,
    }
}

/// Prepares, binds and runs one statement (on a blocking thread).
fn execute(
    connection: &Connection,
    name: &str,
    settings: Settings,
    statement: &str,
    params: &[Value],
    want_rows: bool,
) -> Result<Output, SqlError> {
    let fail = |e| error(name, settings, e);
    // Prepared afresh each time: it takes microseconds, and a cached
    // statement would keep a stale column list after `ALTER TABLE`.
    let mut prepared = connection.prepare(statement).map_err(fail)?;
    bind(&mut prepared, params).map_err(|message| SqlError::Query(format!("{name:?}: {message}")))?;
    let width = prepared.column_count();
    if width == 0 {
        // `changes()` keeps the count of the last INSERT/UPDATE/DELETE, so
        // after DDL it would be stale: only trust it if rows really changed.
        let before = connection.total_changes();
        let mut affected = prepared.raw_execute().map_err(fail)?;
        if connection.total_changes() == before {
            affected = 0;
        }
        return Ok(if want_rows {
            Output::Rows(Rows {
                columns: Vec::new(),
                rows: Vec::new(),
            })
        } else {
            Output::Affected(affected as u64)
        });
    }
    let columns: Vec<String> = prepared.column_names().map(str::to_owned).collect();
    let mut budget = Budget::new(name, settings);
    budget.columns(&columns)?;
    let mut rows = Vec::new();
    let mut count = 0u64;
    let mut cursor = prepared.raw_query();
    while let Some(row) = cursor.next().map_err(fail)? {
        count += 1;
        if want_rows {
            let values = (0..width)
                .map(|i| row.get_ref(i).map(value))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(fail)?;
            budget.row(&values)?;
            rows.push(values);
        }
    }
    Ok(if want_rows {
        Output::Rows(Rows { columns, rows })
    } else {
        Output::Affected(count)
    })
}

/// Binds `params` to the statement's placeholders: `?` takes the next
/// number, `?NNN` and `$NNN` the NNN-th parameter. Every parameter given
/// must be used, and every placeholder must have one, as in PostgreSQL.
fn bind(statement: &mut Statement<'_>, params: &[Value]) -> Result<(), String> {
    let mut highest = 0;
    for index in 1..=statement.parameter_count() {
        let number = match statement.parameter_name(index) {
            None => index,
            Some(name) => name
                .strip_prefix(['?', '$'])
                .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse().ok())
                .ok_or_else(|| format!("named parameter {name} is not supported: use ?, ?NNN or $NNN"))?,
        };
        let value = params
            .get(number.wrapping_sub(1))
            .ok_or_else(|| format!("the statement uses parameter {number} but {} were given", params.len()))?;
        statement
            .raw_bind_parameter(index, Param(value))
            .map_err(|e| e.to_string())?;
        highest = highest.max(number);
    }
    if params.len() > highest {
        return Err(format!(
            "the statement takes {highest} parameters but {} were given",
            params.len()
        ));
    }
    Ok(())
}

/// A WIT value bound to a SQLite parameter, without copying.
struct Param<'a>(&'a Value);

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Boolean(b) => ValueRef::Integer(i64::from(*b)),
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Float(f) => ValueRef::Real(*f),
            Value::Text(text) => ValueRef::Text(text.as_bytes()),
            Value::Blob(bytes) => ValueRef::Blob(bytes),
        }))
    }
}

fn value(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Float(f),
        ValueRef::Text(text) => Value::Text(String::from_utf8_lossy(text).into_owned()),
        ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
    }
}

/// A SQLite error as the guest sees it.
fn error(name: &str, settings: Settings, error: rusqlite::Error) -> SqlError {
    let message = format!("{name:?}: {error}");
    match error.sqlite_error_code() {
        // Both the size budget (max_page_count) and a full disk (ENOSPC)
        // give SQLITE_FULL; the statement was rolled back.
        Some(ErrorCode::DiskFull) => SqlError::Limit(match settings.max_size {
            Some(max_size) => format!(
                "{name:?}: the database is at its size limit (max_size={max_size} bytes) or the disk is full; \
                 the statement was rolled back: delete rows or raise max_size"
            ),
            None => format!("{name:?}: the disk holding the database is full; the statement was rolled back"),
        }),
        Some(ErrorCode::AuthorizationForStatementDenied) => SqlError::Query(format!(
            "{message}: statements may not change pragmas, attach files or create temp objects \
             (they would outlive the statement on a shared connection)"
        )),
        Some(ErrorCode::OperationInterrupted) => SqlError::Timeout(message),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            SqlError::Timeout(format!("{message} (waited for another writer until the timeout)"))
        }
        Some(ErrorCode::CannotOpen | ErrorCode::NotADatabase | ErrorCode::SystemIoFailure) => {
            SqlError::Connection(message)
        }
        _ if matches!(error, rusqlite::Error::MultipleStatement) => {
            SqlError::Query(format!("{name:?}: one statement per call"))
        }
        _ => SqlError::Query(message),
    }
}
