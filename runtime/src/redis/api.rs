//! The read side: what Sidekiq's `api.rb` (and so its Web UI) reports.
//!
//! `wasmjobs stats` reads Sidekiq's own keys the way Sidekiq reads them,
//! so it describes a plain Sidekiq deployment as well as a wasmjobs one
//! (the wasmjobs-only numbers — `discarded`, cancelled jobs, unique locks —
//! are then 0; `paused` is Sidekiq Pro's). Three pipelined round trips
//! whatever the number of queues and processes, plus a bounded `SCAN`
//! counting the unique-job locks. [`processes`] reads the live processes
//! alone, for `wasmjobs enqueue`.

use anyhow::{Context, Result};
use redis::Value;
use redis::aio::ConnectionLike;
use serde::Serialize;
use serde_json::Value as Json;

use super::keys;
use super::now_f64;
use super::payload::{Payload, epoch_secs};

/// Counters, set sizes, queues and live processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
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
}

/// Paused queues and cancelled jobs (`wasmjobs pause`, `wasmjobs cancel`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ControlStats {
    /// Queues in the `paused` set (Sidekiq Pro's), sorted.
    pub paused: Vec<String>,
    /// Jobs cancelled in all.
    pub cancelled: u64,
    /// Cancelled jobs kept in the cancelled set.
    pub cancelled_kept: u64,
}

/// Most keys the count of unique locks looks at (`SCAN … COUNT 1000`, so
/// at most 100 round trips); past it the count is a lower bound.
pub const MAX_SCANNED_KEYS: u64 = 100_000;

/// One queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueStats {
    /// The queue name (without `queue:`).
    pub name: String,
    /// Jobs waiting.
    pub size: u64,
    /// Seconds the oldest waiting job has waited (0 when empty).
    pub latency_secs: f64,
    /// Whether it is paused (no process fetches from it).
    pub paused: bool,
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
    /// processes only; it changes as plugins are hot-reloaded).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub plugins: std::collections::BTreeMap<String, String>,
}

/// The heartbeat fields read per process, in `ProcessSet`'s order, then ours.
const HEARTBEAT_FIELDS: [&str; 7] = ["info", "busy", "beat", "quiet", "rss", "rtt_us", "cpu"];

/// Reads the current stats. Identities in `processes` whose heartbeat hash
/// has expired are removed from the set, as Sidekiq's `ProcessSet` does.
pub async fn stats<C>(conn: &mut C) -> Result<Stats>
where
    C: ConnectionLike + Send,
{
    let (processed, failed, discarded, scheduled, retries, dead, queue_names, identities): Counters = redis::pipe()
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
    let mut queue_names: Vec<String> = queue_names.into_iter().map(lossy).collect();
    let mut identities: Vec<String> = identities.into_iter().map(lossy).collect();
    queue_names.sort();
    identities.sort();

    let mut pipe = redis::pipe();
    for name in &queue_names {
        pipe.llen(keys::queue(name)).lindex(keys::queue(name), -1);
    }
    for identity in &identities {
        pipe.cmd("HMGET").arg(identity).arg(&HEARTBEAT_FIELDS[..]);
    }
    let replies: Vec<Value> = if queue_names.is_empty() && identities.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn)
            .await
            .context("cannot read queues and heartbeats from Redis")?
    };
    let mut replies = replies.into_iter();
    let mut next = || replies.next().unwrap_or(Value::Nil);

    let control = control_stats(conn).await?;
    let now = now_f64();
    let mut queues = Vec::with_capacity(queue_names.len());
    for name in queue_names {
        let size: u64 = redis::from_redis_value(next()).with_context(|| format!("LLEN queue:{name}"))?;
        // Any bytes can be pushed: a payload that is not text has no latency.
        let oldest: Option<Vec<u8>> =
            redis::from_redis_value(next()).with_context(|| format!("LINDEX queue:{name}"))?;
        let enqueued_at = oldest
            .and_then(|raw| String::from_utf8(raw).ok())
            .and_then(|raw| Payload::parse(&raw).ok())
            .and_then(|payload| payload.time("enqueued_at"));
        let latency_secs = enqueued_at.map_or(0.0, |at| (now - at).max(0.0));
        queues.push(QueueStats {
            paused: control.paused.contains(&name),
            name,
            size,
            latency_secs,
        });
    }

    let processes = live(conn, identities, next).await?;

    let (unique_locks, unique_locks_exact) = super::unique::count_locks(conn, MAX_SCANNED_KEYS).await?;
    Ok(Stats {
        processed: counter(processed),
        failed: counter(failed),
        discarded: counter(discarded),
        scheduled,
        retries,
        dead,
        enqueued: queues.iter().map(|q| q.size).sum(),
        queues,
        processes,
        control,
        unique_locks,
        unique_locks_exact,
    })
}

/// What the dashboard's overview polls every second, per open page:
/// counters, set sizes, jobs waiting, and the live processes' busy and
/// capacity. Cheaper than [`stats`]: no queue latencies, no control
/// counters, no SCAN of unique locks; three round trips.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Overview {
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

/// The overview's first round trip: the counters as bytes (anyone can
/// write anything there), three set sizes, the queue names.
type OverviewCounters = (Option<Vec<u8>>, Option<Vec<u8>>, u64, u64, u64, Vec<Vec<u8>>);

