//! The read side: what Sidekiq's `api.rb` (and so its Web UI) reports.
//!
//! `wasmjobs stats` reads Sidekiq's own keys the way Sidekiq reads them,
//! so it describes a plain Sidekiq deployment as well as a wasmjobs one
//! (the wasmjobs-only numbers — `discarded`, cancelled jobs, unique locks —
//! are then 0; `paused` is Sidekiq Pro's). Three pipelined round trips
//! whatever the number of queues and processes, plus a bounded `SCAN`
//! counting the unique-job locks. [`processes`] reads the live processes
//! alone, for `wasmjobs enqueue`.
//!
//! Whatever another client wrote is read without failing the rest: a key
//! of another type counts as empty and is listed in [`Stats::unreadable`]
//! (no pipeline lets one `WRONGTYPE` reply fail the others); a process
//! record is listed however odd its fields ([`ProcessInfo::problem`] says
//! what could not be read), its heartbeat fields read only up to 64 KiB
//! each; and a queue's oldest job, read for its latency, is read inside
//! Redis and only its ends come back when it is large
//! ([`super::bounded`]).

use anyhow::{Context, Result};
use redis::Value;
use redis::aio::ConnectionLike;
use serde::Serialize;
use serde_json::Value as Json;

use super::bounded::{self, Bytes, Read, Unreadable, Window};
use super::keys;
use super::now_f64;
use super::payload::{Payload, epoch_secs};

/// Counters, set sizes, queues and live processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Stats {
    /// Jobs processed (Sidekiq counts failures as processed too).
    pub processed: u64,
    /// Jobs that failed.
    pub failed: u64,
    /// Jobs discarded at the guest's request (wasmjobs only).
    pub discarded: u64,
    /// Size of the `schedule` set.
    pub scheduled: u64,
    /// Size of the `retry` set.
    pub retries: u64,
    /// Size of the `dead` set.
    pub dead: u64,
    /// Jobs waiting in all queues.
    pub enqueued: u64,
    /// Every queue in `queues`, by name.
    pub queues: Vec<QueueStats>,
    /// Live processes (with a heartbeat), by identity.
    pub processes: Vec<ProcessInfo>,
    /// Control: paused queues and cancelled jobs.
    pub control: ControlStats,
    /// Unique-job locks held now (`wasmjobs:unique:*`, counted by a
    /// bounded SCAN: a lower bound when `unique_locks_exact` is false).
    pub unique_locks: u64,
    /// Whether the SCAN finished ([`MAX_SCANNED_KEYS`]).
    pub unique_locks_exact: bool,
    /// Keys that could not be read (another type than Sidekiq's, written
    /// by some other client), counted as empty; absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
    /// Queues in Redis with jobs that no live process reads (the fleet
    /// reads another store: [`super::stranded`]); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stranded: Vec<super::stranded::Stranded>,
}

/// Paused queues and cancelled jobs (`wasmjobs pause`, `wasmjobs cancel`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ControlStats {
    /// Queues in the `paused` set (Sidekiq Pro's), sorted.
    pub paused: Vec<String>,
    /// Jobs cancelled in all.
    pub cancelled: u64,
    /// Cancelled jobs kept in the cancelled set.
    pub cancelled_kept: u64,
    /// Cancel requests still open ([`keys::CANCELS_OPEN`], unexpired):
    /// while there is one, every fetch looks each job's request up.
    pub cancel_requests_open: u64,
}

/// Most keys the count of unique locks looks at (`SCAN … COUNT 1000`, so
/// at most 100 round trips); past it the count is a lower bound.
pub(crate) const MAX_SCANNED_KEYS: u64 = 100_000;

/// The oldest job of a queue is read whole up to this size, for its
/// `enqueued_at`; a larger one only by its ends (where Sidekiq writes it).
const MAX_OLDEST_BYTES: usize = 64 << 10;

