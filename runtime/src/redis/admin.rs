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
//!
//! Nothing here reads a whole entry of unbounded size: a listing reads an
//! entry whole up to [`LIST_MAX`] bytes and a single entry (a job's page,
//! an action) up to [`ENTRY_MAX`]; a larger one is read as its size and
//! ends ([`bounded`]), shown as a preview, named by a digest of its size
//! and ends, deleted by a script that finds it again by them inside
//! Redis, and not moved (Retry now) by the dashboard. A queue or set key
//! of another type is shown as unreadable ([`Jobs::unreadable`]).

use anyhow::{Context, Result, bail};
use redis::aio::ConnectionLike;
use serde_json::Value;

use super::bounded::{self, Bytes, Read, Unreadable, Window};
use super::keys;
use super::now_f64;
use super::payload::Payload;

/// An entry of a listing longer than this is read as its size and ends.
pub const LIST_MAX: usize = 16 << 10;
/// A single entry (a job's page, an action on it) longer than this is
/// read as its size and ends, and cannot be moved from the dashboard.
pub const ENTRY_MAX: usize = 1 << 20;

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
    /// Its length in bytes.
    pub size: u64,
    /// Whether only its ends were read (it is longer than the read's
    /// bound): `text` and `pretty` are then a preview, and `jid`,
    /// `class`, `queue` and `error` what the preview shows of them.
    pub large: bool,
    #[serde(skip)]
    bytes: Bytes,
}

impl Entry {
    /// Reads `raw` (with its `score` in a set).
    pub fn read(raw: Vec<u8>, score: Option<String>) -> Self {
        Self::of(Bytes::Whole(raw), score)
    }

    /// Reads `bytes`, whole or large (with its `score` in a set).
    pub fn of(bytes: Bytes, score: Option<String>) -> Self {
        let digest = bytes.digest(LIST_MAX);
        let key = match &score {
            Some(score) => format!("{score}-{digest}"),
            None => digest,
        };
        let size = bytes.len();
        let raw = match bytes {
            Bytes::Whole(raw) => raw,
            Bytes::Large { len, head, tail } => return Self::preview(key, score, len, head, tail),
        };
        let text = String::from_utf8_lossy(&raw).into_owned();
        let payload = std::str::from_utf8(&raw).ok().and_then(|t| Payload::parse(t).ok());
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
                size,
                large: false,
                bytes: Bytes::Whole(raw),
            };
        };
        let class = payload.job_class().to_owned();
        let args = display_args(&payload);
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
            size,
            large: false,
            bytes: Bytes::Whole(raw),
        }
    }

    /// An entry of `len` bytes of which only `head` and `tail` were read:
    /// what they show of it, never parsed as a whole.
    fn preview(key: String, score: Option<String>, len: u64, head: Vec<u8>, tail: Vec<u8>) -> Self {
        let (start, end) = (String::from_utf8_lossy(&head), String::from_utf8_lossy(&tail));
        let omitted = len.saturating_sub((head.len() + tail.len()) as u64);
        let text = format!("{start} … [{omitted} bytes not shown] … {end}");
        let sniff = |key: &str| bounded::sniff(&start, key).or_else(|| bounded::sniff(&end, key));
        let string = |key: &str| sniff(key).and_then(|v| v.as_str().map(str::to_owned));
        let error = match (string("error_class"), string("error_message")) {
            (None, None) => None,
            (class, message) => Some(format!(
                "{}: {}",
                class.as_deref().unwrap_or("Error"),
                message.as_deref().unwrap_or("")
            )),
        };
        let at = score.as_deref().and_then(|s| s.parse::<f64>().ok()).or_else(|| {
            sniff("enqueued_at")
                .and_then(|at| at.as_f64())
                .map(super::payload::epoch_secs)
        });
        Self {
            key,
            score,
            pretty: text.clone(),
            text,
            parsed: false,
            jid: string("jid").unwrap_or_default(),
            class: match string("class") {
                Some(class) if wasmjobs_client::activejob::is_wrapper(&class) => {
                    string("wrapped").filter(|w| !w.is_empty()).unwrap_or(class)
                }
                class => class.unwrap_or_default(),
            },
            queue: string("queue").unwrap_or_default(),
            args: String::new(),
            error,
            backtrace: Vec::new(),
            retry_count: sniff("retry_count").and_then(|n| n.as_u64()),
            at,
            size: len,
            large: true,
            bytes: Bytes::Large { len, head, tail },
        }
    }
}

