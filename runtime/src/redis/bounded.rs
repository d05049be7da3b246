//! Reading keys that any Redis client can write, whatever they hold.
//!
//! A Sidekiq process, another wasmjobs version, a script or an attacker
//! can put a key of another type where a list or a hash is expected, or a
//! 100 MB value where a job payload of a few hundred bytes is. A view or
//! a loop that reads such keys must neither fail as a whole (one
//! `WRONGTYPE` in a pipeline fails every reply of it unless the pipeline
//! says [`redis::Pipeline::ignore_errors`]) nor transfer the whole value.
//! What is here does both in Redis, in one Lua call per read:
//!
//! - [`hash_fields`] and [`hash_all`]: named fields, or every field, of
//!   several hashes; a value over a bound comes back as its size (and, if
//!   asked, its first and last bytes), never whole (`HSTRLEN` first);
//! - [`range_cmd`] / [`parse_range`]: a window of a list or sorted set,
//!   with its length, each entry over the bound as its size and ends;
//! - [`remove_large`]: removes such an entry, found again by its size and
//!   ends, without it leaving Redis.
//!
//! A key of another type is reported as [`Read::WrongType`], a missing
//! one as [`Read::Missing`]; callers show it as unreadable ([`Unreadable`])
//! and go on with the rest. [`reply`] does the same for one reply of a
//! pipeline sent with `ignore_errors`, and [`tolerate`] for one command.
//! Lua copies an entry it reads inside Redis (there is no `LRANGE` of a
//! part of an entry), but nothing over the bound crosses the network.

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisResult, ToRedisArgs, Value};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Bytes kept of the start of a value over its bound.
pub const HEAD: usize = 2048;
/// Bytes kept of its end (where Sidekiq writes `jid` and `enqueued_at`).
pub const TAIL: usize = 512;

/// A value as read: whole, or only its size and ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bytes {
    /// All of it.
    Whole(Vec<u8>),
    /// Over the bound: its length and its first [`HEAD`] and last
    /// [`TAIL`] bytes (empty when not asked for).
    Large {
        /// Its length in bytes.
        len: u64,
        /// Its first bytes.
        head: Vec<u8>,
        /// Its last bytes.
        tail: Vec<u8>,
    },
}

impl Bytes {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Bytes::Whole(bytes) => bytes.len() as u64,
            Bytes::Large { len, .. } => *len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole bytes, if they were read.
    pub fn whole(&self) -> Option<&[u8]> {
        match self {
            Bytes::Whole(bytes) => Some(bytes),
            Bytes::Large { .. } => None,
        }
    }

    /// A name for these bytes that does not depend on how much of them was
    /// read: 16 hex digits of SHA-256 of the bytes when they are at most
    /// `small` long, else of their length and ends ([`HEAD`], [`TAIL`]).
    pub fn digest(&self, small: usize) -> String {
        let mut hash = Sha256::new();
        match self {
            Bytes::Whole(bytes) if bytes.len() <= small => hash.update(bytes),
            Bytes::Whole(bytes) => {
                let head = &bytes[..HEAD.min(bytes.len())];
                let tail = &bytes[bytes.len().saturating_sub(TAIL)..];
                large_digest(&mut hash, bytes.len() as u64, head, tail);
            }
            Bytes::Large { len, head, tail } => large_digest(&mut hash, *len, head, tail),
        }
        hex::encode(&hash.finalize()[..8])
    }

    /// The bytes a reply of the scripts here stands for: a bulk string, or
    /// `[len]` / `[len, head, tail]`; `None` for nil or anything else.
    fn from_reply(value: Value) -> Option<Self> {
        match value {
            Value::BulkString(bytes) => Some(Bytes::Whole(bytes)),
            Value::SimpleString(text) => Some(Bytes::Whole(text.into_bytes())),
            Value::Array(items) => {
                let mut items = items.into_iter();
                let len = match items.next()? {
                    Value::Int(len) => u64::try_from(len).ok()?,
                    _ => return None,
                };
                let mut part = || match items.next() {
                    Some(Value::BulkString(bytes)) => bytes,
                    _ => Vec::new(),
                };
                let head = part();
                let tail = part();
                Some(Bytes::Large { len, head, tail })
            }
            _ => None,
        }
    }
}