/// A heartbeat field longer than this is not read (Sidekiq's `info` is a
/// few hundred bytes).
pub(crate) const MAX_HEARTBEAT_FIELD_BYTES: usize = 64 << 10;

/// One queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct QueueStats {
    /// The queue name (without `queue:`).
    pub name: String,
    /// Jobs waiting.
    pub size: u64,
    /// Seconds the oldest waiting job has waited (0 when empty).
    pub latency_secs: f64,
    /// Whether it is paused (no process fetches from it).
    pub paused: bool,
    /// Why `queue:NAME` could not be read (a key of another type); absent
    /// when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// One live worker process, from its heartbeat hash.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProcessInfo {
    /// `hostname:pid:nonce`, the key of the heartbeat hash.
    pub identity: String,
    /// Host it runs on.
    pub hostname: String,
    /// Its process id.
    pub pid: u64,
    /// Its tag (often the app name).
    pub tag: String,
    /// Jobs it runs at once.
    pub concurrency: u64,
    /// Queues it fetches from.
    pub queues: Vec<String>,
    /// Start time, epoch seconds.
    pub started_at: f64,
    /// Jobs running now.
    pub busy: u64,
    /// Last heartbeat, epoch seconds.
    pub beat: f64,
    /// Whether it stopped fetching (TSTP).
    pub quiet: bool,
    /// Resident memory, KiB.
    pub rss_kb: u64,
    /// Redis round-trip time measured by the process, microseconds.
    pub rtt_us: u64,
    /// Percent of one core it used between its last two beats (wasmjobs
    /// processes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    /// Its Sidekiq (or wasmjobs) version, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Plugin name → version id of the plugins it has loaded now (wasmjobs
    /// processes only, empty for the others; it changes as plugins are
    /// hot-reloaded).
    pub plugins: std::collections::BTreeMap<String, String>,
    /// The store it reads jobs from when that is not Redis (a wasmjobs
    /// runner on `--source` says so in its `info`; see [`super::stranded`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// What could not be read of its heartbeat (no `info`, `info` not a
    /// JSON object or too large), when something could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The heartbeat fields read per process, in `ProcessSet`'s order, then ours.
const HEARTBEAT_FIELDS: [&str; 7] = ["info", "busy", "beat", "quiet", "rss", "rtt_us", "cpu"];

/// Collects what could not be read while reading the rest.
#[derive(Debug, Default)]
struct Damage(Vec<Unreadable>);

impl Damage {
    /// The value of one pipeline reply, or `default` (noting why).
    fn take<T: redis::FromRedisValue>(&mut self, key: &str, wanted: &str, value: Value, default: T) -> T {
        match bounded::reply(value) {
            Ok(value) => value,
            Err(why) => {
                self.0.push(Unreadable::new(key, format!("not a {wanted}: {why}")));
                default
            }
        }
    }
}

