//! What the dashboard reads and changes in the PostgreSQL store: a page of
//! one of its lists — a queue's due jobs, the scheduled jobs, the retries,
//! the dead — and the actions on rows of a list or on all of it (run now,
//! delete). The pages are the Redis dashboard's (`crate::web`); this module
//! hands back rows and counts and knows nothing of them.
//!
//! A list is a fixed predicate over `wasmjobs.jobs` (or `wasmjobs.dead`),
//! the same ones `wasmjobs stats --source` counts ([`super::stats`]):
//!
//! | list | rows | order of a page |
//! |---|---|---|
//! | queue *q* | unclaimed, due, in *q* | newest first |
//! | scheduled | unclaimed, due later, never failed (no `retry_count`) | soonest first |
//! | retries | unclaimed, due later after a failure | latest first |
//! | dead | `wasmjobs.dead` of kind `dead` (not the cancelled) | latest death first |
//!
//! An action names rows by id and is fenced on the predicate: a job that a
//! process claimed meanwhile, that ran, or that moved to another list is
//! not touched and is counted as gone. Nothing here reads a payload of
//! unbounded size: a row's text comes whole up to the caller's bound, else
//! as its size and ends. Values are always bound parameters; the SQL text
//! is built only from this module's constants.

use anyhow::{Context, Result};

use super::{CHANNEL, Pg};

/// One of the store's lists of jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum List {
    /// The due, unclaimed jobs of this queue.
    Queue(String),
    /// Due later, never run.
    Scheduled,
    /// Due later, after a failure.
    Retries,
    /// Died (retries exhausted, a poison pill, a payload that cannot run).
    Dead,
}

/// Bytes of a large row's start and end that are read.
pub const HEAD: i32 = 2048;
/// See [`HEAD`].
pub const TAIL: i32 = 512;

/// A row as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its id in its table: what an action names.
    pub id: i64,
    pub queue: String,
    /// Epoch seconds: when it runs (jobs) or died (dead).
    pub at: f64,
    /// Its payload's length as JSON text, in bytes.
    pub len: u64,
    /// The payload's text, when it is no longer than the bound asked for.
    pub text: Option<String>,
    /// Its first [`HEAD`] and last [`TAIL`] characters, when it is longer.
    pub ends: Option<(String, String)>,
}

/// A page of a list and the list's length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub size: u64,
    pub rows: Vec<Row>,
}

impl List {
    /// The table the list's rows are in.
    fn table(&self) -> &'static str {
        match self {
            List::Dead => "wasmjobs.dead",
            _ => "wasmjobs.jobs",
        }
    }

    /// The condition a row of the list meets; `$1` is the queue's name.
    fn condition(&self) -> &'static str {
        match self {
            List::Queue(_) => "queue = $1 AND owner IS NULL AND run_at <= now()",
            List::Scheduled => "owner IS NULL AND run_at > now() AND NOT payload ? 'retry_count'",
            List::Retries => "owner IS NULL AND run_at > now() AND payload ? 'retry_count'",
            List::Dead => "kind = 'dead'",
        }
    }

    /// `FROM … WHERE …` of the list, taking the queue's name as `$1`
    /// whatever the list ([`List::queue`]).
    fn rows(&self) -> String {
        format!(
            "FROM {} WHERE {}{}",
            self.table(),
            self.condition(),
            self.with_queue_param()
        )
    }

    fn order(&self) -> &'static str {
        match self {
            List::Queue(_) => "run_at DESC, id DESC",
            List::Scheduled => "run_at, id",
            List::Retries => "run_at DESC, id DESC",
            List::Dead => "died_at DESC, id DESC",
        }
    }

    fn time(&self) -> &'static str {
        match self {
            List::Dead => "died_at",
            _ => "run_at",
        }
    }

    /// The queue parameter (`$1`), for every list: the statements all take
    /// it, so the other parameters keep their numbers.
    fn queue(&self) -> &str {
        match self {
            List::Queue(name) => name,
            _ => "",
        }
    }

    /// `$1` unused by the predicate still has to be referred to for its
    /// type to be known; a condition that is always true does that.
    fn with_queue_param(&self) -> &'static str {
        match self {
            List::Queue(_) => "",
            _ => " AND $1::text IS NOT NULL",
        }
    }
}

/// The `SELECT` of rows of `list` chosen by `pick` (with `$3`, `$4`): each
/// row's text whole when it is at most `$2` bytes, else its ends. The text
/// is made only for the rows picked.
fn select(list: &List, pick: &str) -> String {
    format!(
        "SELECT id, queue, extract(epoch FROM {time})::float8, octet_length(t)::int8,
                CASE WHEN octet_length(t) <= $2::int8 THEN t END,
                CASE WHEN octet_length(t) > $2::int8 THEN left(t, {HEAD}) END,
                CASE WHEN octet_length(t) > $2::int8 THEN right(t, {TAIL}) END
         FROM (SELECT id, queue, {time}, payload {from} {pick}) picked
         CROSS JOIN LATERAL (SELECT payload::text AS t) text
         ORDER BY {order}",
        time = list.time(),
        from = list.rows(),
        order = list.order(),
    )
}

