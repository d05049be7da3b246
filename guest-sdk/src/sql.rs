//! SQL on the databases the runner configured, over `wasmjobs:job/sql`
//! ([`query`], [`execute`]) or, in an [`AsyncJob`](crate::AsyncJob),
//! its `async-sql` twin ([`query_async`], [`execute_async`]).
//!
//! The runner owns the databases (`wasmjobs run --db main=postgres://...
//! --db local=sqlite://local.db`) and their connection pools; a plugin only
//! names the ones it needs in its manifest:
//!
//! ```toml
//! sql = ["main"]
//! ```
//!
//! Then a job runs statements by database name. Values are always passed
//! as parameters, never pasted into the statement, so a value can never be
//! read as SQL:
//!
//! ```no_run
//! use wasmjobs_guest::{params, sql, JobError};
//!
//! # fn run(user_id: i64) -> Result<(), JobError> {
//! let rows = sql::query(
//!     "main",
//!     "SELECT id, email, last_login FROM users WHERE id = $1",
//!     &params![user_id],
//! )?;
//! for row in &rows {
//!     let id: i64 = row.get("id")?;
//!     let email: String = row.get(1)?;                // by index works too
//!     let last_login: Option<String> = row.get("last_login")?; // NULL → None
//!     wasmjobs_guest::log::info!("{id} {email} {last_login:?}");
//! }
//!
//! let changed = sql::execute("main", "UPDATE users SET seen = true WHERE id = $1", &params![user_id])?;
//! wasmjobs_guest::log::info!("{changed} row(s) updated");
//! # Ok(())
//! # }
//! ```
//!
//! # Placeholders
//!
//! PostgreSQL numbers them: `$1`, `$2`, ... SQLite accepts `?` (the next
//! parameter), `?NNN` and `$NNN` (the NNN-th), so `$1`-style statements work
//! on both; named placeholders (`:name`, `@name`) are refused. The number
//! of parameters must match the statement.
//!
//! # Values
//!
//! [`Value`] has six cases, the values both engines represent without loss.
//! PostgreSQL's other types come back as text in PostgreSQL's own format
//! (`numeric`, `json`/`jsonb`, `uuid`, dates and timestamps, timestamps with
//! time zone in UTC); other types must be cast in SQL (`col::text`). A text
//! parameter binds to any PostgreSQL type the server can parse from text
//! (`$1` for a `timestamptz` column accepts `"2024-05-01 12:00:00+00"`).
//! SQLite has no boolean: `true` is stored as 1 and comes back as an int
//! (which [`Row::get::<bool>`](Row::get) accepts).
//!
//! # Statements
//!
//! Each call is one statement, in its own transaction, on whichever pooled
//! connection is free. Transaction control (`BEGIN`, `COMMIT`, ...) and
//! session statements (`SET`, `PREPARE`, ...) are refused because the next
//! call may use another connection; put multi-step atomic work in one
//! statement (a CTE, `INSERT ... ON CONFLICT`, a database function).
//!
//! # Errors
//!
//! Every failure is an [`Error`] whose [`kind`](Error::kind) says what went
//! wrong: the manifest does not grant the database, the runner has no such
//! database, the statement failed, the connection failed, the result was
//! too large, or it took too long. With `?` it becomes a retryable
//! [`JobError`](crate::JobError); map [`ErrorKind::NotGranted`] to
//! [`JobError::dead`](crate::JobError::dead) if retrying is pointless for
//! your job.

use std::fmt;

use crate::async_bindings::wasmjobs::job::async_sql as async_wit;
use crate::bindings::wasmjobs::job::sql as wit;

/// One SQL value: a parameter or a column of a result row.
///
/// Build parameters with `Value::from` (or [`params!`](crate::params)):
/// integers, floats, `bool`, `&str`/`String`, `Vec<u8>`/`&[u8]` and `Option`
/// of any of them (`None` is SQL NULL) convert. Read values with
/// [`Row::get`] rather than matching, unless the type varies.
pub use wit::Value;