/// Reads the current stats. Identities in `processes` whose heartbeat hash
/// has expired are removed from the set, as Sidekiq's `ProcessSet` does.
/// A key of another type (or a member that is not one of ours) is counted
/// as empty and listed in [`Stats::unreadable`]; a queue's oldest job is
/// never read whole beyond [`MAX_OLDEST_BYTES`].
pub(crate) async fn stats<C>(conn: &mut C) -> Result<Stats>
where
    C: ConnectionLike + Send,
{
    let replies: Vec<Value> = redis::pipe()
        .ignore_errors()
        .get(keys::STAT_PROCESSED)
        .get(keys::STAT_FAILED)
        .get(keys::STAT_DISCARDED)
        .zcard(keys::SCHEDULE)
        .zcard(keys::RETRY)
        .zcard(keys::DEAD)
        .smembers(keys::QUEUES)
        .smembers(keys::PROCESSES)
        .query_async(conn)
        .await
        .context("cannot read counters and sets from Redis")?;
    let mut damage = Damage::default();
    let mut replies = replies.into_iter();
    let mut next = || replies.next().unwrap_or(Value::Nil);
    let processed = counter(damage.take(keys::STAT_PROCESSED, "counter", next(), None));
    let failed = counter(damage.take(keys::STAT_FAILED, "counter", next(), None));
    let discarded = counter(damage.take(keys::STAT_DISCARDED, "counter", next(), None));
    let scheduled: u64 = damage.take(keys::SCHEDULE, "sorted set", next(), 0);
    let retries: u64 = damage.take(keys::RETRY, "sorted set", next(), 0);
    let dead: u64 = damage.take(keys::DEAD, "sorted set", next(), 0);
    let queue_names: Vec<Vec<u8>> = damage.take(keys::QUEUES, "set", next(), Vec::new());
    let identities: Vec<Vec<u8>> = damage.take(keys::PROCESSES, "set", next(), Vec::new());
    let mut queue_names: Vec<String> = queue_names.into_iter().map(lossy).collect();
    queue_names.sort();

    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for name in &queue_names {
        pipe.add_command(bounded::range_cmd(
            &keys::queue(name),
            &Window::List(-1, -1),
            MAX_OLDEST_BYTES,
        ));
    }
    let (identities, heartbeats) = heartbeats_cmd(identities);
    if let Some(heartbeats) = heartbeats {
        pipe.add_command(heartbeats);
    }
    let replies: Vec<Value> = if pipe.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn)
            .await
            .context("cannot read queues and heartbeats from Redis")?
    };
    let mut replies = replies.into_iter();

    let control = control_stats(conn, &mut damage).await?;
    let now = now_f64();
    let mut queues = Vec::with_capacity(queue_names.len());
    for name in queue_names {
        let key = keys::queue(&name);
        let (size, oldest, unreadable) = match bounded::parse_range(replies.next().unwrap_or(Value::Nil), false) {
            Ok(Read::Found(ranged)) => (ranged.size, ranged.entries.into_iter().next().map(|(b, _)| b), None),
            Ok(Read::WrongType(found)) => (0, None, Some(Unreadable::wrong_type(&key, &found, "list"))),
            Ok(_) => (0, None, None),
            Err(why) => (0, None, Some(Unreadable::new(&key, why))),
        };
        let latency_secs = oldest
            .as_ref()
            .and_then(enqueued_at)
            .map_or(0.0, |at| (now - at).max(0.0));
        if let Some(unreadable) = &unreadable {
            damage.0.push(unreadable.clone());
        }
        queues.push(QueueStats {
            paused: control.paused.contains(&name),
            name,
            size,
            latency_secs,
            unreadable: unreadable.map(|u| u.why),
        });
    }

    let heartbeats = match replies.next() {
        Some(reply) => bounded::parse_hash_fields(reply, identities.len())?,
        None => Vec::new(),
    };
    let processes = live(conn, identities, heartbeats, &mut damage).await?;

    let (unique_locks, unique_locks_exact) = super::unique::count_locks(conn, MAX_SCANNED_KEYS).await?;
    Ok(Stats {
        processed,
        failed,
        discarded,
        scheduled,
        retries,
        dead,
        enqueued: queues.iter().map(|q| q.size).sum(),
        stranded: super::stranded::stranded(&queues, &processes),
        queues,
        processes,
        control,
        unique_locks,
        unique_locks_exact,
        unreadable: damage.0,
    })
}

/// The `enqueued_at` of a job, from its bytes or (a large one) from its
/// ends; any bytes can be pushed, and a payload that is not a job has none.
fn enqueued_at(job: &Bytes) -> Option<f64> {
    match job {
        Bytes::Whole(raw) => std::str::from_utf8(raw)
            .ok()
            .and_then(|raw| Payload::parse(raw).ok())
            .and_then(|payload| payload.time("enqueued_at")),
        Bytes::Large { tail, head, .. } => [tail, head].into_iter().find_map(|part| {
            bounded::sniff(&String::from_utf8_lossy(part), "enqueued_at")
                .and_then(|at| at.as_f64())
                .map(epoch_secs)
        }),
    }
}