fn read_row(row: &tokio_postgres::Row) -> Row {
    let head: Option<String> = row.get(5);
    let tail: Option<String> = row.get(6);
    Row {
        id: row.get(0),
        queue: row.get(1),
        at: row.get(2),
        len: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
        text: row.get(4),
        ends: head.zip(tail),
    }
}

fn bound(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `count` rows of `list` from `start` in the list's order, each read whole
/// up to `max` bytes; and the list's length.
pub async fn page(pg: &Pg, list: &List, start: usize, count: usize, max: usize) -> Result<Page> {
    let client = pg.client().await?;
    let sql = select(list, &format!("ORDER BY {} LIMIT $3 OFFSET $4", list.order()));
    let rows = client
        .query(&sql, &[&list.queue(), &bound(max), &bound(count), &bound(start)])
        .await
        .with_context(|| format!("reading {list:?} from the PostgreSQL store"))?;
    let size: i64 = client
        .query_one(&format!("SELECT count(*) {}", list.rows()), &[&list.queue()])
        .await
        .with_context(|| format!("counting {list:?} in the PostgreSQL store"))?
        .get(0);
    Ok(Page {
        size: u64::try_from(size).unwrap_or(0),
        rows: rows.iter().map(read_row).collect(),
    })
}

/// The row `id` of `list`, if it is still there, read whole up to `max`.
pub async fn row(pg: &Pg, list: &List, id: i64, max: usize) -> Result<Option<Row>> {
    let client = pg.client().await?;
    let sql = select(list, "AND id = $3");
    let found = client
        .query_opt(&sql, &[&list.queue(), &bound(max), &id])
        .await
        .with_context(|| format!("reading a job of {list:?} from the PostgreSQL store"))?;
    Ok(found.as_ref().map(read_row))
}

/// Deletes the rows `ids` of `list` (every row of it when `ids` is
/// `None`); returns how many were deleted.
pub async fn delete(pg: &Pg, list: &List, ids: Option<&[i64]>) -> Result<u64> {
    let client = pg.client().await?;
    let sql = format!(
        "DELETE {from} AND ($2::int8[] IS NULL OR id = ANY($2))",
        from = list.rows(),
    );
    client
        .execute(&sql, &[&list.queue(), &ids])
        .await
        .with_context(|| format!("deleting from {list:?} in the PostgreSQL store"))
}

/// The payload a job runs again with, as Sidekiq's "Retry now" / "Add to
/// queue" write it: `enqueued_at` now, no `at`, and (`$1`: for retries and
/// dead jobs) `retry_count` one lower, so the next failure is the same
/// attempt again.
const AGAIN: &str = "(payload - 'at')
    || jsonb_build_object('enqueued_at', extract(epoch FROM clock_timestamp()))
    || CASE WHEN $1 AND jsonb_typeof(payload -> 'retry_count') = 'number'
            THEN jsonb_build_object('retry_count', greatest(floor((payload ->> 'retry_count')::numeric) - 1, 0))
            ELSE '{}'::jsonb END";

/// Makes the rows `ids` of `list` (every row when `None`) due now — they
/// run after the jobs already due in their queues, as a job pushed now
/// would — and wakes the runners at commit; returns how many moved. A
/// queue's jobs are due already: nothing moves.
pub async fn run_now(pg: &Pg, list: &List, ids: Option<&[i64]>) -> Result<u64> {
    let lower = !matches!(list, List::Scheduled);
    // `$1` is `lower` here: the lists' conditions without the queue's name.
    let sql = match list {
        List::Queue(_) => return Ok(0),
        List::Dead => format!(
            "WITH gone AS (DELETE FROM wasmjobs.dead WHERE {condition} AND ($2::int8[] IS NULL OR id = ANY($2))
                           RETURNING queue, payload)
             INSERT INTO wasmjobs.jobs (queue, payload) SELECT queue, {AGAIN} FROM gone RETURNING queue",
            condition = list.condition(),
        ),
        List::Scheduled | List::Retries => format!(
            "UPDATE wasmjobs.jobs SET run_at = now(), payload = {AGAIN}
             WHERE {condition} AND ($2::int8[] IS NULL OR id = ANY($2)) RETURNING queue",
            condition = list.condition(),
        ),
    };
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .context("moving jobs in the PostgreSQL store")?;
    let moved = tx
        .query(&sql, &[&lower, &ids])
        .await
        .with_context(|| format!("moving jobs of {list:?} to their queues"))?;
    let mut queues: Vec<String> = moved.iter().map(|row| row.get(0)).collect();
    queues.sort_unstable();
    queues.dedup();
    // Delivered at commit, as an enqueue's.
    tx.execute(
        "SELECT pg_notify($1, q) FROM unnest($2::text[]) q",
        &[&CHANNEL, &queues],
    )
    .await
    .context("waking the runners")?;
    tx.commit().await.context("moving jobs in the PostgreSQL store")?;
    Ok(moved.len() as u64)
}
