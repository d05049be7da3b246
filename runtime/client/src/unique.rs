//! Unique jobs, with Sidekiq Enterprise's semantics under our own key.
//!
//! A job pushed with `unique_for` (seconds) is not pushed again while one
//! with the same class, queue and args (or the same explicit key) holds the
//! lock: from its push until it succeeds, is discarded, dies or is dropped
//! (or, with `unique_until: "start"`, until it starts), and for at most
//! `unique_for` (a scheduled job: its delay plus `unique_for`). A job
//! waiting in `retry` keeps it.
//!
//! **The lock** is a STRING `wasmjobs:unique:<digest>` holding the owner's
//! jid, with a TTL. [`PUSH`] takes it with `SET … NX PX` and, in the same
//! script, pushes the job (`LPUSH` + `SADD queues`, or `ZADD schedule`):
//! Redis runs scripts one at a time, so of any number of concurrent pushes
//! of the same job exactly one gets in, and a lock is never held by a job
//! that was not pushed.
//!
//! **The digest** is the SHA-256 (lowercase hex) of a canonical encoding:
//! the compact JSON text of `["wasmjobs-unique-v1", class, queue, args]`,
//! or `["wasmjobs-unique-v1", "key", KEY]` for an explicit key, where
//! objects at any depth have their keys sorted (by bytes) and strings and
//! numbers are written as `serde_json` writes them. So `{"a":1,"b":2}` and
//! `{"b":2,"a":1}` are the same args, while `1` and `1.0` are not (nor are
//! they in Ruby). JSON arrays keep the parts apart: no class/queue/args
//! split can collide with another.
//!
//! **The payload** carries Enterprise's fields, `unique_for` (integer
//! seconds) and `unique_until` (`"start"`; absent means success), plus
//! ours, [`LOCK_FIELD`] (the lock key) and, for an explicit key,
//! [`KEY_FIELD`]. The runner releases the lock named in the payload
//! without recomputing it, but trusts nothing in it: [`Lock::from_payload`]
//! accepts only a key under [`keys::UNIQUE_PREFIX`] followed by exactly 64
//! lowercase hex digits, and [`RELEASE`] deletes it only if it still holds
//! that job's jid (compare-and-delete in one script). A forged payload can
//! at most delete a lock that names the jid it carries.

use std::time::Duration;

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::keys;
use crate::payload::Payload;

/// Payload field naming the lock key (ours; Enterprise's key is not documented).
pub const LOCK_FIELD: &str = "unique_lock";
/// Payload field holding an explicit unique key, for people reading the job.
pub const KEY_FIELD: &str = "unique_key";
/// Version tag of the digest's encoding (changing the encoding changes it).
const DIGEST_VERSION: &str = "wasmjobs-unique-v1";
/// Longest payload [`Lock::from_payload`] reads (a lock field deeper in a
/// bigger payload is not looked for; its lock then just expires).
const MAX_SCANNED: usize = 16 * 1024 * 1024;

/// When a unique job's lock is released, besides expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UniqueUntil {
    /// When the job succeeds, is discarded, dies or is dropped (default).
    #[default]
    Success,
    /// When the job starts (Sidekiq Enterprise 1.6's `unique_until: :start`).
    Start,
}

impl std::str::FromStr for UniqueUntil {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        match text {
            "success" => Ok(UniqueUntil::Success),
            "start" => Ok(UniqueUntil::Start),
            _ => anyhow::bail!("expected start or success"),
        }
    }
}

/// Takes the lock KEYS[1] for jid ARGV[1] for ARGV[2] ms (`SET NX PX`);
/// if taken, pushes ARGV[3]: with ARGV[4] == "schedule", `ZADD` to KEYS[2]
/// at score ARGV[6]; else `LPUSH` to the queue KEYS[2] and `SADD` ARGV[5]
/// to the queue set KEYS[3]. Returns `{1}` if pushed, else
/// `{0, owner jid, PTTL}` (nothing written).
pub const PUSH: &str = r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
end
if ARGV[4] == 'schedule' then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[3])
else
  redis.call('LPUSH', KEYS[2], ARGV[3])
  redis.call('SADD', KEYS[3], ARGV[5])