/// Runs `statement` on database `db` with `params` bound to its
/// placeholders and returns all its rows (none for a statement without a
/// result, such as an `INSERT` without `RETURNING`).
pub fn query(db: &str, statement: &str, params: &[Value]) -> Result<Rows, Error> {
    Ok(wit::query(db, statement, params)?.into())
}

/// Runs `statement` on database `db` with `params` bound to its
/// placeholders, for its effect, and returns how many rows it changed (0
/// for DDL; the number of rows for a `SELECT`).
pub fn execute(db: &str, statement: &str, params: &[Value]) -> Result<u64, Error> {
    Ok(wit::execute(db, statement, params)?)
}

/// [`query`] as a future, for an [`AsyncJob`](crate::AsyncJob): while it
/// waits, the other jobs of the instance run. Only an `AsyncJob` can use
/// it (its import, `async-sql`, is in the `async-plugin` world alone).
pub async fn query_async(db: &str, statement: &str, params: &[Value]) -> Result<Rows, Error> {
    Ok(async_wit::query(db.to_owned(), statement.to_owned(), params.to_vec())
        .await?
        .into())
}

/// [`execute`] as a future, for an [`AsyncJob`](crate::AsyncJob) (see
/// [`query_async`]).
pub async fn execute_async(db: &str, statement: &str, params: &[Value]) -> Result<u64, Error> {
    Ok(async_wit::execute(db.to_owned(), statement.to_owned(), params.to_vec()).await?)
}

/// Builds a parameter array from values of mixed types, for [`query`] and
/// [`execute`]: `&params![42, "ann", None::<i64>]`.
///
/// Each argument goes through [`Value::from`], so anything that converts
/// into a [`Value`] works; `params![]` is an empty array.
#[macro_export]
macro_rules! params {
    () => {
        [] as [$crate::sql::Value; 0]
    };
    ($($value:expr),+ $(,)?) => {
        [$($crate::sql::Value::from($value)),+]
    };
}

/// The result of a [`query`]: column names and rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    columns: Vec<String>,
    rows: Vec<Vec<Value>>,
}

impl Rows {
    /// A result built by hand, for unit-testing code that reads rows.
    pub fn new(columns: Vec<String>, rows: Vec<Vec<Value>>) -> Self {
        Rows { columns, rows }
    }

    /// The column names, in order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// How many rows there are.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Row `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<Row<'_>> {
        self.rows.get(index).map(|values| Row {
            columns: &self.columns,
            values,
        })
    }

    /// The first row, if any: handy for `SELECT ... WHERE id = $1`.
    pub fn first(&self) -> Option<Row<'_>> {
        self.get(0)
    }

    /// The rows, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Row<'_>> {
        self.rows.iter().map(|values| Row {
            columns: &self.columns,
            values,
        })
    }

    /// The raw values, row by row, for code that wants to own them.
    pub fn into_values(self) -> Vec<Vec<Value>> {
        self.rows
    }
}

/// The host's answer to a query, as the SDK's [`Rows`].
impl From<wit::Rows> for Rows {
    fn from(rows: wit::Rows) -> Self {
        Rows {
            columns: rows.columns,
            rows: rows.rows,
        }
    }
}

impl<'a> IntoIterator for &'a Rows {
    type Item = Row<'a>;
    type IntoIter = Box<dyn ExactSizeIterator<Item = Row<'a>> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// One row of [`Rows`], with typed access to its columns.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    columns: &'a [String],
    values: &'a [Value],
}

