//! Where the dashboard's job pages find the jobs: in Redis (the default:
//! Sidekiq's keys, through [`admin`]) or in the PostgreSQL store
//! (`--source`, through [`pg::admin`]). The queue and set pages, a job's
//! page, search, the overview's counts and cron's "enqueue now" call this
//! and never ask which. Processes, plugins, cron schedules, pauses and
//! counters stay in Redis with either store.
//!
//! On the PostgreSQL store the control-plane Redis is not where the jobs
//! are: when it fails or does not answer within [`CONTROL_PATIENCE`], the
//! overview and the queue pages show the store's jobs anyway, with the
//! Redis part empty and a notice saying why ([`JobStore::control`]),
//! instead of answering 500.
//!
//! A PostgreSQL row is shown as the same [`Entry`] a Redis entry is (read
//! whole up to the same bounds, a larger one by its ends), named in forms
//! by its row id; the lists are `pg::admin`'s, fenced on the row still
//! being in the list when an action reaches it.

use std::time::{Duration, Instant};

use anyhow::Result;
use redis::aio::ConnectionManager;

use super::pager;
use crate::pg::{self, Pg};
use crate::redis::admin::{self, Entry, JobSet};
use crate::redis::api::{Overview, QueueStats, Stats};
use crate::redis::bounded::Bytes;
use crate::redis::client;
use crate::redis::payload::Payload;

/// How long a page on the PostgreSQL store waits for a read from the
/// control-plane Redis before showing the jobs without it.
const CONTROL_PATIENCE: Duration = Duration::from_secs(2);

/// Where the jobs are.
pub(crate) enum JobStore {
    Redis,
    Postgres(Box<Pg>, Counts),
}

/// The PostgreSQL store's counts (a pass over its live rows), read again
/// only once ten times the last read's duration has passed: a poll of a
/// few milliseconds runs every time, one of 400 ms (a million rows) at
/// most every 4 s, however many pages poll. One read at a time.
#[derive(Default)]
pub(crate) struct Counts(tokio::sync::Mutex<Option<(Instant, Duration, pg::stats::StoreStats)>>);

impl Counts {
    async fn read(&self, pg: &Pg) -> Result<pg::stats::StoreStats> {
        let mut last = self.0.lock().await;
        if let Some((at, took, stats)) = &*last
            && at.elapsed() < *took * 10
        {
            return Ok(stats.clone());
        }
        let start = Instant::now();
        let stats = pg::stats::read(pg).await?;
        *last = Some((Instant::now(), start.elapsed(), stats.clone()));
        Ok(stats)
    }
}

/// The store's jobs by list, over every queue: the numbers the overview
/// and the queue list show.
struct Totals {
    enqueued: u64,
    scheduled: u64,
    retries: u64,
    dead: u64,
}

impl Totals {
    fn of(store: &pg::stats::StoreStats) -> Self {
        let sum = |count: fn(&pg::stats::QueueStats) -> i64| -> u64 {
            store.queues.iter().map(|q| u64::try_from(count(q)).unwrap_or(0)).sum()
        };
        Totals {
            enqueued: sum(|q| q.waiting),
            scheduled: sum(|q| q.scheduled),
            retries: sum(|q| q.retrying),
            dead: u64::try_from(store.dead).unwrap_or(0),
        }
    }
}

/// An action on chosen entries of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Into its queue now ("Retry now", "Enqueue now").
    Enqueue,
    Delete,
}

/// What an action on chosen entries did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) done: u64,
    /// No longer there (ran, moved, deleted by someone else).
    pub(super) gone: u64,
    /// Not job payloads: they can only be deleted.
    pub(super) refused: u64,
}

impl JobStore {
    /// Where the jobs are, for the pages' header: `None` for Redis.
    pub(super) fn location(&self) -> Option<String> {
        match self {
            JobStore::Redis => None,
            JobStore::Postgres(pg, _) => Some(pg.location.clone()),
        }
    }