end
return {1}
"#;

/// Deletes the lock KEYS[1] if it holds the jid ARGV[1]. Returns 1 if it did.
pub const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// What became of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// The job is in its queue (or the schedule) under this jid.
    Enqueued {
        /// The new job's id.
        jid: String,
    },
    /// A unique job whose lock another job holds: nothing was written.
    Duplicate {
        /// The jid of the job holding the lock.
        jid: String,
        /// How long the lock still lives (`None`: no expiry, which only a
        /// lock written by something else than wasmjobs has).
        ttl: Option<Duration>,
    },
}

impl Pushed {
    /// The new job's id, or the one of the job holding the lock.
    pub fn jid(&self) -> &str {
        match self {
            Pushed::Enqueued { jid } | Pushed::Duplicate { jid, .. } => jid,
        }
    }

    /// Whether the push was refused as a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Pushed::Duplicate { .. })
    }
}

/// A unique job's lock: its key and the jid that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    key: String,
    jid: String,
}

impl Lock {
    /// The lock for `payload` (class, queue, args), or for an explicit `key`.
    pub fn for_job(payload: &Payload, key: Option<&str>) -> Self {
        let digest = match key {
            Some(key) => digest(&[DIGEST_VERSION.into(), "key".into(), key.into()]),
            None => digest(&[
                DIGEST_VERSION.into(),
                payload.class().into(),
                payload.queue().into(),
                canonical(payload.get("args").unwrap_or(&Value::Null)),
            ]),
        };
        Self {
            key: keys::unique(&digest),
            jid: payload.jid().to_owned(),
        }
    }

    /// The Redis key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The jid of the job it belongs to.
    pub fn jid(&self) -> &str {
        &self.jid
    }

    /// Writes the unique fields into `payload`.
    pub(crate) fn mark(&self, payload: &mut Payload, unique_for_secs: u64, until: UniqueUntil) {
        payload.set("unique_for", Value::from(unique_for_secs));
        if until == UniqueUntil::Start {
            payload.set("unique_until", Value::String("start".into()));
        }
        payload.set(LOCK_FIELD, Value::String(self.key.clone()));
    }

    /// The lock a payload (the text a worker fetched) says it holds, and
    /// when to release it; `None` for a job that is not unique, or whose
    /// lock field is not a lock key wasmjobs writes (see the module docs).
    /// Cheap for the common case: a payload without the field is not parsed.
    pub fn from_payload(raw: &str) -> Option<(Self, UniqueUntil)> {
        if raw.len() > MAX_SCANNED || !raw.contains(LOCK_FIELD) {
            return None;
        }
        #[derive(Deserialize)]
        struct Fields<'a> {
            #[serde(borrow, default)]
            unique_lock: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default)]
            jid: Option<std::borrow::Cow<'a, str>>,
            #[serde(default)]
            unique_until: Option<Value>,
        }
        let fields: Fields = serde_json::from_str(raw).ok()?;
        let key = fields.unique_lock?;
        let jid = fields.jid.filter(|jid| !jid.is_empty())?;
        let digest = key.strip_prefix(keys::UNIQUE_PREFIX)?;
        if digest.len() != 64 || !digest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let until = match fields.unique_until {
            Some(Value::String(s)) if s == "start" => UniqueUntil::Start,
            _ => UniqueUntil::Success,
        };
        Some((
            Self {
                key: key.into_owned(),
                jid: jid.into_owned(),
            },
            until,
        ))
    }

    /// Adds the compare-and-delete of this lock to `pipe` (a `MULTI`, say:
    /// the outcome transaction of the job).
    pub fn stage_release(&self, pipe: &mut redis::Pipeline) {
        pipe.cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(&self.key)
            .arg(&self.jid)
            .ignore();
    }

    /// Releases the lock now if this job still holds it; returns whether it did.
    pub async fn release<C>(&self, conn: &mut C) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        let released: i64 = redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(&self.key)
            .arg(&self.jid)
            .query_async(conn)
            .await
            .with_context(|| format!("cannot release the unique lock {}", self.key))?;
        Ok(released == 1)
    }
}

