//! Cron schedules in Redis, in sidekiq-cron's format.
//!
//! Schedules live where sidekiq-cron keeps them, so its Web UI tab ("Cron")
//! lists ours, and a schedule a Ruby app registers with sidekiq-cron runs
//! under wasmjobs too. Two layouts exist ([`Layout`]): 2.x's, below, and
//! 1.x's (Sidekiq 6 apps), the same without the namespace (`cron_jobs`,
//! `cron_job:<name>`, `cron_job:<name>:enqueued`, ...). Both are read;
//! ours are written in the one the cluster uses ([`Layout::of_cluster`]):
//!
//! - SET `cron_jobs:default`: the hash key of every schedule.
//! - HASH `cron_job:default:<name>`: all values strings, `""` for nil —
//!   `name`, `namespace`, `klass`, `cron` (the expression, then the time
//!   zone unless UTC, fugit's syntax), `description`, `source`, `args`
//!   (JSON), `message` (the job: class, args, queue, retry), `status`
//!   (`enabled`/`disabled`), `active_job`, `date_as_argument`,
//!   `symbolize_args`, `queue_name_prefix`, `queue_name_delimiter`,
//!   `retry`, `last_enqueue_time` (`%Y-%m-%d %H:%M:%S %z`). Ours add
//!   `wasmjobs_plugin` (the plugin that declared it) and
//!   `wasmjobs_catch_up` (`1`/`0`); Ruby ignores fields it does not know.
//! - ZSET `cron_job:default:<name>:enqueued`: the claimed ticks, member the
//!   tick's UTC time as `Time#iso8601` writes it, score its epoch seconds.
//!   `ZADD` answers 1 to exactly one caller per tick: the one that
//!   enqueues, whether wasmjobs or sidekiq-cron. Claims older than a day
//!   are trimmed, as sidekiq-cron does.
//! - LIST `cron_job:default:<name>:jid_history`: `{"jid","enqueued"}`,
//!   newest first, 10 kept.
//!
//! The claim and the push are one Lua script ([`CLAIM`]): a process dying
//! between them cannot lose a tick nor enqueue it twice. Key names are
//! never built from unchecked text inside Lua: every key goes in `KEYS`.
//! Everything read back is bounded ([`MAX_SCHEDULES`], [`MAX_FIELD_BYTES`]:
//! a longer field is never transferred, only its size), and a member that
//! is not a hash, or a hash that does not describe a job, is reported, not
//! fatal ([`list`]); a claim whose keys are of another type fails before
//! writing anything.

use std::collections::HashMap;

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::bounded::{self, Bytes, Read};
use super::keys;
use super::payload::Payload;
use crate::cron;
use crate::job::{DEFAULT_QUEUE, MAX_CLASS_LEN, new_jid};
use crate::plugin::Schedule;

/// Most schedules read from `cron_jobs:default` (the rest are ignored, and
/// `wasmjobs schedule` says so).
pub const MAX_SCHEDULES: usize = 1_000;
/// Longest field value or key read, in bytes.
pub const MAX_FIELD_BYTES: usize = 64 * 1024;
/// Longest queue name accepted from a schedule.
const MAX_QUEUE_LEN: usize = 200;
/// `jid_history` entries kept (sidekiq-cron's `cron_history_size`).
const HISTORY: usize = 10;
/// Claims kept, seconds (sidekiq-cron's `REMEMBER_THRESHOLD`).
const REMEMBER_SECS: i64 = 24 * 3600;
/// The field naming the plugin that declared a schedule (ours only).
pub const OWNER_FIELD: &str = "wasmjobs_plugin";
/// The field holding a schedule's `catch_up` (ours only).
pub const CATCH_UP_FIELD: &str = "wasmjobs_catch_up";
/// The prefix of every schedule's hash key.
const KEY_PREFIX: &str = "cron_job:default:";

/// Where sidekiq-cron keeps schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Layout {
    /// sidekiq-cron 1.x: `cron_jobs`, `cron_job:<name>`.
    #[serde(rename = "sidekiq-cron 1")]
    V1,
    /// sidekiq-cron 2.x, namespace `default`: `cron_jobs:default`,
    /// `cron_job:default:<name>`.
    #[serde(rename = "sidekiq-cron 2")]
    V2,
}