/// Reads the [`Overview`].
pub async fn overview<C>(conn: &mut C) -> Result<Overview>
where
    C: ConnectionLike + Send,
{
    let (processed, failed, scheduled, retries, dead, queue_names): OverviewCounters = redis::pipe()
        .get(keys::STAT_PROCESSED)
        .get(keys::STAT_FAILED)
        .zcard(keys::SCHEDULE)
        .zcard(keys::RETRY)
        .zcard(keys::DEAD)
        .smembers(keys::QUEUES)
        .query_async(conn)
        .await
        .context("cannot read counters from Redis")?;
    let mut pipe = redis::pipe();
    for name in queue_names.into_iter().map(lossy) {
        pipe.llen(keys::queue(&name));
    }
    let sizes: Vec<u64> = if pipe.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn)
            .await
            .context("cannot read queue sizes from Redis")?
    };
    let processes = processes(conn).await?;
    Ok(Overview {
        processed: counter(processed),
        failed: counter(failed),
        scheduled,
        retries,
        dead,
        enqueued: sizes.iter().sum(),
        busy: processes.iter().map(|p| p.busy).sum(),
        capacity: processes.iter().map(|p| p.concurrency).sum(),
        processes: processes.len(),
    })
}

/// The live processes alone (what `wasmjobs enqueue` checks), in two
/// round trips, pruned as [`stats`] prunes them.
pub async fn processes<C>(conn: &mut C) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    let identities: Vec<Vec<u8>> = redis::cmd("SMEMBERS")
        .arg(keys::PROCESSES)
        .query_async(conn)
        .await
        .context("cannot read the process set from Redis")?;
    let mut identities: Vec<String> = identities.into_iter().map(lossy).collect();
    identities.sort();
    if identities.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for identity in &identities {
        pipe.cmd("HMGET").arg(identity).arg(&HEARTBEAT_FIELDS[..]);
    }
    let replies: Vec<Value> = pipe
        .query_async(conn)
        .await
        .context("cannot read heartbeats from Redis")?;
    let mut replies = replies.into_iter();
    live(conn, identities, || replies.next().unwrap_or(Value::Nil)).await
}

/// The processes of `identities` whose heartbeat `next` yields (one HMGET
/// reply each, in order); the others are removed from the process set.
async fn live<C>(conn: &mut C, identities: Vec<String>, mut next: impl FnMut() -> Value) -> Result<Vec<ProcessInfo>>
where
    C: ConnectionLike + Send,
{
    let mut processes = Vec::with_capacity(identities.len());
    let mut gone = Vec::new();
    for identity in identities {
        let fields: Vec<Option<Vec<u8>>> =
            redis::from_redis_value(next()).with_context(|| format!("HMGET {identity}"))?;
        let fields: Vec<Option<String>> = fields.into_iter().map(|f| f.map(lossy)).collect();
        match process_info(&identity, &fields) {
            Some(info) => processes.push(info),
            None => gone.push(identity),
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

/// Paused queues and the cancelled counters, one round trip.
async fn control_stats<C>(conn: &mut C) -> Result<ControlStats>
where
    C: ConnectionLike + Send,
{
    let (paused, cancelled, cancelled_kept): (Vec<Vec<u8>>, Option<Vec<u8>>, u64) = redis::pipe()
        .smembers(keys::PAUSED)
        .get(keys::STAT_CANCELLED)
        .zcard(keys::CANCELLED)
        .query_async(conn)
        .await
        .context("cannot read paused queues and cancelled jobs from Redis")?;
    let mut paused: Vec<String> = paused.into_iter().map(lossy).collect();
    paused.sort();
    Ok(ControlStats {
        paused,
        cancelled: counter(cancelled),
        cancelled_kept,
    })
}

/// The first pipeline's replies, as bytes: anyone can write anything into
/// these keys, and one bad value must not break `wasmjobs stats`.
type Counters = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    u64,
    u64,
    u64,
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
);

/// Bytes as text, invalid UTF-8 shown as U+FFFD.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A stat counter, read as leniently as Ruby's `to_i`.
fn counter(value: Option<Vec<u8>>) -> u64 {
    value
        .map(lossy)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map_or(0, |n| n.max(0) as u64)
}

/// A process from its `HMGET` reply; `None` when its heartbeat hash is gone.
fn process_info(identity: &str, fields: &[Option<String>]) -> Option<ProcessInfo> {
    let field = |i: usize| fields.get(i).and_then(Option::as_deref);
    let info: Json = serde_json::from_str(field(0)?).unwrap_or(Json::Null);
    let text = |key: &str| info.get(key).and_then(Json::as_str).unwrap_or_default().to_owned();
    let number = |key: &str| info.get(key).and_then(Json::as_u64).unwrap_or(0);
    let int = |i: usize| {
        field(i)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |n| n.max(0.0) as u64)
    };
    Some(ProcessInfo {
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
        started_at: info.get("started_at").and_then(Json::as_f64).map_or(0.0, epoch_secs),
        busy: int(1),
        beat: field(2)
            .and_then(|v| v.trim().parse::<f64>().ok())
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
    })
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
        )
        .expect("live process");
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
    fn a_missing_heartbeat_means_gone_and_odd_fields_are_tolerated() {
        assert!(process_info("x", &fields(&[None, None, None, None, None, None])).is_none());
        let p = process_info(
            "x",
            &fields(&[Some("not json"), Some("?"), None, Some("false"), None, None]),
        )
        .expect("hash exists");
        assert_eq!((p.busy, p.beat, p.quiet, p.pid), (0, 0.0, false, 0));
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