    /// `read`'s value, a read of the control plane in Redis. On the Redis
    /// store its failure is the page's; on the PostgreSQL store a failure
    /// or a read slower than [`CONTROL_PATIENCE`] gives the empty value
    /// and the reason, for the page to show beside the store's jobs.
    pub(super) async fn control<T: Default>(
        &self,
        read: impl Future<Output = Result<T>>,
    ) -> Result<(T, Option<String>)> {
        if matches!(self, JobStore::Redis) {
            return Ok((read.await?, None));
        }
        Ok(match tokio::time::timeout(CONTROL_PATIENCE, read).await {
            Ok(Ok(value)) => (value, None),
            Ok(Err(err)) => (T::default(), Some(format!("{err:#}"))),
            Err(_) => (
                T::default(),
                Some(format!("Redis did not answer within {CONTROL_PATIENCE:?}")),
            ),
        })
    }

    /// Puts the store's queues and the sizes of its sets into `stats`
    /// (read from Redis, where the processes and counters are).
    pub(super) async fn count_into(&self, stats: &mut Stats) -> Result<()> {
        let JobStore::Postgres(pg, counts) = self else {
            return Ok(());
        };
        let store = counts.read(pg).await?;
        let mut queues: Vec<QueueStats> = store
            .queues
            .iter()
            .map(|q| QueueStats {
                name: q.name.clone(),
                size: u64::try_from(q.waiting).unwrap_or(0),
                latency_secs: q.latency_secs,
                paused: stats.control.paused.contains(&q.name),
                unreadable: None,
            })
            .collect();
        // A paused queue with no job is still listed, to be resumed.
        for name in &stats.control.paused {
            if !queues.iter().any(|q| &q.name == name) {
                queues.push(QueueStats {
                    name: name.clone(),
                    size: 0,
                    latency_secs: 0.0,
                    paused: true,
                    unreadable: None,
                });
            }
        }
        queues.sort_by(|a, b| a.name.cmp(&b.name));
        stats.queues = queues;
        let totals = Totals::of(&store);
        stats.enqueued = totals.enqueued;
        stats.scheduled = totals.scheduled;
        stats.retries = totals.retries;
        stats.dead = totals.dead;
        Ok(())
    }

    /// Puts the store's sizes into the overview's poll.
    pub(super) async fn count_overview(&self, overview: &mut Overview) -> Result<()> {
        let JobStore::Postgres(pg, counts) = self else {
            return Ok(());
        };
        let totals = Totals::of(&counts.read(pg).await?);
        overview.enqueued = totals.enqueued;
        overview.scheduled = totals.scheduled;
        overview.retries = totals.retries;
        overview.dead = totals.dead;
        Ok(())
    }

    /// `count` jobs of queue `name` from `start` (newest first).
    pub(super) async fn queue_jobs(
        &self,
        conn: &mut ConnectionManager,
        name: &str,
        start: usize,
        count: usize,
    ) -> Result<admin::Jobs> {
        match self {
            JobStore::Redis => admin::queue_jobs(conn, name, start, count).await,
            JobStore::Postgres(pg, _) => {
                let list = pg::admin::List::Queue(name.to_owned());
                Ok(jobs(
                    pg::admin::page(pg, &list, start, count, admin::LIST_MAX).await?,
                    false,
                ))
            }
        }
    }

    /// Deletes the job `key` of queue `name`, listed on `page`; its jid, or
    /// `None` when it is no longer in the queue.
    pub(super) async fn delete_queued(
        &self,
        conn: &mut ConnectionManager,
        name: &str,
        key: &str,
        page: usize,
    ) -> Result<Option<String>> {
        match self {
            JobStore::Redis => {
                // The job was on the page the form came from; pushes since
                // move it deeper and fetches move it nowhere (they take the
                // other end), so it is looked for from a page before that
                // one to a page after.
                let from = pager::start(page, admin::PAGE).saturating_sub(admin::PAGE);
                let window = (from, from + admin::PAGE * 3 - 1);
                match admin::queue_entry(conn, name, key, from, admin::PAGE * 3).await? {
                    Some(entry) if admin::delete_from_queue(conn, name, &entry, window).await? => Ok(Some(entry.jid)),
                    _ => Ok(None),
                }
            }
            JobStore::Postgres(pg, _) => {
                let list = pg::admin::List::Queue(name.to_owned());
                let Ok(id) = key.parse::<i64>() else {
                    return Ok(None);
                };
                let Some(row) = pg::admin::row(pg, &list, id, admin::LIST_MAX).await? else {
                    return Ok(None);
                };
                let jid = entry(row, false).jid;
                Ok((pg::admin::delete(pg, &list, Some(&[id])).await? == 1).then_some(jid))
            }
        }
    }