/// The environment variable that chooses the layout ours are written in.
pub const LAYOUT_ENV: &str = "WASMJOBS_CRON_LAYOUT";

impl Layout {
    /// The SET of its schedules' keys.
    pub fn set(self) -> &'static str {
        match self {
            Layout::V1 => keys::CRON_JOBS_V1,
            Layout::V2 => keys::CRON_JOBS,
        }
    }

    /// The HASH of schedule `name`.
    pub fn key(self, name: &str) -> String {
        match self {
            Layout::V1 => keys::cron_job_v1(name),
            Layout::V2 => keys::cron_job(name),
        }
    }

    /// The other one.
    fn other(self) -> Layout {
        match self {
            Layout::V1 => Layout::V2,
            Layout::V2 => Layout::V1,
        }
    }

    /// The layout of the schedule hash `key`.
    fn of_key(key: &str) -> Layout {
        if key.starts_with(KEY_PREFIX) {
            Layout::V2
        } else {
            Layout::V1
        }
    }

    /// The name in the schedule hash `key`.
    fn name_in(key: &str) -> &str {
        key.strip_prefix(KEY_PREFIX)
            .or_else(|| key.strip_prefix(V1_KEY_PREFIX))
            .unwrap_or(key)
    }

    /// The layout `value` of [`LAYOUT_ENV`] asks for (`1`, `2`, or empty
    /// for none).
    pub fn parse(value: &str) -> Result<Option<Layout>> {
        match value.trim() {
            "" => Ok(None),
            "1" => Ok(Some(Layout::V1)),
            "2" => Ok(Some(Layout::V2)),
            other => anyhow::bail!(
                "{LAYOUT_ENV}={other:?}: expected 1 (sidekiq-cron 1.x: cron_jobs) or 2 (sidekiq-cron 2.x: cron_jobs:default)"
            ),
        }
    }

    /// The layout this cluster's schedules are written in: the one
    /// [`LAYOUT_ENV`] names if set; else 1.x's when its SET `cron_jobs`
    /// holds a schedule wasmjobs did not write (a Ruby app on
    /// sidekiq-cron 1.x registered it: its Web UI reads only that
    /// layout), 2.x's otherwise. Every process decides the same way from
    /// the same Redis.
    pub async fn of_cluster<C>(conn: &mut C) -> Result<Layout>
    where
        C: ConnectionLike + Send,
    {
        if let Some(layout) = Layout::parse(&std::env::var(LAYOUT_ENV).unwrap_or_default())? {
            return Ok(layout);
        }
        Ok(if ruby_schedule_in(conn, keys::CRON_JOBS_V1).await? {
            Layout::V1
        } else {
            Layout::V2
        })
    }
}