fn large_digest(hash: &mut Sha256, len: u64, head: &[u8], tail: &[u8]) {
    hash.update(b"large\0");
    hash.update(len.to_be_bytes());
    hash.update(head);
    hash.update(b"\0");
    hash.update(tail);
}

/// A key that could not be read, and why (shown on the dashboard and by
/// `wasmjobs stats`; the rest is read without it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The key (invalid UTF-8 shown as U+FFFD).
    pub key: String,
    /// What is wrong with it.
    pub why: String,
}

impl Unreadable {
    /// `key` could not be read because of `why`.
    pub fn new(key: impl AsRef<[u8]>, why: impl Into<String>) -> Self {
        Self {
            key: String::from_utf8_lossy(key.as_ref()).into_owned(),
            why: why.into(),
        }
    }

    /// `key` holds a `found` where a `wanted` belongs.
    pub fn wrong_type(key: impl AsRef<[u8]>, found: &str, wanted: &str) -> Self {
        Self::new(key, format!("a {found}, not a {wanted}"))
    }
}

/// What a key held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    /// No such key.
    Missing,
    /// A key of this other type (`string`, `list`, …).
    WrongType(String),
    /// More fields than the caller reads (a hash read whole).
    TooMany(u64),
    /// What it holds.
    Found(T),
}

/// One reply of a pipeline sent with `ignore_errors`: the value, or the
/// server's error (`WRONGTYPE …`) or a reply of another shape, as text.
pub fn reply<T: FromRedisValue>(value: Value) -> Result<T, String> {
    if let Value::ServerError(err) = &value {
        return Err(err.to_string());
    }
    redis::from_redis_value(value).map_err(|err| format!("unexpected reply: {err}"))
}

/// The result of one command: `Ok(Err(text))` when Redis answered with an
/// error (a key of the wrong type, a script error), `Err` when it could not
/// be asked (connection, timeout), which stays an error for the caller.
pub fn tolerate<T>(result: RedisResult<T>) -> RedisResult<Result<T, String>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(err) if answered(&err) => Ok(Err(err.to_string())),
        Err(err) => Err(err),
    }
}