    /// Deletes every job waiting in queue `name`; how many there were.
    pub(super) async fn clear_queue(&self, conn: &mut ConnectionManager, name: &str) -> Result<u64> {
        match self {
            JobStore::Redis => admin::clear_queue(conn, name).await,
            JobStore::Postgres(pg, _) => pg::admin::delete(pg, &pg::admin::List::Queue(name.to_owned()), None).await,
        }
    }

    /// `count` jobs of `set` from `start`, those whose class contains
    /// `class` when given, and the set's size.
    pub(super) async fn set_jobs(
        &self,
        conn: &mut ConnectionManager,
        set: JobSet,
        start: usize,
        count: usize,
        class: Option<&str>,
    ) -> Result<admin::Jobs> {
        match self {
            JobStore::Redis => admin::set_jobs(conn, set, start, count, class).await,
            JobStore::Postgres(pg, _) => {
                let page = pg::admin::page(pg, &list(set), start, count, admin::LIST_MAX).await?;
                let mut jobs = jobs(page, true);
                jobs.entries.retain(|e| class.is_none_or(|c| e.class.contains(c)));
                Ok(jobs)
            }
        }
    }

    /// The entry `key` of `set`, read whole up to [`admin::ENTRY_MAX`].
    pub(super) async fn set_entry(
        &self,
        conn: &mut ConnectionManager,
        set: JobSet,
        key: &str,
    ) -> Result<Option<Entry>> {
        match self {
            JobStore::Redis => admin::set_entry(conn, set, key).await,
            JobStore::Postgres(pg, _) => match key.parse::<i64>() {
                Ok(id) => Ok(pg::admin::row(pg, &list(set), id, admin::ENTRY_MAX)
                    .await?
                    .map(|row| entry(row, true))),
                Err(_) => Ok(None),
            },
        }
    }

    /// Runs `action` on the entries `keys` of `set`.
    pub(super) async fn act(
        &self,
        conn: &mut ConnectionManager,
        set: JobSet,
        action: Action,
        keys: &[String],
    ) -> Result<Tally> {
        let mut tally = Tally::default();
        match self {
            JobStore::Redis => {
                for key in keys {
                    let Some(entry) = admin::set_entry(conn, set, key).await? else {
                        tally.gone += 1;
                        continue;
                    };
                    let ok = match action {
                        Action::Delete => admin::delete_from_set(conn, set, &entry).await?,
                        Action::Enqueue if entry.parsed => admin::enqueue_now(conn, set, &entry).await?,
                        Action::Enqueue => {
                            tally.refused += 1;
                            continue;
                        }
                    };
                    if ok { tally.done += 1 } else { tally.gone += 1 }
                }
            }
            JobStore::Postgres(pg, _) => {
                // A key that is not a row id names no row.
                let ids: Vec<i64> = keys.iter().filter_map(|k| k.parse().ok()).collect();
                tally.done = match action {
                    Action::Delete => pg::admin::delete(pg, &list(set), Some(&ids)).await?,
                    Action::Enqueue => pg::admin::run_now(pg, &list(set), Some(&ids)).await?,
                };
                tally.gone = (keys.len() as u64).saturating_sub(tally.done);
            }
        }
        Ok(tally)
    }

    /// Deletes every job of `set`; how many there were.
    pub(super) async fn clear_set(&self, conn: &mut ConnectionManager, set: JobSet) -> Result<u64> {
        match self {
            JobStore::Redis => admin::clear_set(conn, set).await,
            JobStore::Postgres(pg, _) => pg::admin::delete(pg, &list(set), None).await,
        }
    }

    /// Moves every job of `set` to its queue now; how many moved.
    pub(super) async fn enqueue_all(&self, conn: &mut ConnectionManager, set: JobSet) -> Result<u64> {
        match self {
            JobStore::Redis => enqueue_all_in_redis(conn, set).await,
            JobStore::Postgres(pg, _) => pg::admin::run_now(pg, &list(set), None).await,
        }
    }