impl<'a> Row<'a> {
    /// The value of `column` (a name or a 0-based index) as a `T`:
    /// `row.get::<i64>("id")?`, `row.get::<Option<String>>(2)?`.
    ///
    /// Fails with [`ErrorKind::Column`] if there is no such column and
    /// [`ErrorKind::Type`] if the value does not convert, including NULL
    /// into anything but an `Option` or [`Value`].
    pub fn get<T: FromValue>(&self, column: impl ColumnIndex) -> Result<T, Error> {
        let index = column.index(self.columns)?;
        let value = self.value(index)?;
        T::from_value(value).map_err(|expected| {
            let found = match value {
                Value::Null => "NULL (read it as an Option)".to_owned(),
                other => format!("{} {other}", kind_name(other)),
            };
            Error::new(
                ErrorKind::Type,
                format!("column {:?}: expected {expected}, found {found}", self.columns[index]),
            )
        })
    }

    /// The raw value of `column` (a name or a 0-based index).
    pub fn value(&self, column: impl ColumnIndex) -> Result<&'a Value, Error> {
        let index = column.index(self.columns)?;
        self.values
            .get(index)
            .ok_or_else(|| Error::new(ErrorKind::Column, format!("the row has no value for column {index}")))
    }

    /// All values, in column order.
    pub fn values(&self) -> &'a [Value] {
        self.values
    }

    /// The column names, in order.
    pub fn columns(&self) -> &'a [String] {
        self.columns
    }
}

impl fmt::Display for Row<'_> {
    /// `id=1, name='ann', photo=NULL`, for log lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (column, value)) in self.columns.iter().zip(self.values).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{column}={value}")?;
        }
        Ok(())
    }
}

/// What [`Row::get`] accepts as a column: a name (`&str`, `String`) or a
/// 0-based index (`usize`).
pub trait ColumnIndex {
    /// The index of this column in `columns`, or an [`ErrorKind::Column`]
    /// error naming the columns there are.
    fn index(&self, columns: &[String]) -> Result<usize, Error>;
}

impl ColumnIndex for usize {
    fn index(&self, columns: &[String]) -> Result<usize, Error> {
        if *self < columns.len() {
            Ok(*self)
        } else {
            Err(Error::new(
                ErrorKind::Column,
                format!("no column {self}: the row has {} ({columns:?})", columns.len()),
            ))
        }
    }
}

impl ColumnIndex for &str {
    fn index(&self, columns: &[String]) -> Result<usize, Error> {
        columns
            .iter()
            .position(|c| c == self)
            .ok_or_else(|| Error::new(ErrorKind::Column, format!("no column {self:?} in {columns:?}")))
    }
}

impl ColumnIndex for String {
    fn index(&self, columns: &[String]) -> Result<usize, Error> {
        self.as_str().index(columns)
    }
}

/// Types a [`Value`] converts into, for [`Row::get`].
///
/// Integers convert when the value fits; floats also take integers; `bool`
/// also takes the ints 0 and 1 (SQLite's booleans); `Vec<u8>` also takes
/// text (its UTF-8 bytes). NULL converts only into `Option<T>` (as `None`)
/// and [`Value`].
pub trait FromValue: Sized {
    /// The converted value, or the name of the expected type (for the
    /// error message).
    fn from_value(value: &Value) -> Result<Self, &'static str>;
}

macro_rules! from_int {
    ($($int:ty),*) => {$(
        impl FromValue for $int {
            fn from_value(value: &Value) -> Result<Self, &'static str> {
                match value {
                    Value::Int(i) => <$int>::try_from(*i).map_err(|_| concat!("a value that fits in ", stringify!($int))),
                    _ => Err(stringify!($int)),
                }
            }
        }
    )*};
}
from_int!(i64, i32, i16, i8, u64, u32, u16, u8, usize, isize);

impl FromValue for f64 {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        match value {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            _ => Err("f64"),
        }
    }
}

impl FromValue for f32 {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        f64::from_value(value).map(|f| f as f32).map_err(|_| "f32")
    }
}

impl FromValue for bool {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        match value {
            Value::Boolean(b) => Ok(*b),
            Value::Int(0) => Ok(false),
            Value::Int(1) => Ok(true),
            _ => Err("bool"),
        }
    }
}

