//! What the dashboard (`wasmjobs web`) reads and changes in Redis: the
//! jobs of a queue or of the `schedule`, `retry` and `dead` sets, the jobs
//! running in each process, and the actions on them (retry now, delete,
//! clear a queue, quiet or stop a process). Sidekiq's `api.rb` does the same
//! to the same keys, so the two dashboards agree.
//!
//! Everything here is read from keys any Redis client can write, so an
//! entry is shown for whatever bytes it holds (not UTF-8, not JSON, no
//! jid), and an action names its entry by [`Entry::key`]: the score (sets)
//! and a digest of its exact bytes, never an index that a concurrent push
//! could shift. An action removes exactly those bytes (`ZREM` / `LREM`),
//! so it never touches another job, and a job that moved meanwhile is
//! reported as gone rather than guessed at.

use anyhow::{Context, Result, bail};
use redis::aio::ConnectionLike;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::keys;
use super::now_f64;
use super::payload::Payload;

/// A sorted set of jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobSet {
    /// `schedule`: jobs to run at their score.
    Scheduled,
    /// `retry`: failed jobs waiting for their next attempt.
    Retries,
    /// `dead`: jobs out of retries.
    Dead,
}

impl JobSet {
    /// Its Redis key.
    pub fn key(self) -> &'static str {
        match self {
            JobSet::Scheduled => keys::SCHEDULE,
            JobSet::Retries => keys::RETRY,
            JobSet::Dead => keys::DEAD,
        }
    }

    /// The set named in a URL (`scheduled`, `retries`, `dead`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "scheduled" => Some(JobSet::Scheduled),
            "retries" => Some(JobSet::Retries),
            "dead" => Some(JobSet::Dead),
            _ => None,
        }
    }

    /// Its name in URLs.
    pub fn name(self) -> &'static str {
        match self {
            JobSet::Scheduled => "scheduled",
            JobSet::Retries => "retries",
            JobSet::Dead => "dead",
        }
    }
}

/// One job as stored: its bytes, and what could be read from them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// Names the entry in actions: `<score>-<digest>` in a set,
    /// `<digest>` in a queue.
    pub key: String,
    /// The score as Redis wrote it (sets only).
    pub score: Option<String>,
    /// The stored bytes, as text (invalid UTF-8 replaced).
    pub text: String,
    /// Whether the bytes are a job payload (JSON object).
    pub parsed: bool,
    /// `jid` ("" if none).
    pub jid: String,
    /// `wrapped` or `class` ("" if none).
    pub class: String,
    /// `queue` ("" if none).
    pub queue: String,
    /// The `args` array as compact JSON text ("" if none).
    pub args: String,
    /// The payload, pretty-printed (or the text as is).
    pub pretty: String,
    /// `error_class: error_message`, if it failed.
    pub error: Option<String>,
    /// `error_backtrace` / `backtrace` lines, if any were stored as a list.
    pub backtrace: Vec<String>,
    /// `retry_count`, if any.
    pub retry_count: Option<u64>,
    /// Epoch seconds: the score of a set entry, else `enqueued_at`.
    pub at: Option<f64>,
    #[serde(skip)]
    raw: Vec<u8>,
}

/// The digest that names an entry's bytes (16 hex digits of SHA-256).
fn digest(raw: &[u8]) -> String {
    hex::encode(&Sha256::digest(raw)[..8])
}