    /// Enqueues `payload` now; returns its jid.
    pub(super) async fn push(&self, conn: &mut ConnectionManager, mut payload: Payload) -> Result<String> {
        match self {
            JobStore::Redis => {
                client::push(conn, &mut payload).await?;
                Ok(payload.jid().to_owned())
            }
            JobStore::Postgres(pg, _) => {
                let jid = payload.jid().to_owned();
                let client = pg.client().await?;
                Ok(wasmjobs_client::pg::push_payload(&**client, payload, None, None)
                    .await?
                    .unwrap_or(jid))
            }
        }
    }
}

/// Moves every job of `set` to its queue, page by page from the front
/// (each moved job leaves the set).
async fn enqueue_all_in_redis(conn: &mut ConnectionManager, set: JobSet) -> Result<u64> {
    let mut moved = 0u64;
    loop {
        let entries = admin::set_jobs(conn, set, 0, admin::PAGE, None).await?.entries;
        let mut progress = false;
        for entry in &entries {
            // A listing reads a large job by its ends: read it again
            // whole, up to what the dashboard moves.
            let entry = match entry.large {
                true => match admin::set_entry(conn, set, &entry.key).await? {
                    Some(entry) => entry,
                    None => continue,
                },
                false => entry.clone(),
            };
            if entry.parsed && admin::enqueue_now(conn, set, &entry).await? {
                moved += 1;
                progress = true;
            }
        }
        if !progress {
            return Ok(moved);
        }
    }
}

/// The store's list for a set.
fn list(set: JobSet) -> pg::admin::List {
    match set {
        JobSet::Scheduled => pg::admin::List::Scheduled,
        JobSet::Retries => pg::admin::List::Retries,
        JobSet::Dead => pg::admin::List::Dead,
    }
}

fn jobs(page: pg::admin::Page, scored: bool) -> admin::Jobs {
    admin::Jobs {
        size: page.size,
        entries: page.rows.into_iter().map(|row| entry(row, scored)).collect(),
        unreadable: None,
    }
}

/// A row shown as an entry, named by its id; a set's rows carry their time
/// as the score.
fn entry(row: pg::admin::Row, scored: bool) -> Entry {
    let bytes = match (row.text, row.ends) {
        (Some(text), _) => Bytes::Whole(text.into_bytes()),
        (None, ends) => {
            let (head, tail) = ends.unwrap_or_default();
            Bytes::Large {
                len: row.len,
                head: head.into_bytes(),
                tail: tail.into_bytes(),
            }
        }
    };
    let mut entry = Entry::of(bytes, scored.then(|| row.at.to_string()));
    entry.key = row.id.to_string();
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(text: Option<&str>, ends: Option<(&str, &str)>) -> pg::admin::Row {
        pg::admin::Row {
            id: 42,
            queue: "mail".into(),
            at: 1_700_000_000.5,
            len: 5000,
            text: text.map(str::to_owned),
            ends: ends.map(|(h, t)| (h.to_owned(), t.to_owned())),
        }
    }

    #[test]
    fn a_row_is_an_entry_named_by_its_id() {
        let shown = entry(
            row(
                Some(r#"{"class":"MailJob","args":[1],"jid":"abc","queue":"mail"}"#),
                None,
            ),
            true,
        );
        assert_eq!(shown.key, "42");
        assert_eq!(shown.jid, "abc");
        assert_eq!(shown.class, "MailJob");
        assert_eq!(shown.at, Some(1_700_000_000.5));
        assert!(shown.parsed && !shown.large);
    }

    #[test]
    fn a_large_row_is_shown_by_its_ends() {
        let shown = entry(
            row(
                None,
                Some((r#"{"class":"BigJob","args":["xxxx"#, r#"x"],"jid":"big1"}"#)),
            ),
            false,
        );
        assert_eq!(shown.key, "42");
        assert!(shown.large && !shown.parsed);
        assert_eq!(shown.size, 5000);
        assert_eq!(shown.jid, "big1");
        assert_eq!(shown.class, "BigJob");
    }
}