/// Whether the SET `set` names a schedule hash without our owner field (a
/// Ruby app's), looking at 100 of its members at most. A set of another
/// type, and members that are not hashes, name none.
async fn ruby_schedule_in<C>(conn: &mut C, set: &str) -> Result<bool>
where
    C: ConnectionLike + Send,
{
    let context = "cannot tell which sidekiq-cron layout the cluster uses";
    let members = bounded::tolerate(
        redis::cmd("SRANDMEMBER")
            .arg(set)
            .arg(100)
            .query_async::<Vec<Vec<u8>>>(conn)
            .await,
    )
    .context(context)?;
    let Ok(members) = members else { return Ok(false) };
    if members.is_empty() {
        return Ok(false);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for member in &members {
        pipe.cmd("TYPE").arg(member).cmd("HGET").arg(member).arg(OWNER_FIELD);
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await.context(context)?;
    Ok(replies.chunks(2).any(|pair| match pair {
        [kind, owner] => {
            bounded::reply::<String>(kind.clone()).is_ok_and(|k| k == "hash")
                && bounded::reply::<Option<String>>(owner.clone()).is_ok_and(|o| o.is_none_or(|o| o.is_empty()))
        }
        _ => false,
    }))
}

/// The prefix of a sidekiq-cron 1.x schedule's hash key.
const V1_KEY_PREFIX: &str = "cron_job:";

/// Registers a schedule (see [`register`]). KEYS: the set, the hash, its
/// `:enqueued` ZSET. ARGV: the plugin, the member of the latest tick at or
/// before now (`""` if none), now, then field/value pairs. Returns
/// `{registered (0 when a schedule wasmjobs did not write has the name),
/// previous owner}`.
const REGISTER: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then
  local owner = redis.call('HGET', KEYS[2], 'wasmjobs_plugin')
  if not owner or owner == '' then return {0, ''} end
end
local previous = redis.call('HGET', KEYS[2], 'wasmjobs_plugin') or ''
redis.call('SADD', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('HSETNX', KEYS[2], 'status', 'enabled')
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
end
return {1, previous}
";

/// Removes a schedule if `plugin` still owns it (`*`: if any plugin
/// does). KEYS: the set, the hash, `:enqueued`, `:jid_history`. ARGV: the
/// plugin.
const REMOVE: &str = r"
local owner = redis.call('HGET', KEYS[2], 'wasmjobs_plugin')
if not owner or owner == '' or (ARGV[1] ~= '*' and owner ~= ARGV[1]) then return 0 end
redis.call('SREM', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
";

/// Claims one tick and enqueues its job, atomically. KEYS: the hash,
/// `:enqueued`, `:jid_history`, `queue:<q>`, `queues`. ARGV: the tick
/// (epoch s), its member, the payload, the queue name, the
/// `last_enqueue_time`, the history entry, the history size, the tick a
/// day ago, and `1` for a catch-up claim (refused if a tick at or after
/// this one is already claimed). Returns 1 enqueued, 0 claimed by someone
/// else, -1 the schedule is gone, -2 it is disabled; an error, before
/// anything is written, when one of its keys is of another type (so a
/// tick is never claimed without its job).
const CLAIM: &str = r"
local wanted = {'hash', 'zset', 'list', 'list', 'set'}
for i = 1, 5 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= wanted[i] then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. t .. ', not a ' .. wanted[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if status and status ~= 'enabled' then return -2 end
if ARGV[9] == '1' then
  local last = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if last[2] and tonumber(last[2]) >= tonumber(ARGV[1]) then return 0 end
end
if redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('LPUSH', KEYS[4], ARGV[3])
redis.call('SADD', KEYS[5], ARGV[4])
redis.call('HSET', KEYS[1], 'last_enqueue_time', ARGV[5])
redis.call('LPUSH', KEYS[3], ARGV[6])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[7]) - 1)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[8])
return 1
";

/// One schedule as read from Redis (ours or a Ruby app's).
#[derive(Debug, Clone, Serialize)]
pub struct CronEntry {
    /// Its hash key.
    #[serde(skip)]
    pub key: String,
    /// The layout it is stored in.
    pub layout: Layout,
    /// Its name.
    pub name: String,
    /// sidekiq-cron's `cron` field: expression, then zone unless UTC.
    pub cron: String,
    /// The job class.
    pub class: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// The job's arguments.
    pub args: Vec<Value>,
    /// `status` is `enabled` (or absent).
    pub enabled: bool,
    /// When it last enqueued a job, epoch seconds.
    pub last_enqueue: Option<f64>,
    /// The plugin that declared it; `None` for a sidekiq-cron schedule.
    pub plugin: Option<String>,
    /// Enqueue the most recent missed tick after a time with no process.
    pub catch_up: bool,
    /// The rest of the job (sidekiq-cron's `message`): fields copied into
    /// each payload.
    #[serde(skip)]
    message: Map<String, Value>,
    #[serde(skip)]
    active_job: bool,
    #[serde(skip)]
    date_as_argument: bool,
}

/// What one claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This process enqueued the tick's job.
    Enqueued,
    /// Another process (or sidekiq-cron) had claimed the tick.
    Lost,
    /// The schedule was deleted.
    Gone,
    /// The schedule is disabled.
    Disabled,
}

/// Every schedule in Redis, and those that could not be read.
#[derive(Debug, Default)]
pub struct Listing {
    /// Readable schedules, by name.
    pub entries: Vec<CronEntry>,
    /// Hash keys that do not describe a job, and why.
    pub invalid: Vec<(String, String)>,
    /// More than [`MAX_SCHEDULES`] keys: the rest were not read.
    pub truncated: bool,
}

impl CronEntry {
    /// Reads the hash `fields` of `key`.
    pub fn from_hash(key: &str, fields: &HashMap<Vec<u8>, Vec<u8>>) -> Result<Self, String> {
        let get = |name: &str| -> Result<Option<&str>, String> {
            match fields.get(name.as_bytes()) {
                None => Ok(None),
                Some(bytes) if bytes.len() > MAX_FIELD_BYTES => {
                    Err(format!("field {name:?} is longer than {MAX_FIELD_BYTES} bytes"))
                }
                Some(bytes) => std::str::from_utf8(bytes)
                    .map(|s| Some(s).filter(|s| !s.is_empty()))
                    .map_err(|_| format!("field {name:?} is not UTF-8")),
            }
        };
        let flag = |name: &str| -> Result<bool, String> {
            Ok(get(name)?.is_some_and(|v| {
                let v = v.to_ascii_lowercase();
                matches!(v.as_str(), "1" | "true" | "t" | "yes" | "y")
            }))
        };
        let name = match get("name")? {
            Some(name) => name.to_owned(),
            None => Layout::name_in(key).to_owned(),
        };
        let cron = get("cron")?.ok_or("no \"cron\" field")?.to_owned();
        let message = match get("message")? {
            None => Map::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(Value::Object(map)) => map,
                _ => return Err("field \"message\" is not a JSON object".into()),
            },
        };
        let class = get("klass")?
            .or(get("class")?)
            .or(message.get("class").and_then(Value::as_str))
            .ok_or("no \"klass\" field")?
            .to_owned();
        if class.len() > MAX_CLASS_LEN {
            return Err(format!("class is longer than {MAX_CLASS_LEN} bytes"));
        }
        let queue = message
            .get("queue")
            .and_then(Value::as_str)
            .or(get("queue")?)
            .filter(|q| !q.is_empty())
            .unwrap_or(DEFAULT_QUEUE);
        if queue.len() > MAX_QUEUE_LEN {
            return Err(format!("queue is longer than {MAX_QUEUE_LEN} bytes"));
        }
        let active_job = flag("active_job")?;
        let queue = match (active_job, get("queue_name_prefix")?) {
            (true, Some(prefix)) => {
                let delimiter = get("queue_name_delimiter")?.unwrap_or("_");
                format!("{prefix}{delimiter}{queue}")
            }
            _ => queue.to_owned(),
        };
        // sidekiq-cron: JSON args; a hash is one argument; text that is not
        // JSON is one string argument.
        let args = match get("args")? {
            None => Vec::new(),
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Array(items)) => items,
                Ok(Value::Null) => Vec::new(),
                Ok(other) => vec![other],
                Err(_) => vec![Value::String(text.to_owned())],
            },
        };
        Ok(Self {
            key: key.to_owned(),
            layout: Layout::of_key(key),
            name,
            cron,
            class,
            queue,
            args,
            // As sidekiq-cron: no status is enabled; anything but "enabled" is not.
            enabled: fields
                .get(b"status".as_slice())
                .is_none_or(|status| status.as_slice() == b"enabled"),
            last_enqueue: get("last_enqueue_time")?.and_then(cron::parse_last_enqueue_time),
            plugin: get(OWNER_FIELD)?.map(str::to_owned),
            catch_up: flag(CATCH_UP_FIELD)?,
            message,
            active_job,
            date_as_argument: flag("date_as_argument")?,
        })
    }

    /// The job a tick enqueues, as sidekiq-cron's `enqueue!` builds it and
    /// `Sidekiq::Client.push` completes it (jid, `created_at`,
    /// `enqueued_at`), plus `cron_name` and `cron_tick` (the tick's
    /// identity, so a job can tell which run it is).
    pub fn payload(&self, tick: i64, now: f64) -> Payload {
        let mut args = self.args.clone();
        if self.date_as_argument {
            args.push(json!(now));
        }
        let mut payload = if self.active_job {
            let mut payload = Payload::new(
                "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
                vec![json!({
                    "job_class": self.class,
                    "job_id": uuid(),
                    "queue_name": self.queue,
                    "arguments": args,
                })],
                &self.queue,
                now,
            );
            payload.set("wrapped", Value::String(self.class.clone()));
            payload
        } else {
            let mut payload = Payload::new(&self.class, args, &self.queue, now);
            for (key, value) in &self.message {
                let ours = matches!(
                    key.as_str(),
                    "class" | "args" | "queue" | "jid" | "created_at" | "enqueued_at"
                );
                if !ours && !value.is_null() {
                    payload.set(key, value.clone());
                }
            }
            payload
        };
        payload.set("jid", Value::String(new_jid()));
        payload.set_time("enqueued_at", now);
        payload.set("cron_name", Value::String(self.name.clone()));
        payload.set("cron_tick", Value::String(cron::iso8601(tick)));
        payload
    }
}