/// Whether `err` is Redis's answer (an error reply), rather than a failure
/// to reach it.
pub fn answered(err: &redis::RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

/// Whether the first cause in `err`'s chain that is a Redis error is an
/// error reply (see [`answered`]).
pub fn answered_anyhow(err: &anyhow::Error) -> bool {
    err.chain()
        .find_map(|cause| cause.downcast_ref::<redis::RedisError>())
        .is_some_and(answered)
}

/// Per key: the values of `fields` in that order (nil when absent).
pub type Fields = Vec<Option<Bytes>>;

/// Reads `fields` of each hash in `keys` in one call; a value over `max`
/// bytes comes back as its size only.
pub async fn hash_fields<C, K>(conn: &mut C, keys: &[K], fields: &[&str], max: usize) -> Result<Vec<Read<Fields>>>
where
    C: ConnectionLike + Send,
    K: ToRedisArgs,
{
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let reply: Value = hash_fields_cmd(keys, fields, max)
        .query_async(conn)
        .await
        .context("cannot read hashes from Redis")?;
    parse_hashes(reply, keys.len(), |items| {
        items.into_iter().map(Bytes::from_reply).collect()
    })
}

/// The command of [`hash_fields`], for a pipeline; its reply is read
/// with [`parse_hash_fields`].
pub fn hash_fields_cmd<K: ToRedisArgs>(keys: &[K], fields: &[&str], max: usize) -> redis::Cmd {
    let mut cmd = eval(HASH, keys);
    cmd.arg(max).arg(0).arg(0).arg(0).arg(fields);
    cmd
}

/// The reply of [`hash_fields_cmd`] for `n` keys.
pub fn parse_hash_fields(reply: Value, n: usize) -> Result<Vec<Read<Fields>>> {
    parse_hashes(reply, n, |items| items.into_iter().map(Bytes::from_reply).collect())
}

/// Per key: every field, as (name, value).
pub type Pairs = Vec<(Bytes, Bytes)>;

/// Reads every field of each hash in `keys` in one call: at most `most`
/// fields (a hash with more is [`Read::TooMany`]); a value (or a name)
/// over `max` bytes comes back as its size and its first `ends.0` and last
/// `ends.1` bytes.
pub async fn hash_all<C, K>(
    conn: &mut C,
    keys: &[K],
    max: usize,
    most: usize,
    ends: (usize, usize),
) -> Result<Vec<Read<Pairs>>>
where
    C: ConnectionLike + Send,
    K: ToRedisArgs,
{
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = eval(HASH, keys);
    cmd.arg(max).arg(most.max(1)).arg(ends.0).arg(ends.1);
    let reply: Value = cmd.query_async(conn).await.context("cannot read hashes from Redis")?;
    parse_hashes(reply, keys.len(), |items| {
        let mut items = items.into_iter();
        let mut pairs = Vec::new();
        while let (Some(name), Some(value)) = (items.next(), items.next()) {
            if let (Some(name), Some(value)) = (Bytes::from_reply(name), Bytes::from_reply(value)) {
                pairs.push((name, value));
            }
        }
        pairs
    })
}

fn parse_hashes<T>(answer: Value, n: usize, read: impl Fn(Vec<Value>) -> T) -> Result<Vec<Read<T>>> {
    let Value::Array(per_key) = answer else {
        anyhow::bail!("unexpected reply reading hashes: {answer:?}");
    };
    anyhow::ensure!(per_key.len() == n, "{} replies for {n} hashes", per_key.len());
    Ok(per_key
        .into_iter()
        .map(|one| {
            let Value::Array(items) = one else {
                return Read::Missing;
            };
            let mut items = items.into_iter();
            let tag = items.next().map(|t| reply::<String>(t).unwrap_or_default());
            match tag.as_deref() {
                Some("ok") => Read::Found(read(items.collect())),
                Some("type") => Read::WrongType(items.next().and_then(|t| reply(t).ok()).unwrap_or_default()),
                Some("many") => Read::TooMany(items.next().and_then(|n| reply(n).ok()).unwrap_or(0)),
                _ => Read::Missing,
            }
        })
        .collect())
}

/// Which entries of a list or sorted set to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Window {
    /// A list, by index (`LRANGE`).
    List(isize, isize),
    /// A sorted set by rank, lowest score first (`ZRANGE`).
    Rank(isize, isize),
    /// A sorted set by rank, highest score first (`ZREVRANGE`).
    RevRank(isize, isize),
    /// A sorted set's entries of one score (as Redis writes it).
    Score(String),
}

/// A window of a list or sorted set.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranged {
    /// The length of the whole list or set.
    pub size: u64,
    /// The entries read, with their score (sorted sets).
    pub entries: Vec<(Bytes, Option<String>)>,
}

/// The command reading `window` of `key` (entries over `max` bytes as
/// their size and ends), for a pipeline; read its reply with
/// [`parse_range`].
pub fn range_cmd(key: &str, window: &Window, max: usize) -> redis::Cmd {
    let (how, start, stop) = match window {
        Window::List(start, stop) => ("list", start.to_string(), stop.to_string()),
        Window::Rank(start, stop) => ("rank", start.to_string(), stop.to_string()),
        Window::RevRank(start, stop) => ("revrank", start.to_string(), stop.to_string()),
        Window::Score(score) => ("score", score.clone(), score.clone()),
    };
    let mut cmd = eval(RANGE, &[key]);
    cmd.arg(how).arg(start).arg(stop).arg(max).arg(HEAD).arg(TAIL);
    cmd
}

