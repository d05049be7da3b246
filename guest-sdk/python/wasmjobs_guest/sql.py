"""SQL on the databases the runner is connected to (``wasmjobs run --db
NAME=URL``) and the plugin's manifest grants (``sql = ["main"]``).

Each call is one statement in its own transaction, parameters bound by the
protocol (``$1`` for PostgreSQL; ``?`` for SQLite), never spliced into the
text. Python values map to SQL as None → NULL, bool, int (64-bit), float,
str → text, bytes → blob; other column types arrive as text.
"""

from dataclasses import dataclass

from componentize_py_types import Err
from wit_world.imports import sql as _sql

try:  # the async-plugin world: the same statements, awaited
    from wit_world.imports import async_sql as _async_sql
except ImportError:
    _async_sql = None


class SqlError(Exception):
    """A failed statement. ``kind`` is one of ``not-granted``,
    ``unknown-database``, ``query``, ``connection``, ``limit``, ``timeout``;
    ``connection`` and ``timeout`` are worth retrying."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass
class Rows:
    """A query's result: column names and rows of Python values."""

    columns: list
    rows: list

    def dicts(self):
        """The rows as dicts keyed by column name."""
        return [dict(zip(self.columns, row)) for row in self.rows]


def query(db, statement, *params):
    """Runs a statement that returns rows (an awaitable of them in an async plugin)."""
    values = [_to_value(p) for p in params]
    if _async_sql is not None:
        return _query_async(db, statement, values)
    try:
        return _rows(_sql.query(db, statement, values))
    except Err as error:
        raise _error(error.value) from None


def execute(db, statement, *params):
    """Runs a statement for its effect; returns the rows affected (an
    awaitable of the count in an async plugin)."""
    values = [_to_value(p) for p in params]
    if _async_sql is not None:
        return _execute_async(db, statement, values)
    try:
        return _sql.execute(db, statement, values)
    except Err as error:
        raise _error(error.value) from None


async def _query_async(db, statement, values):
    try:
        return _rows(await _async_sql.query(db, statement, values))
    except Err as error:
        raise _error(error.value) from None


async def _execute_async(db, statement, values):
    try:
        return await _async_sql.execute(db, statement, values)
    except Err as error:
        raise _error(error.value) from None


def _rows(result):
    return Rows(columns=list(result.columns), rows=[[_from_value(v) for v in row] for row in result.rows])


def _to_value(value):
    if value is None:
        return _sql.Value_Null()
    if isinstance(value, bool):
        return _sql.Value_Boolean(value)
    if isinstance(value, int):
        return _sql.Value_Int(value)
    if isinstance(value, float):
        return _sql.Value_Float(value)
    if isinstance(value, str):
        return _sql.Value_Text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _sql.Value_Blob(bytes(value))
    raise TypeError(f"cannot bind a {type(value).__name__} as an SQL parameter (use None, bool, int, float, str, bytes)")


def _from_value(value):
    return None if isinstance(value, _sql.Value_Null) else value.value


def _error(error):
    kind = type(error).__name__.removeprefix("SqlError_")
    kind = "".join("-" + c.lower() if c.isupper() else c for c in kind).lstrip("-")
    return SqlError(kind, error.value)