/// What the dashboard's overview polls every second, per open page:
/// counters, set sizes, jobs waiting, and the live processes' busy and
/// capacity. Cheaper than [`stats`]: no queue latencies, no control
/// counters, no SCAN of unique locks; three round trips.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Overview {
    /// `stat:processed`.
    pub processed: u64,
    /// `stat:failed`.
    pub failed: u64,
    /// Size of `schedule`.
    pub scheduled: u64,
    /// Size of `retry`.
    pub retries: u64,
    /// Size of `dead`.
    pub dead: u64,
    /// Jobs waiting in all queues.
    pub enqueued: u64,
    /// Jobs running in all live processes.
    pub busy: u64,
    /// Their summed concurrency.
    pub capacity: u64,
    /// Live processes.
    pub processes: usize,
}

/// Reads the [`Overview`]; keys of another type count as empty.
pub(crate) async fn overview<C>(conn: &mut C) -> Result<Overview>
where
    C: ConnectionLike + Send,
{
    let replies: Vec<Value> = redis::pipe()
        .ignore_errors()
        .get(keys::STAT_PROCESSED)
        .get(keys::STAT_FAILED)
        .zcard(keys::SCHEDULE)
        .zcard(keys::RETRY)
        .zcard(keys::DEAD)
        .smembers(keys::QUEUES)
        .query_async(conn)
        .await
        .context("cannot read counters from Redis")?;
    let mut damage = Damage::default();
    let mut replies = replies.into_iter();
    let mut next = || replies.next().unwrap_or(Value::Nil);
    let processed = counter(damage.take(keys::STAT_PROCESSED, "counter", next(), None));
    let failed = counter(damage.take(keys::STAT_FAILED, "counter", next(), None));
    let scheduled: u64 = damage.take(keys::SCHEDULE, "sorted set", next(), 0);
    let retries: u64 = damage.take(keys::RETRY, "sorted set", next(), 0);
    let dead: u64 = damage.take(keys::DEAD, "sorted set", next(), 0);
    let queue_names: Vec<Vec<u8>> = damage.take(keys::QUEUES, "set", next(), Vec::new());
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for name in queue_names.into_iter().map(lossy) {
        pipe.llen(keys::queue(&name));
    }
    let sizes: Vec<Value> = if pipe.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn)
            .await
            .context("cannot read queue sizes from Redis")?
    };
    let enqueued = sizes
        .into_iter()
        .filter_map(|size| bounded::reply::<u64>(size).ok())
        .sum();
    let processes = processes(conn).await?;
    Ok(Overview {
        processed,
        failed,
        scheduled,
        retries,
        dead,
        enqueued,
        busy: processes.iter().map(|p| p.busy).sum(),
        capacity: processes.iter().map(|p| p.concurrency).sum(),
        processes: processes.len(),
    })
}

/// The members of `processes` (none if another client left a key of
/// another type there), in one round trip: what tells a reader whether
/// any process has started since it last read the records.
pub(crate) async fn process_identities<C>(conn: &mut C) -> Result<Vec<Vec<u8>>>
where
    C: ConnectionLike + Send,
{
    Ok(
        bounded::tolerate(redis::cmd("SMEMBERS").arg(keys::PROCESSES).query_async(conn).await)
            .context("cannot read the process set from Redis")?
            .unwrap_or_default(),
    )
}

/// The live processes alone (what `wasmjobs enqueue` checks), in two
/// round trips, pruned as [`stats`] prunes them.
pub(crate) async fn processes<C>(conn: &mut C) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    Ok(process_records(conn).await?.0)
}