/// Pushes `payload` holding `lock` for `ttl`, now or (with `at`, epoch
/// seconds) into the schedule, in one script ([`PUSH`]); nothing is written
/// for a duplicate. For a scheduled job the lock lives `at − now + ttl`.
pub async fn push<C>(conn: &mut C, payload: &mut Payload, lock: &Lock, ttl: Duration, at: Option<f64>) -> Result<Pushed>
where
    C: ConnectionLike + Send,
{
    let now = crate::now_f64();
    let delay = at.map_or(0.0, |at| (at - now).max(0.0));
    let ttl_ms = (ttl.as_secs_f64() + delay) * 1000.0;
    let ttl_ms = ttl_ms.ceil().clamp(1.0, 9e15) as u64;
    let mut invocation = redis::cmd("EVAL");
    invocation.arg(PUSH).arg(3).arg(lock.key());
    match at {
        Some(at) => {
            payload.remove("enqueued_at");
            invocation
                .arg(keys::SCHEDULE)
                .arg(keys::QUEUES)
                .arg(lock.jid())
                .arg(ttl_ms)
                .arg(payload.to_json())
                .arg("schedule")
                .arg(payload.queue())
                .arg(at);
        }
        None => {
            payload.set_time("enqueued_at", now);
            invocation
                .arg(keys::queue(payload.queue()))
                .arg(keys::QUEUES)
                .arg(lock.jid())
                .arg(ttl_ms)
                .arg(payload.to_json())
                .arg("push")
                .arg(payload.queue())
                .arg(0);
        }
    }
    let reply: Vec<redis::Value> = invocation
        .query_async(conn)
        .await
        .with_context(|| format!("cannot push unique job {} to Redis", payload.jid()))?;
    match reply.as_slice() {
        [redis::Value::Int(1)] => Ok(Pushed::Enqueued {
            jid: payload.jid().to_owned(),
        }),
        [redis::Value::Int(0), owner, pttl] => {
            let owner: Option<String> = redis::from_redis_value_ref(owner).ok();
            let pttl: i64 = redis::from_redis_value_ref(pttl).unwrap_or(-1);
            Ok(Pushed::Duplicate {
                jid: owner.unwrap_or_default(),
                ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            })
        }
        other => anyhow::bail!("unexpected reply from the unique push script: {other:?}"),
    }
}