/// The reply of [`range_cmd`]; a missing key is an empty one.
pub fn parse_range(answer: Value, sorted: bool) -> Result<Read<Ranged>, String> {
    let Value::Array(items) = answer else {
        return Err(match answer {
            Value::ServerError(err) => err.to_string(),
            other => format!("unexpected reply: {other:?}"),
        });
    };
    let mut items = items.into_iter();
    match items.next().map(reply::<String>) {
        Some(Ok(tag)) if tag == "type" => {
            return Ok(Read::WrongType(
                items.next().and_then(|t| reply(t).ok()).unwrap_or_default(),
            ));
        }
        Some(Ok(tag)) if tag == "ok" => {}
        _ => return Err("unexpected reply".into()),
    }
    let size: u64 = items.next().and_then(|n| reply(n).ok()).unwrap_or(0);
    let mut entries = Vec::new();
    while let Some(entry) = items.next() {
        let score = if sorted {
            items.next().and_then(|s| reply::<String>(s).ok())
        } else {
            None
        };
        if let Some(bytes) = Bytes::from_reply(entry) {
            entries.push((bytes, score));
        }
    }
    Ok(Read::Found(Ranged { size, entries }))
}

/// Reads `window` of `key` (see [`range_cmd`]).
pub async fn range<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    window: &Window,
    max: usize,
) -> Result<Read<Ranged>> {
    let reply = tolerate(range_cmd(key, window, max).query_async::<Value>(conn).await)
        .with_context(|| format!("cannot read {key} from Redis"))?;
    let sorted = !matches!(window, Window::List(..));
    reply
        .and_then(|reply| parse_range(reply, sorted))
        .map_err(|why| anyhow::anyhow!("cannot read {key}: {why}"))
}

/// Removes from `key`, within `window` (a list's indexes, or one score of
/// a sorted set), the first entry of `len` bytes that starts with `head`
/// and ends with `tail`; false if there was none.
pub async fn remove_large<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &str,
    window: &Window,
    len: u64,
    head: &[u8],
    tail: &[u8],
) -> Result<bool> {
    let (how, start, stop) = match window {
        Window::List(start, stop) => ("list", start.to_string(), stop.to_string()),
        Window::Score(score) => ("score", score.clone(), score.clone()),
        Window::Rank(..) | Window::RevRank(..) => anyhow::bail!("a large entry is removed by index or score"),
    };
    let removed: i64 = eval(REMOVE, &[key])
        .arg(how)
        .arg(start)
        .arg(stop)
        .arg(len)
        .arg(head)
        .arg(tail)
        .query_async(conn)
        .await
        .with_context(|| format!("cannot remove the entry from {key}"))?;
    Ok(removed >= 1)
}