/// The live processes, and the members of `processes` that are not
/// heartbeat hashes (keys of another type), in two round trips.
pub(crate) async fn process_records<C>(conn: &mut C) -> Result<(Vec<ProcessInfo>, Vec<Unreadable>)>
where
    C: ConnectionLike + Send,
{
    let mut damage = Damage::default();
    let identities = match bounded::tolerate(redis::cmd("SMEMBERS").arg(keys::PROCESSES).query_async(conn).await)
        .context("cannot read the process set from Redis")?
    {
        Ok(identities) => identities,
        Err(why) => {
            damage
                .0
                .push(Unreadable::new(keys::PROCESSES, format!("not a set: {why}")));
            Vec::new()
        }
    };
    let processes = records_of(conn, identities, &mut damage).await?;
    Ok((processes, damage.0))
}

/// The live processes among `identities` (members of `processes` the
/// caller read), in one round trip, pruned as [`stats`] prunes them.
pub(crate) async fn processes_of<C>(conn: &mut C, identities: Vec<Vec<u8>>) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    records_of(conn, identities, &mut Damage::default()).await
}

/// The heartbeats of `identities`, read and pruned; members that are not
/// heartbeat hashes are noted in `damage`.
async fn records_of<C>(conn: &mut C, identities: Vec<Vec<u8>>, damage: &mut Damage) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    let (identities, cmd) = heartbeats_cmd(identities);
    let Some(cmd) = cmd else {
        return Ok(Vec::new());
    };
    let reply: Value = cmd
        .query_async(conn)
        .await
        .context("cannot read heartbeats from Redis")?;
    let heartbeats = bounded::parse_hash_fields(reply, identities.len())?;
    live(conn, identities, heartbeats, damage).await
}

/// `identities` sorted (as text), and the command reading their
/// heartbeats (none when there are none).
fn heartbeats_cmd(mut identities: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Option<redis::Cmd>) {
    identities.sort_by(|a, b| String::from_utf8_lossy(a).cmp(&String::from_utf8_lossy(b)));
    let cmd = (!identities.is_empty())
        .then(|| bounded::hash_fields_cmd(&identities, &HEARTBEAT_FIELDS, MAX_HEARTBEAT_FIELD_BYTES));
    (identities, cmd)
}

/// The processes of `identities` whose heartbeat hash exists (`heartbeats`,
/// in order); those whose hash is gone are removed from the process set,
/// those whose key is of another type are noted in `damage`.
async fn live<C>(
    conn: &mut C,
    identities: Vec<Vec<u8>>,
    heartbeats: Vec<Read<bounded::Fields>>,
    damage: &mut Damage,
) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    let mut processes = Vec::with_capacity(identities.len());
    let mut gone = Vec::new();
    for (identity, heartbeat) in identities.into_iter().zip(heartbeats) {
        match heartbeat {
            Read::Found(fields) => {
                let mut problem = None;
                let fields: Vec<Option<String>> = fields
                    .into_iter()
                    .zip(HEARTBEAT_FIELDS)
                    .map(|(field, name)| match field {
                        Some(Bytes::Whole(bytes)) => Some(lossy(bytes)),
                        Some(Bytes::Large { len, .. }) => {
                            problem.get_or_insert(format!(
                                "its {name} is {len} bytes, over {MAX_HEARTBEAT_FIELD_BYTES}: not read"
                            ));
                            None
                        }
                        None => None,
                    })
                    .collect();
                let mut info = process_info(&lossy(identity), &fields);
                if problem.is_some() {
                    info.problem = problem;
                }
                processes.push(info);
            }
            Read::WrongType(found) => damage
                .0
                .push(Unreadable::wrong_type(&identity, &found, "heartbeat hash")),
            Read::Missing | Read::TooMany(_) => gone.push(identity),
        }
    }
    if !gone.is_empty() {
        redis::cmd("SREM")
            .arg(keys::PROCESSES)
            .arg(&gone)
            .exec_async(conn)
            .await
            .context("cannot prune processes without a heartbeat")?;
    }
    Ok(processes)
}