/// A page of a queue or set.
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    /// The length of the whole queue or set.
    pub size: u64,
    /// The entries read.
    pub entries: Vec<Entry>,
    /// Why the key could not be read (another type), when it could not.
    pub unreadable: Option<Unreadable>,
}

impl Jobs {
    fn read(key: &str, read: Read<bounded::Ranged>, wanted: &str) -> Self {
        match read {
            Read::Found(ranged) => Jobs {
                size: ranged.size,
                entries: ranged
                    .entries
                    .into_iter()
                    .map(|(bytes, score)| Entry::of(bytes, score))
                    .collect(),
                unreadable: None,
            },
            Read::WrongType(found) => Jobs {
                unreadable: Some(Unreadable::wrong_type(key, &found, wanted)),
                ..Jobs::default()
            },
            Read::Missing | Read::TooMany(_) => Jobs::default(),
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
) -> Result<Jobs> {
    let key = keys::queue(name);
    let stop = (start + count.max(1) - 1) as isize;
    let read = bounded::range(conn, &key, &Window::List(start as isize, stop), LIST_MAX)
        .await
        .with_context(|| format!("cannot read queue {name:?}"))?;
    Ok(Jobs::read(&key, read, "list"))
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
) -> Result<Jobs> {
    let look = count.max(1);
    let (start, stop) = (start as isize, (start + look - 1) as isize);
    let window = if set == JobSet::Scheduled {
        Window::Rank(start, stop)
    } else {
        Window::RevRank(start, stop)
    };
    let read = bounded::range(conn, set.key(), &window, LIST_MAX)
        .await
        .with_context(|| format!("cannot read the {} set", set.key()))?;
    let mut jobs = Jobs::read(set.key(), read, "sorted set");
    jobs.entries.retain(|e| class.is_none_or(|c| e.class.contains(c)));
    Ok(jobs)
}

/// The entry of `set` named `key` (see [`Entry::key`]), if it is still
/// there; read whole up to [`ENTRY_MAX`] bytes.
pub async fn set_entry<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, key: &str) -> Result<Option<Entry>> {
    let Some((score, _)) = key.rsplit_once('-') else {
        return Ok(None);
    };
    if score.parse::<f64>().is_ok_and(f64::is_nan) || score.parse::<f64>().is_err() {
        return Ok(None);
    }
    let read = bounded::range(conn, set.key(), &Window::Score(score.to_owned()), ENTRY_MAX)
        .await
        .with_context(|| format!("cannot read the {} set", set.key()))?;
    Ok(Jobs::read(set.key(), read, "sorted set")
        .entries
        .into_iter()
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
    let jobs = queue_jobs(conn, name, start, look).await?;
    Ok(jobs.entries.into_iter().find(|e| e.key == key))
}

/// Moves `entry` from `set` to the front of its queue now, as Sidekiq's
/// "Retry Now" / "Add to queue" do: `retry_count` one lower (a retry set
/// entry then fails into the same attempt number), `enqueued_at` now.
/// Atomic: false when the entry was gone (another process or click took
/// it), and nothing is pushed then.
pub async fn enqueue_now<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, entry: &Entry) -> Result<bool> {
    let Some(raw) = entry.bytes.whole() else {
        bail!(
            "this job is {} bytes, more than the {ENTRY_MAX} the dashboard moves; delete it, or move it with Sidekiq's API",
            entry.size
        );
    };
    let mut payload = match std::str::from_utf8(raw).ok().map(Payload::parse) {
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
    let moved: i64 = redis::Script::new(super::enqueue::ENQUEUE_DUE)
        .key(set.key())
        .key(keys::queue(&queue))
        .key(keys::QUEUES)
        .arg(raw)
        .arg(payload.to_json())
        .arg(&queue)
        .invoke_async(conn)
        .await
        .context("cannot move the job to its queue")?;
    Ok(moved == 1)
}

/// Removes `entry` from `set`; false when it was already gone.
pub async fn delete_from_set<C: ConnectionLike + Send>(conn: &mut C, set: JobSet, entry: &Entry) -> Result<bool> {
    match &entry.bytes {
        Bytes::Whole(raw) => {
            let removed: i64 = redis::cmd("ZREM")
                .arg(set.key())
                .arg(&raw[..])
                .query_async(conn)
                .await
                .context("cannot delete the job")?;
            Ok(removed == 1)
        }
        Bytes::Large { len, head, tail } => {
            let score = entry.score.clone().unwrap_or_default();
            bounded::remove_large(conn, set.key(), &Window::Score(score), *len, head, tail).await
        }
    }
}

/// Removes one copy of `entry` from queue `name`, where it was found among
/// the entries `start..=stop`; false when it was gone.
pub async fn delete_from_queue<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &str,
    entry: &Entry,
    (start, stop): (usize, usize),
) -> Result<bool> {
    let key = keys::queue(name);
    match &entry.bytes {
        Bytes::Whole(raw) => {
            let removed: i64 = redis::cmd("LREM")
                .arg(&key)
                .arg(1)
                .arg(&raw[..])
                .query_async(conn)
                .await
                .context("cannot delete the job")?;
            Ok(removed >= 1)
        }
        Bytes::Large { len, head, tail } => {
            let window = Window::List(start as isize, stop as isize);
            bounded::remove_large(conn, &key, &window, *len, head, tail).await
        }
    }
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

/// Most entries read of one process's work hash (one per job it runs).
const MAX_WORK: usize = 10_000;

/// The jobs running in the processes `identities`, oldest first, and the
/// work hashes that could not be read (another type, too many entries).
/// An entry over [`LIST_MAX`] bytes is read as its ends and shown as a
/// preview.
pub async fn running<C: ConnectionLike + Send>(
    conn: &mut C,
    identities: &[String],
) -> Result<(Vec<Running>, Vec<Unreadable>)> {
    let work_keys: Vec<String> = identities.iter().map(|identity| keys::work(identity)).collect();
    let hashes = bounded::hash_all(conn, &work_keys, LIST_MAX, MAX_WORK, (bounded::HEAD, bounded::TAIL))
        .await
        .context("cannot read the jobs running in each process")?;
    let mut running = Vec::new();
    let mut unreadable = Vec::new();
    for ((identity, key), work) in identities.iter().zip(&work_keys).zip(hashes) {
        let work = match work {
            Read::Found(work) => work,
            Read::WrongType(found) => {
                unreadable.push(Unreadable::wrong_type(key, &found, "hash"));
                continue;
            }
            Read::TooMany(n) => {
                unreadable.push(Unreadable::new(key, format!("{n} entries, over {MAX_WORK}")));
                continue;
            }
            Read::Missing => continue,
        };
        for (_, value) in work {
            if let Some(job) = work_entry(identity, value) {
                running.push(job);
            }
        }
    }
    running.sort_by(|a, b| a.run_at.total_cmp(&b.run_at));
    Ok((running, unreadable))
}

/// A job from a work hash value: `{"queue": …, "payload": <JSON text or
/// object>, "run_at": …}`, or a preview of a large one.
fn work_entry(identity: &str, value: Bytes) -> Option<Running> {
    let value = match value {
        Bytes::Whole(value) => value,
        Bytes::Large { len, head, tail } => {
            let (start, end) = (String::from_utf8_lossy(&head), String::from_utf8_lossy(&tail));
            let queue = bounded::sniff(&start, "queue").and_then(|q| q.as_str().map(str::to_owned));
            let run_at = bounded::sniff(&end, "run_at").and_then(|t| t.as_f64());
            let entry = Entry::of(Bytes::Large { len, head, tail }, None);
            return Some(Running {
                identity: identity.to_owned(),
                queue: queue.unwrap_or_default(),
                run_at: run_at.unwrap_or(0.0),
                entry,
            });
        }
    };
    let Ok(Value::Object(work)) = serde_json::from_slice::<Value>(&value) else {
        return None;
    };
    let raw = match work.get("payload") {
        Some(Value::String(text)) => text.clone().into_bytes(),
        Some(other) => other.to_string().into_bytes(),
        None => return None,
    };
    Some(Running {
        identity: identity.to_owned(),
        queue: work.get("queue").and_then(Value::as_str).unwrap_or("").to_owned(),
        run_at: work.get("run_at").and_then(Value::as_f64).unwrap_or(0.0),
        entry: Entry::read(raw, None),
    })
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

/// The arguments a person reads for `payload`, as Sidekiq Web's
/// `display_args` shows them: an ActiveJob wrapper's job arguments,
/// decoded (markers removed, GlobalIDs as their strings); any other
/// payload's `args` as they are (and a wrapper's, if they do not decode).
fn display_args(payload: &Payload) -> String {
    let args = payload.get("args");
    if wasmjobs_client::activejob::is_wrapper(payload.class())
        && let Some(arguments) = args.and_then(|a| a.get(0)).and_then(|hash| hash.get("arguments"))
        && let Ok(decoded) = wasmjobs_client::activejob::decode_arguments(arguments.clone())
    {
        return decoded.to_string();
    }
    args.map(Value::to_string).unwrap_or_default()
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
        let raw = br#"{"class":"A","args":[1,"<b>"],"jid":"j1","queue":"q","error_class":"E","error_message":"boom","error_backtrace":["a.rb:1"],"retry_count":3,"enqueued_at":5.0}"#;
        let entry = Entry::read(raw.to_vec(), None);
        assert!(entry.parsed);
        assert_eq!(
            (entry.jid.as_str(), entry.class.as_str(), entry.queue.as_str()),
            ("j1", "A", "q")
        );
        assert_eq!(entry.args, r#"[1,"<b>"]"#);
        assert_eq!(entry.error.as_deref(), Some("E: boom"));
        assert_eq!(entry.backtrace, ["a.rb:1"]);
        assert_eq!(entry.retry_count, Some(3));
        assert_eq!(entry.at, Some(5.0));
        assert!(entry.pretty.contains("\n"));
    }

    /// As Sidekiq Web's `display_class` and `display_args`: an ActiveJob
    /// wrapper shows its job's class and decoded arguments; `wrapped` on
    /// another class is just a field.
    #[test]
    fn an_activejob_wrapper_shows_its_jobs_class_and_arguments() {
        let raw = br#"{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"WelcomeJob","args":[{"job_class":"WelcomeJob","arguments":[{"_aj_globalid":"gid://app/User/42"},{"tag":{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"vip"},"_aj_ruby2_keywords":["tag"]}]}],"jid":"j1","queue":"q","created_at":1764756930123}"#;
        let entry = Entry::read(raw.to_vec(), None);
        assert_eq!(entry.class, "WelcomeJob");
        assert_eq!(entry.args, r#"["gid://app/User/42",{"tag":"vip"}]"#);
        let unknown = br#"{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"W","args":[{"job_class":"W","arguments":[{"_aj_serialized":"MoneySerializer"}]}],"jid":"j2"}"#;
        let entry = Entry::read(unknown.to_vec(), None);
        assert!(
            entry.args.contains("MoneySerializer"),
            "shown as written: {}",
            entry.args
        );
        let plain = br#"{"class":"A","wrapped":"B","args":[1],"jid":"j3"}"#;
        assert_eq!(Entry::read(plain.to_vec(), None).class, "A");
    }

    #[test]
    fn a_large_entry_is_a_preview_named_as_its_whole_bytes_are() {
        let raw = format!(
            r#"{{"class":"Big","args":["{}"],"jid":"0123456789abcdef01234567","queue":"q","enqueued_at":5.5}}"#,
            "x".repeat(100_000)
        )
        .into_bytes();
        let whole = Entry::read(raw.clone(), Some("3".into()));
        let large = Entry::of(
            Bytes::Large {
                len: raw.len() as u64,
                head: raw[..bounded::HEAD].to_vec(),
                tail: raw[raw.len() - bounded::TAIL..].to_vec(),
            },
            Some("3".into()),
        );
        assert_eq!(whole.key, large.key);
        assert!(large.large && !large.parsed);
        assert_eq!(large.size, raw.len() as u64);
        assert_eq!(
            (large.class.as_str(), large.jid.as_str(), large.queue.as_str()),
            ("Big", "0123456789abcdef01234567", "q")
        );
        assert!(
            large.text.len() < 4_000 && large.text.contains("bytes not shown"),
            "{}",
            large.text
        );
        assert_eq!(Entry::of(large.bytes.clone(), None).at, Some(5.5));
    }

    #[test]
    fn set_names_round_trip() {
        for set in [JobSet::Scheduled, JobSet::Retries, JobSet::Dead] {
            assert_eq!(JobSet::from_name(set.name()), Some(set));
        }
        assert_eq!(JobSet::from_name("queues"), None);
    }
}