impl FromValue for String {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        match value {
            Value::Text(text) => Ok(text.clone()),
            _ => Err("String"),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        match value {
            Value::Blob(bytes) => Ok(bytes.clone()),
            Value::Text(text) => Ok(text.as_bytes().to_vec()),
            _ => Err("Vec<u8>"),
        }
    }
}

impl FromValue for Value {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        Ok(value.clone())
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: &Value) -> Result<Self, &'static str> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

macro_rules! into_value {
    ($($from:ty => |$v:ident| $make:expr),* $(,)?) => {$(
        impl From<$from> for Value {
            fn from($v: $from) -> Self {
                $make
            }
        }
    )*};
}
into_value! {
    i64 => |v| Value::Int(v),
    i32 => |v| Value::Int(v.into()),
    i16 => |v| Value::Int(v.into()),
    i8 => |v| Value::Int(v.into()),
    u32 => |v| Value::Int(v.into()),
    u16 => |v| Value::Int(v.into()),
    u8 => |v| Value::Int(v.into()),
    f64 => |v| Value::Float(v),
    f32 => |v| Value::Float(v.into()),
    bool => |v| Value::Boolean(v),
    String => |v| Value::Text(v),
    &str => |v| Value::Text(v.to_owned()),
    &String => |v| Value::Text(v.clone()),
    Vec<u8> => |v| Value::Blob(v),
    &[u8] => |v| Value::Blob(v.to_vec()),
}

impl<T: Into<Value>> From<Option<T>> for Value {
    /// `None` is SQL NULL.
    fn from(value: Option<T>) -> Self {
        value.map_or(Value::Null, Into::into)
    }
}

impl PartialEq for Value {
    /// Structural equality; as for `f64`, a NaN float equals nothing.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Boolean(a), Value::Boolean(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Text(a), Value::Text(b)) => a == b,
            (Value::Blob(a), Value::Blob(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Value {
    /// SQL-literal style, for log lines: `NULL`, `true`, `42`, `1.5`,
    /// `'it''s'`, `x'00ff'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Boolean(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Text(text) => write!(f, "'{}'", text.replace('\'', "''")),
            Value::Blob(bytes) => {
                f.write_str("x'")?;
                for byte in bytes {
                    write!(f, "{byte:02x}")?;
                }
                f.write_str("'")
            }
        }
    }
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Boolean(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Text(_) => "text",
        Value::Blob(_) => "blob",
    }
}

/// What went wrong, as the host (or [`Row::get`]) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The plugin's manifest does not grant this database (`sql = [...]`).
    NotGranted,
    /// The manifest grants it, but the runner has no database of that name.
    UnknownDatabase,
    /// The database rejected the statement or its parameters.
    Query,
    /// The database could not be reached, or the connection was lost.
    Connection,
    /// The result had more rows or bytes than the runner allows.
    Limit,
    /// The statement (or waiting for a connection) took too long.
    Timeout,
    /// [`Row::get`]: no such column.
    Column,
    /// [`Row::get`]: the value does not convert into the requested type.
    Type,
}

impl ErrorKind {
    /// The kebab-case name, as in the WIT `sql-error` (`"not-granted"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotGranted => "not-granted",
            ErrorKind::UnknownDatabase => "unknown-database",
            ErrorKind::Query => "query",
            ErrorKind::Connection => "connection",
            ErrorKind::Limit => "limit",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Column => "column",
            ErrorKind::Type => "type",
        }
    }
}

/// A SQL failure: what kind, and the host's message (which names the
/// database), e.g. `sql query error: "main": syntax error at or near
/// "SELEC" (SQLSTATE 42601)`.
///
/// With `?` in a job it becomes a retryable [`JobError`](crate::JobError).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind`, for code that wraps SQL calls.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sql {} error: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