impl Entry {
    /// Reads `raw` (with its `score` in a set).
    pub fn read(raw: Vec<u8>, score: Option<String>) -> Self {
        let text = String::from_utf8_lossy(&raw).into_owned();
        let payload = std::str::from_utf8(&raw).ok().and_then(|t| Payload::parse(t).ok());
        let key = match &score {
            Some(score) => format!("{score}-{}", digest(&raw)),
            None => digest(&raw),
        };
        let at = score
            .as_deref()
            .and_then(|s| s.parse::<f64>().ok())
            .or_else(|| payload.as_ref().and_then(|p| p.time("enqueued_at")));
        let Some(payload) = payload else {
            return Self {
                key,
                score,
                pretty: text.clone(),
                text,
                parsed: false,
                jid: String::new(),
                class: String::new(),
                queue: String::new(),
                args: String::new(),
                error: None,
                backtrace: Vec::new(),
                retry_count: None,
                at,
                raw,
            };
        };
        let class = payload.str("wrapped").unwrap_or(payload.class()).to_owned();
        let args = payload.get("args").map(Value::to_string).unwrap_or_default();
        let error = match (payload.str("error_class"), payload.str("error_message")) {
            (None, None) => None,
            (class, message) => Some(format!("{}: {}", class.unwrap_or("Error"), message.unwrap_or(""))),
        };
        let backtrace = ["error_backtrace", "backtrace"]
            .iter()
            .find_map(|k| payload.get(k).and_then(Value::as_array))
            .map(|lines| {
                lines
                    .iter()
                    .map(|l| l.as_str().map_or_else(|| l.to_string(), str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let pretty = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| text.clone());
        Self {
            key,
            score,
            parsed: true,
            jid: payload.jid().to_owned(),
            queue: payload.queue().to_owned(),
            class,
            args,
            pretty,
            error,
            backtrace,
            retry_count: payload.retry_count(),
            at,
            text,
            raw,
        }
    }
}

/// Most entries one listing reads.
pub const PAGE: usize = 100;

/// The `count` newest jobs of queue `name` from `start`, and its length.
pub async fn queue_jobs<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &str,
    start: usize,
    count: usize,
) -> Result<(u64, Vec<Entry>)> {
    let key = keys::queue(name);
    let stop = (start + count.max(1) - 1) as isize;
    let (len, raws): (u64, Vec<Vec<u8>>) = redis::pipe()
        .llen(&key)
        .lrange(&key, start as isize, stop)
        .query_async(conn)
        .await
        .with_context(|| format!("cannot read queue {name:?}"))?;
    Ok((len, raws.into_iter().map(|raw| Entry::read(raw, None)).collect()))
}

/// The `count` jobs of `set` from `start` (scheduled: soonest first;
/// retries and dead: latest first), keeping those whose class contains
/// `class` when given, and the set's size.
pub async fn set_jobs<C: ConnectionLike + Send>(
    conn: &mut C,
    set: JobSet,
    start: usize,
    count: usize,
    class: Option<&str>,
) -> Result<(u64, Vec<Entry>)> {
    let look = count.max(1);
    let stop = (start + look - 1) as isize;
    let mut range = redis::cmd(if set == JobSet::Scheduled {
        "ZRANGE"
    } else {
        "ZREVRANGE"
    });
    range.arg(set.key()).arg(start as isize).arg(stop).arg("WITHSCORES");
    let (len, pairs): (u64, Vec<(Vec<u8>, String)>) = redis::pipe()
        .zcard(set.key())
        .add_command(range)
        .query_async(conn)
        .await
        .with_context(|| format!("cannot read the {} set", set.key()))?;
    let entries = pairs
        .into_iter()
        .map(|(raw, score)| Entry::read(raw, Some(score)))
        .filter(|e| class.is_none_or(|c| e.class.contains(c)))
        .collect();
    Ok((len, entries))
}

/// The entry of `set` named `key` (see [`Entry::key`]), if it is still there.
pub async fn set_entry<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, key: &str) -> Result<Option<Entry>> {
    let Some((score, _)) = key.rsplit_once('-') else {
        return Ok(None);
    };
    if score.parse::<f64>().is_ok_and(f64::is_nan) || score.parse::<f64>().is_err() {
        return Ok(None);
    }
    let pairs: Vec<(Vec<u8>, String)> = redis::cmd("ZRANGE")
        .arg(set.key())
        .arg(score)
        .arg(score)
        .arg("BYSCORE")
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .with_context(|| format!("cannot read the {} set", set.key()))?;
    Ok(pairs
        .into_iter()
        .map(|(raw, score)| Entry::read(raw, Some(score)))
        .find(|e| e.key == key))
}

/// The entry of queue `name` named `key` among its `look` jobs from
/// `start`.
pub async fn queue_entry<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &str,
    key: &str,
    start: usize,
    look: usize,
) -> Result<Option<Entry>> {
    let (_, entries) = queue_jobs(conn, name, start, look).await?;
    Ok(entries.into_iter().find(|e| e.key == key))
}