/// A random version-4 UUID (ActiveJob's `job_id`).
fn uuid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The hash fields of a schedule `plugin` declares (sidekiq-cron's
/// `to_hash`, plus ours; `status` and `last_enqueue_time` are left as they
/// are, so a schedule disabled in the Web UI stays disabled).
pub fn fields(plugin: &str, schedule: &Schedule) -> Vec<(&'static str, String)> {
    let args = Value::Array(schedule.args.clone()).to_string();
    let message = json!({
        "class": schedule.class,
        "args": schedule.args,
        "queue": schedule.queue,
        "retry": true,
    });
    vec![
        ("name", schedule.name.clone()),
        ("namespace", "default".to_owned()),
        ("klass", schedule.class.clone()),
        ("cron", schedule.cron.sidekiq_field()),
        ("description", format!("wasmjobs plugin {plugin}")),
        ("source", "dynamic".to_owned()),
        ("args", args),
        ("message", message.to_string()),
        ("active_job", "0".to_owned()),
        ("date_as_argument", "0".to_owned()),
        ("symbolize_args", "0".to_owned()),
        ("queue_name_prefix", String::new()),
        ("queue_name_delimiter", String::new()),
        ("retry", "true".to_owned()),
        (OWNER_FIELD, plugin.to_owned()),
        (CATCH_UP_FIELD, if schedule.catch_up { "1" } else { "0" }.to_owned()),
    ]
}

/// What [`register`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// Written (new, or updated); `previous` is the plugin that owned it
    /// before, if another.
    Written {
        /// The plugin that had declared it before, when not this one.
        moved_from: Option<String>,
    },
    /// Not written: a schedule of that name exists that wasmjobs did not
    /// write (a Ruby app's).
    Taken,
}