/// Paused queues, the cancelled counters and the open cancel requests,
/// one round trip.
async fn control_stats<C>(conn: &mut C, damage: &mut Damage) -> Result<ControlStats>
where
    C: ConnectionLike + Send,
{
    let replies: Vec<Value> = redis::pipe()
        .ignore_errors()
        .smembers(keys::PAUSED)
        .get(keys::STAT_CANCELLED)
        .zcard(keys::CANCELLED)
        .zcount(keys::CANCELS_OPEN, format!("({}", super::now_f64()), "+inf")
        .query_async(conn)
        .await
        .context("cannot read paused queues and cancelled jobs from Redis")?;
    let mut replies = replies.into_iter();
    let mut next = || replies.next().unwrap_or(Value::Nil);
    let paused: Vec<Vec<u8>> = damage.take(keys::PAUSED, "set", next(), Vec::new());
    let cancelled = counter(damage.take(keys::STAT_CANCELLED, "counter", next(), None));
    let cancelled_kept: u64 = damage.take(keys::CANCELLED, "sorted set", next(), 0);
    let cancel_requests_open: u64 = damage.take(keys::CANCELS_OPEN, "sorted set", next(), 0);
    let mut paused: Vec<String> = paused.into_iter().map(lossy).collect();
    paused.sort();
    Ok(ControlStats {
        paused,
        cancelled,
        cancelled_kept,
        cancel_requests_open,
    })
}

/// Whether queue `name` is paused, and why that could not be read when
/// `paused` is not a set (then: not paused).
pub(crate) async fn is_paused<C>(conn: &mut C, name: &str) -> Result<(bool, Option<Unreadable>)>
where
    C: ConnectionLike + Send,
{
    let answer = bounded::tolerate(
        redis::cmd("SISMEMBER")
            .arg(keys::PAUSED)
            .arg(name)
            .query_async(conn)
            .await,
    )
    .context("cannot read the paused set")?;
    Ok(match answer {
        Ok(paused) => (paused, None),
        Err(why) => (false, Some(Unreadable::new(keys::PAUSED, format!("not a set: {why}")))),
    })
}

/// Bytes as text, invalid UTF-8 shown as U+FFFD.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A stat counter, read as leniently as Ruby's `to_i`.
pub(super) fn counter(value: Option<Vec<u8>>) -> u64 {
    value
        .map(lossy)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map_or(0, |n| n.max(0) as u64)
}