impl From<wit::SqlError> for Error {
    fn from(error: wit::SqlError) -> Self {
        let (kind, message) = match error {
            wit::SqlError::NotGranted(m) => (ErrorKind::NotGranted, m),
            wit::SqlError::UnknownDatabase(m) => (ErrorKind::UnknownDatabase, m),
            wit::SqlError::Query(m) => (ErrorKind::Query, m),
            wit::SqlError::Connection(m) => (ErrorKind::Connection, m),
            wit::SqlError::Limit(m) => (ErrorKind::Limit, m),
            wit::SqlError::Timeout(m) => (ErrorKind::Timeout, m),
        };
        Error { kind, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobError, JobErrorKind};

    fn rows() -> Rows {
        Rows::new(
            vec![
                "id".into(),
                "name".into(),
                "score".into(),
                "flag".into(),
                "photo".into(),
            ],
            vec![vec![
                Value::Int(7),
                Value::Text("it's".into()),
                Value::Float(1.5),
                Value::Int(1),
                Value::Null,
            ]],
        )
    }

    #[test]
    fn typed_access_by_name_and_index() {
        let rows = rows();
        let row = rows.first().unwrap();
        assert_eq!(row.get::<i64>("id").unwrap(), 7);
        assert_eq!(row.get::<i32>(0).unwrap(), 7);
        assert_eq!(row.get::<u8>("id").unwrap(), 7);
        assert_eq!(row.get::<String>("name").unwrap(), "it's");
        assert_eq!(row.get::<f64>("score").unwrap(), 1.5);
        assert_eq!(row.get::<f64>("id").unwrap(), 7.0);
        assert!(row.get::<bool>("flag").unwrap());
        assert_eq!(row.get::<Option<Vec<u8>>>("photo").unwrap(), None);
        assert_eq!(row.get::<Option<i64>>("id").unwrap(), Some(7));
        assert_eq!(row.value(4).unwrap(), &Value::Null);
        assert_eq!(row.to_string(), "id=7, name='it''s', score=1.5, flag=1, photo=NULL");
        assert_eq!(rows.iter().count(), 1);
        assert_eq!((&rows).into_iter().len(), 1);
    }

    #[test]
    fn mismatches_and_missing_columns_are_clear_errors() {
        let rows = rows();
        let row = rows.first().unwrap();
        let error = row.get::<i64>("photo").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Type);
        assert!(error.message().contains("NULL (read it as an Option)"), "{error}");
        let error = row.get::<i64>("name").unwrap_err();
        assert_eq!(error.message(), "column \"name\": expected i64, found text 'it''s'");
        let error = row.get::<i64>("nope").unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Column);
        assert_eq!(row.get::<i64>(9).unwrap_err().kind(), ErrorKind::Column);
        let big = Rows::new(vec!["n".into()], vec![vec![Value::Int(300)]]);
        let error = big.first().unwrap().get::<u8>("n").unwrap_err();
        assert!(error.message().contains("fits in u8"), "{error}");
    }

    #[test]
    fn params_convert_from_rust_values() {
        let none: Option<i64> = None;
        let values = crate::params![
            42,
            7i32,
            1.5,
            true,
            "a",
            String::from("b"),
            vec![0u8, 1],
            none,
            Some("c")
        ];
        assert_eq!(
            values.to_vec(),
            vec![
                Value::Int(42),
                Value::Int(7),
                Value::Float(1.5),
                Value::Boolean(true),
                Value::Text("a".into()),
                Value::Text("b".into()),
                Value::Blob(vec![0, 1]),
                Value::Null,
                Value::Text("c".into()),
            ]
        );
        assert!(crate::params![].is_empty());
        assert_eq!(Value::Blob(vec![0, 255]).to_string(), "x'00ff'");
    }

    #[test]
    fn errors_keep_their_kind_and_become_retries() {
        let error = Error::from(wit::SqlError::NotGranted("database \"x\" is not granted".into()));
        assert_eq!(error.kind(), ErrorKind::NotGranted);
        assert_eq!(
            error.to_string(),
            "sql not-granted error: database \"x\" is not granted"
        );
        let job_error = JobError::from(error);
        assert_eq!(job_error.kind(), JobErrorKind::Retry);
        assert!(job_error.message().contains("not-granted"));
    }
}