/// Counts the unique locks held now with `SCAN … MATCH wasmjobs:unique:*`,
/// looking at most at `max_keys` keys (about; `COUNT 1000` per call).
/// Returns the count and whether the scan finished (else it is a lower bound).
pub async fn count_locks<C>(conn: &mut C, max_keys: u64) -> Result<(u64, bool)>
where
    C: ConnectionLike + Send,
{
    let pattern = format!("{}*", keys::UNIQUE_PREFIX);
    let mut cursor = 0u64;
    let mut found = 0u64;
    let mut looked = 0u64;
    loop {
        let (next, batch): (u64, Vec<redis::Value>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .context("cannot count the unique locks (SCAN)")?;
        found += batch.len() as u64;
        looked += 1000;
        cursor = next;
        if cursor == 0 {
            return Ok((found, true));
        }
        if looked >= max_keys {
            return Ok((found, false));
        }
    }
}

/// SHA-256 hex of the compact JSON array of `parts`.
fn digest(parts: &[Value]) -> String {
    let text = Value::Array(parts.to_vec()).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `value` with the keys of every object sorted (by bytes), at any depth.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), canonical(v)))
                    .collect::<Map<_, _>>(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn payload(class: &str, queue: &str, args: Value) -> Payload {
        Payload::new(class, args.as_array().cloned().unwrap_or_default(), queue, 1.0)
    }

    fn key(class: &str, queue: &str, args: Value) -> String {
        Lock::for_job(&payload(class, queue, args), None).key
    }

    #[test]
    fn the_digest_ignores_key_order_and_nothing_else() {
        let a = key("X", "q", json!([{"a": 1, "b": {"d": [1, {"z": 0, "y": 1}], "c": 2}}]));
        let b = key("X", "q", json!([{"b": {"c": 2, "d": [1, {"y": 1, "z": 0}]}, "a": 1}]));
        assert_eq!(a, b);
        assert!(a.starts_with("wasmjobs:unique:") && a.len() == 16 + 64, "{a}");
        for other in [
            key("Y", "q", json!([{"a": 1}])),
            key("X", "r", json!([{"a": 1}])),
            key("X", "q", json!([{"a": 1.0}])),
            key("X", "q", json!([{"a": "1"}])),
            key("X", "q", json!([[1], 2])),
            key("X", "q", json!([[1, 2]])),
        ] {
            assert_ne!(other, key("X", "q", json!([{"a": 1}])));
            assert_ne!(other, a);
        }
        // No class/queue split collides: the parts are JSON strings.
        assert_ne!(key("a\",\"b", "c", json!([])), key("a", "b\",\"c", json!([])));
    }

    #[test]
    fn the_digest_is_stable() {
        // Other implementations (and later versions) must compute the same
        // key: this is sha256 of ["wasmjobs-unique-v1","X","q",[1,{"a":2,"b":1}]].
        let text = r#"["wasmjobs-unique-v1","X","q",[1,{"a":2,"b":1}]]"#;
        let expected = format!("wasmjobs:unique:{}", hex::encode(Sha256::digest(text.as_bytes())));
        assert_eq!(key("X", "q", json!([1, {"b": 1, "a": 2}])), expected);
    }

    #[test]
    fn an_explicit_key_ignores_class_queue_and_args() {
        let a = Lock::for_job(&payload("X", "q", json!([1])), Some("user-7"));
        let b = Lock::for_job(&payload("Y", "r", json!([2])), Some("user-7"));
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, Lock::for_job(&payload("X", "q", json!([1])), Some("user-8")).key);
        assert_ne!(a.key, Lock::for_job(&payload("X", "q", json!([1])), None).key);
    }

    #[test]
    fn a_payload_names_its_lock_and_only_a_real_lock_key_is_read() {
        let mut p = payload("X", "q", json!([1]));
        let lock = Lock::for_job(&p, None);
        lock.mark(&mut p, 60, UniqueUntil::Start);
        assert_eq!(
            Lock::from_payload(&p.to_json()),
            Some((lock.clone(), UniqueUntil::Start))
        );
        let mut plain = payload("X", "q", json!(["unique_lock"]));
        assert_eq!(Lock::from_payload(&plain.to_json()), None);
        let digest = "a".repeat(64);
        for forged in [
            json!("queue:default"),
            json!("wasmjobs:unique:"),
            json!(format!("wasmjobs:unique:{}", "A".repeat(64))),
            json!(format!("wasmjobs:unique:{}", "a".repeat(63))),
            json!(format!("wasmjobs:unique:{digest}x")),
            json!(format!("wasmjobs:unique:../{}", "a".repeat(61))),
            json!(format!("xwasmjobs:unique:{digest}")),
            json!(["wasmjobs:unique:"]),
            json!(1),
        ] {
            plain.set(LOCK_FIELD, forged.clone());
            assert_eq!(Lock::from_payload(&plain.to_json()), None, "{forged}");
        }
        plain.set(LOCK_FIELD, json!(format!("wasmjobs:unique:{digest}")));
        let (read, until) = Lock::from_payload(&plain.to_json()).expect("a well-formed key");
        assert_eq!(
            (read.key(), read.jid(), until),
            (lock_key(&digest).as_str(), plain.jid(), UniqueUntil::Success)
        );
        assert_eq!(Lock::from_payload("not json unique_lock"), None);
        assert_eq!(
            Lock::from_payload(&format!(
                r#"{{"class":"X","args":[],"unique_lock":"wasmjobs:unique:{digest}"}}"#
            )),
            None,
            "no jid, nothing to compare with"
        );
    }

    fn lock_key(digest: &str) -> String {
        keys::unique(digest)
    }

    #[test]
    fn unique_until_parses() {
        assert_eq!("start".parse::<UniqueUntil>().unwrap(), UniqueUntil::Start);
        assert_eq!("success".parse::<UniqueUntil>().unwrap(), UniqueUntil::Success);
        assert!("end".parse::<UniqueUntil>().is_err());
    }
}