/// Registers (or updates) `schedule` of `plugin` in `layout` (the
/// cluster's, [`Layout::of_cluster`]), and removes wasmjobs' copy of it
/// from the other layout (the cluster's layout changed since it was
/// written). A new schedule's latest
/// past tick is marked claimed, as sidekiq-cron's `save` does, so
/// registering never enqueues a run that was due before it existed.
pub async fn register<C>(
    conn: &mut C,
    layout: Layout,
    plugin: &str,
    schedule: &Schedule,
    now: f64,
) -> Result<Registered>
where
    C: ConnectionLike + Send,
{
    let key = layout.key(&schedule.name);
    let latest = schedule
        .cron
        .latest_at_or_before(now.floor() as i64)
        .map(cron::iso8601)
        .unwrap_or_default();
    let script = redis::Script::new(REGISTER);
    let mut invocation = script.key(layout.set());
    invocation
        .key(&key)
        .key(format!("{key}:enqueued"))
        .arg(plugin)
        .arg(latest)
        .arg(now);
    for (field, value) in fields(plugin, schedule) {
        invocation.arg(field).arg(value);
    }
    let (written, previous): (i64, String) = invocation
        .invoke_async(conn)
        .await
        .with_context(|| format!("cannot register schedule {:?}", schedule.name))?;
    if written == 1 {
        let other = layout.other();
        remove(conn, other.set(), &other.key(&schedule.name), "*").await?;
    }
    Ok(if written == 0 {
        Registered::Taken
    } else {
        Registered::Written {
            moved_from: Some(previous).filter(|p| !p.is_empty() && p != plugin),
        }
    })
}

/// Removes the schedules `plugin` declared that are not in `keep`. Returns
/// their names.
pub async fn remove_stale<C>(conn: &mut C, plugin: &str, keep: &[String]) -> Result<Vec<String>>
where
    C: ConnectionLike + Send,
{
    let listing = list(conn).await?;
    let mut removed = Vec::new();
    for entry in listing.entries {
        if entry.plugin.as_deref() != Some(plugin) || keep.contains(&entry.name) {
            continue;
        }
        if remove(conn, entry.layout.set(), &entry.key, plugin).await? {
            removed.push(entry.name);
        }
    }
    Ok(removed)
}