/// Moves `entry` from `set` to the front of its queue now, as Sidekiq's
/// "Retry Now" / "Add to queue" do: `retry_count` one lower (a retry set
/// entry then fails into the same attempt number), `enqueued_at` now.
/// Atomic: false when the entry was gone (another process or click took
/// it), and nothing is pushed then.
pub async fn enqueue_now<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, entry: &Entry) -> Result<bool> {
    let mut payload = match std::str::from_utf8(&entry.raw).ok().map(Payload::parse) {
        Some(Ok(payload)) => payload,
        _ => bail!("this entry is not a job payload; it can only be deleted"),
    };
    if let Some(count) = payload.retry_count()
        && set != JobSet::Scheduled
    {
        payload.set("retry_count", Value::from(count.saturating_sub(1)));
    }
    payload.set_time("enqueued_at", now_f64());
    let queue = match payload.queue() {
        "" => crate::job::DEFAULT_QUEUE.to_owned(),
        queue => queue.to_owned(),
    };
    let moved: i64 = redis::Script::new(ENQUEUE_NOW)
        .key(set.key())
        .key(keys::queue(&queue))
        .key(keys::QUEUES)
        .arg(&entry.raw[..])
        .arg(payload.to_json())
        .arg(&queue)
        .invoke_async(conn)
        .await
        .context("cannot move the job to its queue")?;
    Ok(moved == 1)
}

/// KEYS: set, queue, `queues`; ARGV: the entry's bytes, the payload to
/// push, the queue's name.
const ENQUEUE_NOW: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('SADD', KEYS[3], ARGV[3])
  redis.call('LPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
";

/// Removes `entry` from `set`; false when it was already gone.
pub async fn delete_from_set<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, entry: &Entry) -> Result<bool> {
    let removed: i64 = redis::cmd("ZREM")
        .arg(set.key())
        .arg(&entry.raw[..])
        .query_async(conn)
        .await
        .context("cannot delete the job")?;
    Ok(removed == 1)
}

/// Removes one copy of `entry` from queue `name`; false when it was gone.
pub async fn delete_from_queue<C: ConnectionLike + Send>(conn: &mut C, name: &str, entry: &Entry) -> Result<bool> {
    let removed: i64 = redis::cmd("LREM")
        .arg(keys::queue(name))
        .arg(1)
        .arg(&entry.raw[..])
        .query_async(conn)
        .await
        .context("cannot delete the job")?;
    Ok(removed >= 1)
}

/// Empties queue `name` and forgets it, as Sidekiq's `Queue#clear`;
/// returns how many jobs it held.
pub async fn clear_queue<C: ConnectionLike + Send>(conn: &mut C, name: &str) -> Result<u64> {
    let key = keys::queue(name);
    let (len, (), ()): (u64, (), ()) = redis::pipe()
        .atomic()
        .llen(&key)
        .cmd("UNLINK")
        .arg(&key)
        .cmd("SREM")
        .arg(keys::QUEUES)
        .arg(name)
        .query_async(conn)
        .await
        .with_context(|| format!("cannot clear queue {name:?}"))?;
    Ok(len)
}

/// Empties `set`; returns how many jobs it held.
pub async fn clear_set<C: ConnectionLike + Send>(conn: &mut C, set: JobSet) -> Result<u64> {
    let (len, ()): (u64, ()) = redis::pipe()
        .atomic()
        .zcard(set.key())
        .cmd("UNLINK")
        .arg(set.key())
        .query_async(conn)
        .await
        .with_context(|| format!("cannot clear the {} set", set.key()))?;
    Ok(len)
}