/// `EVAL script N keys…` (the text each time: these are read paths a
/// pipeline carries, where `EVALSHA`'s fallback cannot run).
fn eval<K: ToRedisArgs>(script: &str, keys: &[K]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// KEYS: hashes. ARGV: the largest value returned whole; the most fields
/// read (0: read the fields named from ARGV[5] on instead); the head and
/// tail bytes returned of a larger value (0 and 0: its size alone). Per
/// key `{'none'}`, `{'type', T}`, `{'many', N}`, or `{'ok', …}` with the
/// values named (nil when absent) or every name and value; a value over
/// the bound as `{len}` or `{len, head, tail}`, never read whole when
/// only its size is asked.
const HASH: &str = r"
local max, most, head, tail = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function value(key, field)
  local len = redis.call('HSTRLEN', key, field)
  if len <= max then return redis.call('HGET', key, field) end
  if head + tail == 0 then return {len} end
  local v = redis.call('HGET', key, field)
  return {len, string.sub(v, 1, head), tail > 0 and string.sub(v, -tail) or ''}
end
local out = {}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then
    out[i] = {'none'}
  elseif t ~= 'hash' then
    out[i] = {'type', t}
  elseif most == 0 then
    local r = {'ok'}
    for j = 5, #ARGV do r[#r + 1] = value(key, ARGV[j]) end
    out[i] = r
  else
    local n = redis.call('HLEN', key)
    if n > most then
      out[i] = {'many', n}
    else
      local r = {'ok'}
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if #f <= max then
          r[#r + 1] = f
          r[#r + 1] = value(key, f)
        else
          r[#r + 1] = {#f}
          r[#r + 1] = {redis.call('HSTRLEN', key, f)}
        end
      end
      out[i] = r
    end
  end
end
return out
";

/// KEYS[1]: a list or sorted set. ARGV: `list`, `rank`, `revrank` or
/// `score`; start and stop (indexes, or scores); the largest entry
/// returned whole; the head and tail bytes returned of a larger one.
/// `{'type', T}` for a key of another type, else `{'ok', length,
/// entries…}` (sorted sets: each entry followed by its score).
const RANGE: &str = r"
local key, how = KEYS[1], ARGV[1]
local max, head, tail = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TYPE', key)['ok']
if t == 'none' then return {'ok', 0} end
local want = 'zset'
if how == 'list' then want = 'list' end
if t ~= want then return {'type', t} end
local function cut(e)
  if #e <= max then return e end
  return {#e, string.sub(e, 1, head), tail > 0 and string.sub(e, -tail) or ''}
end
local out = {'ok'}
if how == 'list' then
  out[2] = redis.call('LLEN', key)
  for _, e in ipairs(redis.call('LRANGE', key, ARGV[2], ARGV[3])) do out[#out + 1] = cut(e) end
  return out
end
out[2] = redis.call('ZCARD', key)
local items
if how == 'rank' then
  items = redis.call('ZRANGE', key, ARGV[2], ARGV[3], 'WITHSCORES')
elseif how == 'revrank' then
  items = redis.call('ZREVRANGE', key, ARGV[2], ARGV[3], 'WITHSCORES')
else
  items = redis.call('ZRANGEBYSCORE', key, ARGV[2], ARGV[3], 'WITHSCORES')
end
for j = 1, #items, 2 do
  out[#out + 1] = cut(items[j])
  out[#out + 1] = items[j + 1]
end
return out
";

/// KEYS[1]: a list or sorted set. ARGV: `list` or `score`; start and stop
/// (indexes, or scores); the entry's length, head and tail. Removes the
/// first entry in that window with that length, head and tail (`LREM` /
/// `ZREM`); returns how many were removed.
const REMOVE: &str = r"
local key, how = KEYS[1], ARGV[1]
local len, head, tail = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local want = 'zset'
if how == 'list' then want = 'list' end
if redis.call('TYPE', key)['ok'] ~= want then return 0 end
local function same(e)
  return #e == len and string.sub(e, 1, #head) == head and (#tail == 0 or string.sub(e, -#tail) == tail)
end
local items
if how == 'list' then
  items = redis.call('LRANGE', key, ARGV[2], ARGV[3])
else
  items = redis.call('ZRANGEBYSCORE', key, ARGV[2], ARGV[3])
end
for _, e in ipairs(items) do
  if same(e) then
    if how == 'list' then return redis.call('LREM', key, 1, e) end
    return redis.call('ZREM', key, e)
  end
end
return 0
";

/// The first value of `"key":` in `text` (a JSON text, or a part of one)
/// that is a string or a number followed by more text, also where `text`
/// holds the JSON as an escaped string (Sidekiq's `work` entries); for
/// showing what a preview of a large job is, never for acting on it.
pub fn sniff(text: &str, key: &str) -> Option<serde_json::Value> {
    sniff_in(text, key).or_else(|| sniff_in(&text.replace("\\\"", "\""), key))
}

fn sniff_in(text: &str, key: &str) -> Option<serde_json::Value> {
    let needle = format!("\"{key}\":");
    let mut from = 0;
    while let Some(at) = text.get(from..)?.find(&needle) {
        let start = from + at + needle.len();
        let rest = text.get(start..)?.trim_start();
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        if let Some(Ok(value)) = values.next()
            && (value.is_string() || value.is_number())
            && values.byte_offset() < rest.len()
        {
            return Some(value);
        }
        from = start;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_does_not_depend_on_how_much_was_read() {
        let raw: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let whole = Bytes::Whole(raw.clone());
        let large = Bytes::Large {
            len: raw.len() as u64,
            head: raw[..HEAD].to_vec(),
            tail: raw[raw.len() - TAIL..].to_vec(),
        };
        assert_eq!(whole.digest(16_384), large.digest(16_384));
        let small = Bytes::Whole(b"job".to_vec());
        assert_eq!(small.digest(16_384), hex::encode(&Sha256::digest(b"job")[..8]));
        let mut other = raw.clone();
        other[50_000] ^= 1;
        // Same length and ends: the same name (removal then compares them).
        assert_eq!(Bytes::Whole(other).digest(16_384), whole.digest(16_384));
        assert_ne!(Bytes::Whole(raw[1..].to_vec()).digest(16_384), whole.digest(16_384));
    }

    #[test]
    fn replies_of_the_scripts_read_back() {
        let large = Value::Array(vec![
            Value::Int(10),
            Value::BulkString(b"he".to_vec()),
            Value::BulkString(b"il".to_vec()),
        ]);
        assert_eq!(
            Bytes::from_reply(large),
            Some(Bytes::Large {
                len: 10,
                head: b"he".to_vec(),
                tail: b"il".to_vec()
            })
        );
        assert_eq!(
            Bytes::from_reply(Value::Array(vec![Value::Int(7)])).map(|b| b.len()),
            Some(7)
        );
        assert_eq!(Bytes::from_reply(Value::Nil), None);
        let hashes = Value::Array(vec![
            Value::Array(vec![Value::BulkString(b"none".to_vec())]),
            Value::Array(vec![
                Value::BulkString(b"type".to_vec()),
                Value::BulkString(b"string".to_vec()),
            ]),
            Value::Array(vec![
                Value::BulkString(b"ok".to_vec()),
                Value::BulkString(b"v".to_vec()),
                Value::Nil,
            ]),
        ]);
        let read = parse_hash_fields(hashes, 3).unwrap();
        assert_eq!(read[0], Read::Missing);
        assert_eq!(read[1], Read::WrongType("string".into()));
        assert_eq!(read[2], Read::Found(vec![Some(Bytes::Whole(b"v".to_vec())), None]));
        assert!(parse_hash_fields(Value::Array(vec![]), 1).is_err());
    }

    #[test]
    fn a_preview_names_what_it_can() {
        let head = r#"{"retry":true,"queue":"big","class":"BigJob","args":["xxxxxxxx"#;
        let tail = r#"xxxx"],"jid":"0123456789abcdef01234567","enqueued_at":1796314672.5}"#;
        assert_eq!(sniff(head, "class"), Some(serde_json::json!("BigJob")));
        assert_eq!(sniff(head, "jid"), None);
        assert_eq!(sniff(tail, "jid"), Some(serde_json::json!("0123456789abcdef01234567")));
        assert_eq!(sniff(tail, "enqueued_at"), Some(serde_json::json!(1_796_314_672.5)));
        // A number cut by the end of the preview is not taken.
        assert_eq!(sniff(r#"{"enqueued_at":17963"#, "enqueued_at"), None);
        let escaped = r#"{"queue":"q","payload":"{\"class\":\"A\",\"jid\":\"abc\",\"args\":[1"#;
        assert_eq!(sniff(escaped, "jid"), Some(serde_json::json!("abc")));
        assert_eq!(sniff("\u{fffd}\"jid\":", "jid"), None);
    }
}