/// Removes the schedule hash `key` (listed in `set`) with its claims and
/// history, if `plugin` (`*`: any plugin) owns it. Returns whether it did.
async fn remove<C>(conn: &mut C, set: &str, key: &str, plugin: &str) -> Result<bool>
where
    C: ConnectionLike + Send,
{
    let done: i64 = redis::Script::new(REMOVE)
        .key(set)
        .key(key)
        .key(format!("{key}:enqueued"))
        .key(format!("{key}:jid_history"))
        .arg(plugin)
        .invoke_async(conn)
        .await
        .with_context(|| format!("cannot remove schedule {key:?}"))?;
    Ok(done == 1)
}

/// Enables or disables the schedule `entry` (its `status`), as
/// sidekiq-cron's Web UI does: every claim checks it ([`CLAIM`]), so no
/// process, ours or sidekiq-cron's, enqueues a tick of a disabled
/// schedule. A plugin's schedule keeps the status across reloads and
/// restarts ([`fields`] leaves it as it is). False when the schedule's
/// hash is gone (or was replaced by another type): nothing is written then.
pub async fn set_enabled<C>(conn: &mut C, entry: &CronEntry, enabled: bool) -> Result<bool>
where
    C: ConnectionLike + Send,
{
    let set: i64 = redis::Script::new(SET_STATUS)
        .key(&entry.key)
        .arg(if enabled { "enabled" } else { "disabled" })
        .invoke_async(conn)
        .await
        .with_context(|| format!("cannot change the status of schedule {:?}", entry.name))?;
    Ok(set == 1)
}

/// KEYS: the schedule's hash; ARGV: the status.
const SET_STATUS: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
return 1
";

/// Most fields read of one schedule's hash (sidekiq-cron writes about 20).
const MAX_FIELDS: usize = 200;

/// Every schedule in `cron_jobs:default` and in sidekiq-cron 1.x's
/// `cron_jobs` (at most [`MAX_SCHEDULES`] in all), in two round trips,
/// sorted by name. Whatever another client wrote there
/// is reported in [`Listing::invalid`] and skipped: a set of another type,
/// a member whose key is not a hash, a hash with a field over
/// [`MAX_FIELD_BYTES`] (not transferred: only its size is read) or more
/// than 200 fields.
pub async fn list<C>(conn: &mut C) -> Result<Listing>
where
    C: ConnectionLike + Send,
{
    let mut listing = Listing::default();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("SMEMBERS").arg(Layout::V2.set());
    pipe.cmd("SMEMBERS").arg(Layout::V1.set());
    let sets: Vec<redis::Value> = pipe.query_async(conn).await.context("cannot read the cron schedules")?;
    let mut members: Vec<Vec<u8>> = Vec::new();
    for (set, reply) in [Layout::V2.set(), Layout::V1.set()].into_iter().zip(sets) {
        match bounded::reply::<Vec<Vec<u8>>>(reply) {
            Ok(found) => members.extend(found),
            Err(why) => listing.invalid.push((set.to_owned(), format!("not a set: {why}"))),
        }
    }
    let mut keys: Vec<String> = Vec::new();
    for member in members {
        match String::from_utf8(member) {
            Ok(key) if key.len() <= MAX_FIELD_BYTES => keys.push(key),
            Ok(key) => listing.invalid.push((
                crate::job::preview(&key),
                format!("key longer than {MAX_FIELD_BYTES} bytes"),
            )),
            Err(err) => listing.invalid.push((
                String::from_utf8_lossy(err.as_bytes()).into_owned(),
                "key is not UTF-8".into(),
            )),
        }
    }
    keys.sort();
    keys.dedup();
    if keys.len() > MAX_SCHEDULES {
        keys.truncate(MAX_SCHEDULES);
        listing.truncated = true;
    }
    let hashes = bounded::hash_all(conn, &keys, MAX_FIELD_BYTES, MAX_FIELDS, (0, 0))
        .await
        .context("cannot read the cron schedules")?;
    for (key, hash) in keys.into_iter().zip(hashes) {
        let pairs = match hash {
            // A key in the set whose hash is gone: sidekiq-cron skips it too.
            Read::Missing => continue,
            Read::WrongType(found) => {
                listing.invalid.push((key, format!("a {found}, not a hash")));
                continue;
            }
            Read::TooMany(n) => {
                listing.invalid.push((key, format!("{n} fields, over {MAX_FIELDS}")));
                continue;
            }
            Read::Found(pairs) => pairs,
        };
        match fields_of(pairs) {
            Ok(fields) => match CronEntry::from_hash(&key, &fields) {
                Ok(entry) => listing.entries.push(entry),
                Err(why) => listing.invalid.push((key, why)),
            },
            Err(why) => listing.invalid.push((key, why)),
        }
    }
    listing.entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(listing)
}