/// One job running in a process, from its `:work` hash.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Running {
    /// The process.
    pub identity: String,
    /// The queue it came from.
    pub queue: String,
    /// Epoch seconds it started.
    pub run_at: f64,
    /// The job.
    pub entry: Entry,
}

/// The jobs running in the processes `identities`, oldest first.
pub async fn running<C: ConnectionLike + Send>(conn: &mut C, identities: &[String]) -> Result<Vec<Running>> {
    if identities.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for identity in identities {
        pipe.cmd("HGETALL").arg(keys::work(identity));
    }
    let hashes: Vec<std::collections::HashMap<Vec<u8>, Vec<u8>>> = pipe
        .query_async(conn)
        .await
        .context("cannot read the jobs running in each process")?;
    let mut running = Vec::new();
    for (identity, work) in identities.iter().zip(hashes) {
        for value in work.into_values() {
            // `{"queue": …, "payload": <JSON text or object>, "run_at": …}`.
            let Ok(Value::Object(work)) = serde_json::from_slice::<Value>(&value) else {
                continue;
            };
            let raw = match work.get("payload") {
                Some(Value::String(text)) => text.clone().into_bytes(),
                Some(other) => other.to_string().into_bytes(),
                None => continue,
            };
            running.push(Running {
                identity: identity.clone(),
                queue: work.get("queue").and_then(Value::as_str).unwrap_or("").to_owned(),
                run_at: work.get("run_at").and_then(Value::as_f64).unwrap_or(0.0),
                entry: Entry::read(raw, None),
            });
        }
    }
    running.sort_by(|a, b| a.run_at.total_cmp(&b.run_at));
    Ok(running)
}

/// Asks process `identity` to go quiet (`TSTP`) or stop (`TERM`), as
/// Sidekiq's Web UI does: its heartbeat pops the signal within 10 s.
pub async fn signal<C: ConnectionLike + Send>(conn: &mut C, identity: &str, signal: &str) -> Result<()> {
    let key = keys::signals(identity);
    redis::pipe()
        .atomic()
        .lpush(&key, signal)
        .ignore()
        .expire(&key, 60)
        .ignore()
        .query_async::<()>(conn)
        .await
        .context("cannot signal the process")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_bytes_make_an_entry_named_by_its_digest() {
        let odd = Entry::read(vec![0xff, b'{', b'<'], Some("12.5".into()));
        assert!(!odd.parsed);
        assert_eq!(odd.text, "\u{fffd}{<");
        assert!(odd.key.starts_with("12.5-") && odd.key.len() == 5 + 16, "{}", odd.key);
        assert_eq!(odd.at, Some(12.5));
        let same = Entry::read(vec![0xff, b'{', b'<'], Some("12.5".into()));
        assert_eq!(odd.key, same.key);
        let other = Entry::read(b"x".to_vec(), Some("12.5".into()));
        assert_ne!(odd.key, other.key);
    }

    #[test]
    fn a_payload_shows_its_class_args_and_error() {
        let raw = br#"{"class":"A","wrapped":"Real","args":[1,"<b>"],"jid":"j1","queue":"q","error_class":"E","error_message":"boom","error_backtrace":["a.rb:1"],"retry_count":3,"enqueued_at":5.0}"#;
        let entry = Entry::read(raw.to_vec(), None);
        assert!(entry.parsed);
        assert_eq!(
            (entry.jid.as_str(), entry.class.as_str(), entry.queue.as_str()),
            ("j1", "Real", "q")
        );
        assert_eq!(entry.args, r#"[1,"<b>"]"#);
        assert_eq!(entry.error.as_deref(), Some("E: boom"));
        assert_eq!(entry.backtrace, ["a.rb:1"]);
        assert_eq!(entry.retry_count, Some(3));
        assert_eq!(entry.at, Some(5.0));
        assert!(entry.pretty.contains("\n"));
    }

    #[test]
    fn set_names_round_trip() {
        for set in [JobSet::Scheduled, JobSet::Retries, JobSet::Dead] {
            assert_eq!(JobSet::from_name(set.name()), Some(set));
        }
        assert_eq!(JobSet::from_name("queues"), None);
    }
}