/// A process from the fields of its heartbeat hash (which exists), however
/// odd: a field missing or of another JSON type reads as empty, and what
/// could not be read at all is said in [`ProcessInfo::problem`].
fn process_info(identity: &str, fields: &[Option<String>]) -> ProcessInfo {
    let field = |i: usize| fields.get(i).and_then(Option::as_deref);
    let (info, problem) = match field(0).map(serde_json::from_str::<Json>) {
        None => (Json::Null, Some("no info in its heartbeat".to_owned())),
        Some(Ok(info @ Json::Object(_))) => (info, None),
        Some(Ok(_)) => (Json::Null, Some("its info is not a JSON object".to_owned())),
        Some(Err(_)) => (Json::Null, Some("its info is not JSON".to_owned())),
    };
    let text = |key: &str| info.get(key).and_then(Json::as_str).unwrap_or_default().to_owned();
    let number = |key: &str| info.get(key).and_then(Json::as_u64).unwrap_or(0);
    let int = |i: usize| {
        field(i)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|n| n.is_finite())
            .map_or(0, |n| n.max(0.0) as u64)
    };
    ProcessInfo {
        identity: identity.to_owned(),
        hostname: text("hostname"),
        pid: number("pid"),
        tag: text("tag"),
        concurrency: number("concurrency"),
        queues: info
            .get("queues")
            .and_then(Json::as_array)
            .map(|queues| queues.iter().filter_map(Json::as_str).map(str::to_owned).collect())
            .unwrap_or_default(),
        started_at: info
            .get("started_at")
            .and_then(Json::as_f64)
            .filter(|t| t.is_finite())
            .map_or(0.0, epoch_secs),
        busy: int(1),
        beat: field(2)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|t| t.is_finite())
            .map_or(0.0, epoch_secs),
        quiet: field(3) == Some("true"),
        rss_kb: int(4),
        rtt_us: int(5),
        cpu_percent: field(6)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|cpu| cpu.is_finite())
            .map(|cpu| cpu.max(0.0)),
        version: info.get("version").and_then(Json::as_str).map(str::to_owned),
        plugins: info
            .get("plugins")
            .and_then(Json::as_object)
            .map(|plugins| {
                plugins
                    .iter()
                    .filter_map(|(name, version)| Some((name.clone(), version.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default(),
        store: info
            .get("store")
            .and_then(Json::as_str)
            .filter(|store| *store != "redis")
            .map(str::to_owned),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(values: &[Option<&str>]) -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_owned)).collect()
    }

    #[test]
    fn heartbeats_are_read_like_sidekiqs_process_set() {
        let info = r#"{"hostname":"h","started_at":1764500000.5,"pid":42,"tag":"app","concurrency":10,"queues":["default","low"],"identity":"h:42:abc","version":"6.4.1"}"#;
        let p = process_info(
            "h:42:abc",
            &fields(&[
                Some(info),
                Some("3"),
                Some("1764500100.25"),
                Some("true"),
                Some("51200"),
                Some("87"),
            ]),
        );
        assert_eq!(
            (p.hostname.as_str(), p.pid, p.tag.as_str(), p.concurrency),
            ("h", 42, "app", 10)
        );
        assert_eq!(p.queues, ["default", "low"]);
        assert_eq!(
            (p.busy, p.beat, p.quiet, p.rss_kb, p.rtt_us),
            (3, 1_764_500_100.25, true, 51_200, 87)
        );
        assert_eq!(p.version.as_deref(), Some("6.4.1"));
        assert_eq!(p.started_at, 1_764_500_000.5);
    }

    #[test]
    fn odd_heartbeats_are_listed_with_what_is_wrong() {
        let p = process_info("x", &fields(&[None, None, None, None, None, None]));
        assert_eq!(p.problem.as_deref(), Some("no info in its heartbeat"));
        let p = process_info(
            "x",
            &fields(&[Some("not json"), Some("?"), None, Some("false"), None, None]),
        );
        assert_eq!((p.busy, p.beat, p.quiet, p.pid), (0, 0.0, false, 0));
        assert_eq!(p.problem.as_deref(), Some("its info is not JSON"));
        let p = process_info("x", &fields(&[Some("[1]"), Some("1e999"), Some("NaN")]));
        assert_eq!((p.busy, p.beat), (0, 0.0));
        assert_eq!(p.problem.as_deref(), Some("its info is not a JSON object"));
        let odd = r#"{"hostname":5,"pid":"12","concurrency":-3,"queues":"default","started_at":"x","plugins":["a"],"version":7}"#;
        let p = process_info("x", &fields(&[Some(odd)]));
        assert_eq!(
            (p.hostname.as_str(), p.pid, p.concurrency, p.started_at),
            ("", 0, 0, 0.0)
        );
        assert!(p.queues.is_empty() && p.plugins.is_empty() && p.version.is_none() && p.problem.is_none());
        let plugins = r#"{"plugins":{"a":"v1","b":2}}"#;
        let p = process_info("x", &fields(&[Some(plugins)]));
        assert_eq!(p.plugins, [("a".to_owned(), "v1".to_owned())].into());
    }

    #[test]
    fn millisecond_timestamps_and_counters() {
        assert_eq!(epoch_secs(1_764_500_000_500.0), 1_764_500_000.5);
        assert_eq!(epoch_secs(1_764_500_000.5), 1_764_500_000.5);
        assert_eq!(counter(Some(b"12".to_vec())), 12);
        assert_eq!(counter(Some(b"-3".to_vec())), 0);
        assert_eq!(counter(Some(b"\xff1".to_vec())), 0);
        assert_eq!(counter(None), 0);
    }
}