/// A schedule's fields as a map, or why not: a name or value that was
/// too long to be read.
fn fields_of(pairs: bounded::Pairs) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
    let mut fields = HashMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        match (name, value) {
            (Bytes::Whole(name), Bytes::Whole(value)) => {
                fields.insert(name, value);
            }
            (Bytes::Whole(name), value) => {
                return Err(format!(
                    "field {:?} is {} bytes, over {MAX_FIELD_BYTES}",
                    String::from_utf8_lossy(&name),
                    value.len()
                ));
            }
            (name, _) => return Err(format!("a field name of {} bytes, over {MAX_FIELD_BYTES}", name.len())),
        }
    }
    Ok(fields)
}

/// Claims `tick` of `entry` and, if this caller wins, enqueues `payload`
/// in the same script. `catch_up`: refuse if a tick at or after this one
/// is already claimed.
pub async fn claim<C>(
    conn: &mut C,
    entry: &CronEntry,
    tick: i64,
    payload: &Payload,
    now: f64,
    catch_up: bool,
) -> Result<Claim>
where
    C: ConnectionLike + Send,
{
    let history = json!({"jid": payload.jid(), "enqueued": cron::ruby_time(now)}).to_string();
    let result: i64 = redis::Script::new(CLAIM)
        .key(&entry.key)
        .key(format!("{}:enqueued", entry.key))
        .key(format!("{}:jid_history", entry.key))
        .key(keys::queue(payload.queue()))
        .key(keys::QUEUES)
        .arg(tick)
        .arg(cron::iso8601(tick))
        .arg(payload.to_json())
        .arg(payload.queue())
        .arg(cron::last_enqueue_time(now))
        .arg(history)
        .arg(HISTORY)
        .arg(tick - REMEMBER_SECS)
        .arg(if catch_up { "1" } else { "0" })
        .invoke_async(conn)
        .await
        .with_context(|| format!("cannot claim tick {} of schedule {:?}", cron::iso8601(tick), entry.name))?;
    Ok(match result {
        1 => Claim::Enqueued,
        -1 => Claim::Gone,
        -2 => Claim::Disabled,
        _ => Claim::Lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(pairs: &[(&str, &str)]) -> HashMap<Vec<u8>, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn both_sidekiq_cron_layouts_name_their_keys() {
        assert_eq!(Layout::V2.key("a"), "cron_job:default:a");
        assert_eq!(Layout::V1.key("a"), "cron_job:a");
        assert_eq!((Layout::V2.set(), Layout::V1.set()), ("cron_jobs:default", "cron_jobs"));
        for layout in [Layout::V1, Layout::V2] {
            let key = layout.key("nightly-report");
            assert_eq!(Layout::of_key(&key), layout);
            assert_eq!(Layout::name_in(&key), "nightly-report");
            let entry = CronEntry::from_hash(&key, &hash(&[("cron", "* * * * *"), ("klass", "K")])).unwrap();
            assert_eq!((entry.layout, entry.name.as_str()), (layout, "nightly-report"));
        }
        assert_eq!(Layout::parse("").unwrap(), None);
        assert_eq!(Layout::parse(" 1 ").unwrap(), Some(Layout::V1));
        assert_eq!(Layout::parse("2").unwrap(), Some(Layout::V2));
        let err = Layout::parse("3").unwrap_err().to_string();
        assert!(
            err.contains("WASMJOBS_CRON_LAYOUT") && err.contains("expected 1"),
            "{err}"
        );
    }

    #[test]
    fn a_sidekiq_cron_hash_reads_as_ruby_writes_it() {
        let entry = CronEntry::from_hash(
            "cron_job:default:nightly",
            &hash(&[
                ("name", "nightly"),
                ("klass", "NightlyJob"),
                ("cron", "0 3 * * * Europe/Berlin"),
                ("source", "dynamic"),
                ("args", "[1,\"a\"]"),
                (
                    "message",
                    r#"{"retry":3,"queue":"low","class":"NightlyJob","args":[1,"a"],"backtrace":true}"#,
                ),
                ("status", "enabled"),
                ("active_job", "0"),
                ("last_enqueue_time", "2026-12-02 03:04:05 +0000"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.class.as_str(), entry.queue.as_str()),
            ("nightly", "NightlyJob", "low")
        );
        assert!(entry.enabled && entry.plugin.is_none() && !entry.catch_up);
        assert_eq!(entry.last_enqueue, Some(1_796_180_645.0));
        let payload = entry.payload(1_796_180_640, 1_796_180_641.5);
        assert_eq!(payload.class(), "NightlyJob");
        assert_eq!(payload.queue(), "low");
        assert_eq!(payload.get("args"), Some(&json!([1, "a"])));
        assert_eq!(payload.get("retry"), Some(&json!(3)));
        assert_eq!(payload.get("backtrace"), Some(&json!(true)));
        assert_eq!(payload.str("cron_tick"), Some("2026-12-02T03:04:00Z"));
        assert_eq!(payload.time("enqueued_at"), Some(1_796_180_641.5));
        assert_eq!(payload.jid().len(), 24);
    }

    #[test]
    fn disabled_active_job_and_odd_hashes() {
        let disabled = CronEntry::from_hash(
            "cron_job:default:x",
            &hash(&[("klass", "X"), ("cron", "* * * * *"), ("status", "disabled")]),
        )
        .unwrap();
        assert!(!disabled.enabled);
        assert_eq!(disabled.name, "x");
        assert_eq!(disabled.queue, "default");
        let job = CronEntry::from_hash(
            "cron_job:default:aj",
            &hash(&[
                ("klass", "Report"),
                ("cron", "* * * * *"),
                ("active_job", "1"),
                ("queue_name_prefix", "app"),
                ("message", r#"{"queue":"low"}"#),
                ("args", r#"{"a":1}"#),
            ]),
        )
        .unwrap();
        let payload = job.payload(0, 1.0);
        assert_eq!(payload.class(), "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper");
        assert_eq!(payload.str("wrapped"), Some("Report"));
        assert_eq!(payload.queue(), "app_low");
        assert_eq!(
            payload.get("args").and_then(|a| a[0].get("arguments")),
            Some(&json!([{"a": 1}]))
        );
        for (bad, why) in [
            (hash(&[("klass", "X")]), "cron"),
            (hash(&[("cron", "* * * * *")]), "klass"),
            (
                hash(&[("klass", "X"), ("cron", "* * * * *"), ("message", "[1]")]),
                "message",
            ),
        ] {
            let err = CronEntry::from_hash("cron_job:default:b", &bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let mut huge = hash(&[("klass", "X"), ("cron", "* * * * *")]);
        huge.insert(b"args".to_vec(), vec![b'1'; MAX_FIELD_BYTES + 1]);
        assert!(CronEntry::from_hash("k", &huge).is_err());
        let mut binary = hash(&[("cron", "* * * * *")]);
        binary.insert(b"klass".to_vec(), vec![0xff, 0xfe]);
        assert!(CronEntry::from_hash("k", &binary).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn our_fields_read_back() {
        let manifest = crate::plugin::Manifest::parse(
            std::path::Path::new("/p/x/wasmjobs.toml"),
            "component = \"x.wasm\"\nclasses = [\"A\"]\n[[schedule]]\ncron = \"0 9 * * *\"\ntimezone = \"Asia/Tokyo\"\nclass = \"A\"\nargs = [7]\nqueue = \"q\"\ncatch_up = true\n",
        )
        .unwrap();
        let schedule = &manifest.schedules[0];
        let pairs: Vec<(String, String)> = fields("x", schedule)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut map: HashMap<Vec<u8>, Vec<u8>> = pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        map.insert(b"status".to_vec(), b"enabled".to_vec());
        let entry = CronEntry::from_hash(&keys::cron_job("A"), &map).unwrap();
        assert_eq!(entry.cron, "0 9 * * * Asia/Tokyo");
        assert_eq!(
            (entry.name.as_str(), entry.class.as_str(), entry.queue.as_str()),
            ("A", "A", "q")
        );
        assert_eq!(entry.args, [json!(7)]);
        assert_eq!(entry.plugin.as_deref(), Some("x"));
        assert!(entry.catch_up && entry.enabled);
        assert_eq!(entry.payload(0, 1.0).get("retry"), Some(&json!(true)));
    }
}
