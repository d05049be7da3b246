//! The control side: pause and resume queues, cancel jobs — what
//! `wasmjobs pause`, `resume` and `cancel` (and later any dashboard) write.
//!
//! Every change is written where Sidekiq's ecosystem keeps it, then
//! announced on [`keys::CONTROL_CHANNEL`] so every running wasmjobs process
//! acts at once; processes that miss the message (not subscribed at that
//! moment, or a Sidekiq Pro client that only ran `SADD paused`) find the
//! state in Redis on their next check ([`crate::runner`]'s control loop).
//!
//! - **Pause**: the bare queue name in the `paused` SET (Sidekiq Pro's
//!   format, which Sidekiq's own `Stats#queue_summaries` reads).
//! - **Cancel**: the request `cancelled-<jid>` (the Sidekiq wiki's key, a
//!   day's TTL; wasmjobs writes who and when in it as JSON), then the job is
//!   taken out of wherever it waits — its queue, `schedule` or `retry` —
//!   and recorded in the cancelled set. A running job is stopped by the
//!   process running it, which records it the same way. Many jobs are
//!   cancelled together ([`cancel_all`]): every request is written and
//!   announced first, then each queue and set is read once for all of
//!   them (`find`), and [`recorded_since`] confirms the running ones
//!   together. Each request is also *open* ([`keys::CANCELS_OPEN`]) until
//!   its job is recorded as cancelled (for jobs taken while waiting: once
//!   every place was read, so a second copy is not fetched unlooked) or
//!   found elsewhere ([`close_requests`]): while one is, the runners' fetch looks up the
//!   request of every job it takes, so a job fetched after the request
//!   never starts even in a process that missed the announcement.
//!
//! The cancelled set ([`keys::CANCELLED`]) keeps each cancelled payload
//! with `cancelled_at`, `cancelled_by` and `cancelled_from` (a queue, a
//! set or the process that stopped it), newest first, capped at
//! [`CANCELLED_MAX`] entries and [`CANCELLED_MAX_AGE_SECS`].

mod find;

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result, bail};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::keys;
use super::now_f64;
use super::payload::Payload;

/// Most cancelled jobs kept.
pub const CANCELLED_MAX: i64 = 10_000;
/// Oldest cancelled job kept, seconds.
pub const CANCELLED_MAX_AGE_SECS: f64 = 30.0 * 86_400.0;
/// Longest jid accepted in a cancel (Sidekiq's are 24 characters).
pub const MAX_JID_LEN: usize = 128;
/// Jobs whose requests are written, or records made, per round trip.
const SEND_CHUNK: usize = 1_000;
/// How far behind this machine's clock a process's may be for
/// [`recorded_since`] to see the records it makes.
pub const CLOCK_SKEW_SECS: f64 = 60.0;

/// Who asked for a cancel and when, as written in `cancelled-<jid>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Who: `user@host (wasmjobs cancel)`, or how a Sidekiq client asked.
    pub by: String,
    /// When, epoch seconds.
    pub at: f64,
}

impl CancelRequest {
    /// A request by `by`, now.
    pub fn now(by: &str) -> Self {
        Self {
            by: by.to_owned(),
            at: now_f64(),
        }
    }

    /// Reads a request from the value of `cancelled-<jid>` (ours is JSON;
    /// the wiki's is any value, often "1") or, with `iteration`, from the
    /// `cancelled` field of `it-<jid>` (epoch seconds).
    pub fn from_value(value: &str, iteration: bool) -> Self {
        if iteration {
            return Self {
                by: BY_CANCEL_BANG.into(),
                at: value.trim().parse().unwrap_or_else(|_| now_f64()),
            };
        }
        serde_json::from_str::<Self>(value).unwrap_or_else(|_| Self {
            by: BY_WIKI_KEY.into(),
            at: now_f64(),
        })
    }

    /// Written the Sidekiq way (`cancel!` or the wiki's key), not by
    /// `wasmjobs cancel`: nothing announced it.
    pub fn is_sidekiqs(&self) -> bool {
        self.by == BY_CANCEL_BANG || self.by == BY_WIKI_KEY
    }
}

/// Who a request written by `Sidekiq::Client#cancel!` is said to be by.
const BY_CANCEL_BANG: &str = "Sidekiq::Client#cancel! (it-<jid>)";
/// Who a request written as the Sidekiq wiki's key is said to be by.
const BY_WIKI_KEY: &str = "a cancelled-<jid> key (Sidekiq wiki)";

/// A message on the control channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Stop the running job `jid`.
    Cancel(String),
    /// The `paused` set changed: read it again.
    Paused,
}

impl Message {
    /// The text published.
    pub fn encode(&self) -> String {
        match self {
            Message::Cancel(jid) => format!("cancel {jid}"),
            Message::Paused => "paused".into(),
        }
    }

    /// Parses a published text; anyone can publish, so anything else is
    /// `None`.
    pub fn decode(text: &str) -> Option<Self> {
        match text.split_once(' ') {
            Some(("cancel", jid)) => valid_jid(jid).ok().map(|()| Message::Cancel(jid.to_owned())),
            None if text == "paused" => Some(Message::Paused),
            _ => None,
        }
    }
}

/// Checks a jid given to cancel: 1 to [`MAX_JID_LEN`] printable ASCII
/// characters, no spaces (it becomes part of key names).
pub fn valid_jid(jid: &str) -> Result<()> {
    if jid.is_empty() || jid.len() > MAX_JID_LEN || !jid.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "{:?} is not a job id (1 to {MAX_JID_LEN} printable ASCII characters, no spaces)",
            crate::job::preview(jid)
        );
    }
    Ok(())
}

/// Checks a queue name given to pause or resume.
pub fn valid_queue(queue: &str) -> Result<()> {
    if queue.is_empty() || queue.len() > 256 || queue.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("{:?} is not a queue name", crate::job::preview(queue));
    }
    Ok(())
}

/// Pauses `queues`: every wasmjobs process stops fetching from them within
/// a second; jobs in flight finish.
pub async fn pause<C: ConnectionLike + Send>(conn: &mut C, queues: &[String]) -> Result<()> {
    set_paused(conn, queues, true).await
}

/// Resumes `queues`.
pub async fn resume<C: ConnectionLike + Send>(conn: &mut C, queues: &[String]) -> Result<()> {
    set_paused(conn, queues, false).await
}

async fn set_paused<C: ConnectionLike + Send>(conn: &mut C, queues: &[String], paused: bool) -> Result<()> {
    for queue in queues {
        valid_queue(queue)?;
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd(if paused { "SADD" } else { "SREM" })
        .arg(keys::PAUSED)
        .arg(queues)
        .ignore();
    pipe.cmd("PUBLISH")
        .arg(keys::CONTROL_CHANNEL)
        .arg(Message::Paused.encode())
        .ignore();
    pipe.exec_async(conn).await.context("cannot update the paused set")
}

/// The paused queues, sorted.
pub async fn paused<C: ConnectionLike + Send>(conn: &mut C) -> Result<Vec<String>> {
    let mut names: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys::PAUSED)
        .query_async(conn)
        .await
        .context("cannot read the paused set")?;
    names.sort();
    Ok(names)
}

/// Where a cancelled job was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// Taken out of this queue before it ran.
    Queue(String),
    /// Taken out of `schedule`.
    Scheduled,
    /// Taken out of `retry`.
    Retry,
    /// Running in these processes (by identity), which stop it.
    Running(Vec<String>),
    /// Nowhere: finished, never existed, or between two places right now
    /// (the request stays for a day, so a process that takes it later
    /// still cancels it).
    Unknown,
}

/// Cancels `jid` ([`cancel_all`] for one job).
pub async fn cancel<C: ConnectionLike + Send>(conn: &mut C, jid: &str, by: &str) -> Result<Found> {
    let found = cancel_all(conn, &[jid.to_owned()], &CancelRequest::now(by)).await?;
    Ok(found.into_iter().next().map_or(Found::Unknown, |(_, found)| found))
}

/// What [`cancel_looking`] found.
#[derive(Debug)]
pub struct Looked {
    /// Where each job was, in the order of the jids given (each once).
    pub found: Vec<(String, Found)>,
    /// Every queue, `schedule` and `retry` was read to its end (up to
    /// 100,000 entries a place). When not, a copy of a job may wait
    /// unread, and no request may be closed: the fetch cancels it.
    pub read_all: bool,
}

/// [`cancel_looking`], saying only where each job was.
pub async fn cancel_all<C: ConnectionLike + Send>(
    conn: &mut C,
    jids: &[String],
    request: &CancelRequest,
) -> Result<Vec<(String, Found)>> {
    Ok(cancel_looking(conn, jids, request).await?.found)
}

/// Cancels the jobs `jids` with `request`: writes every request and tells
/// every process (one round trip per [`SEND_CHUNK`] jobs, before any
/// lookup, so running jobs stop at once), then takes the jobs waiting in a
/// queue, `schedule` or `retry` out of it and records them (one pass over
/// each for all the jobs; every copy of a job that waits twice; their
/// requests closed once every place was read, up to
/// 100,000 entries a place), and finds
/// the processes running the others. Returns where each job was (the
/// first place it was found), in the order of `jids` (a jid given twice is
/// looked for once), and whether every place was read.
pub async fn cancel_looking<C: ConnectionLike + Send>(
    conn: &mut C,
    jids: &[String],
    request: &CancelRequest,
) -> Result<Looked> {
    let mut wanted = HashSet::new();
    let mut order = Vec::new();
    for jid in jids {
        valid_jid(jid)?;
        if wanted.insert(jid.as_str()) {
            order.push(jid.as_str());
        }
    }
    send(conn, &order, request).await?;

    // Every place is searched for every job, even one found already: a
    // jid can wait twice (chosen by the app, or a push replayed), and a
    // copy left behind once the request is closed would be fetched with
    // no lookup. The sets first: their jobs move into the queues (the
    // poller), never back.
    let mut found: HashMap<&str, Found> = HashMap::new();
    let mut complete = true;
    for (set, place) in [(keys::SCHEDULE, Found::Scheduled), (keys::RETRY, Found::Retry)] {
        let (taken, read_all) = take(conn, Waiting::SortedSet(set), &wanted, request, set).await?;
        complete &= read_all;
        for jid in taken {
            found.entry(jid).or_insert_with(|| place.clone());
        }
    }
    for queue in find::members(conn, keys::QUEUES).await? {
        let key = keys::queue(&queue);
        let (taken, read_all) = take(conn, Waiting::List(&key), &wanted, request, &format!("queue {queue}")).await?;
        complete &= read_all;
        for jid in taken {
            found.entry(jid).or_insert_with(|| Found::Queue(queue.clone()));
        }
    }
    // Closed only now, every place read: until then a fetch of a copy
    // not reached yet looks the request up. A place too long to read to
    // its end leaves them open (the fetch then looks for their day).
    if complete {
        let closed: Vec<&str> = found.keys().copied().collect();
        if let Err(err) = close_requests(conn, &closed).await {
            tracing::warn!("{err:#}; fetches look cancel requests up until they expire (a day)");
        }
    }
    wanted.retain(|jid| !found.contains_key(jid));
    let mut running = if wanted.is_empty() {
        HashMap::new()
    } else {
        find::running(conn, &wanted).await?
    };
    let found = order
        .into_iter()
        .map(|jid| {
            let place = found
                .remove(jid)
                .or_else(|| running.remove(jid).map(Found::Running))
                .unwrap_or(Found::Unknown);
            (jid.to_owned(), place)
        })
        .collect();
    Ok(Looked {
        found,
        read_all: complete,
    })
}

/// Adds ARGV[2..] to the open requests KEYS[1], each expiring ARGV[1]
/// seconds from now, and drops those expired; by Redis's clock, the one
/// the fetch script reads them with.
const OPEN: &str = r#"
local now = tonumber(redis.call('TIME')[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local expires = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], expires, ARGV[i])
end
"#;

/// Writes the request of each of `jids` and announces it.
async fn send<C: ConnectionLike + Send>(conn: &mut C, jids: &[&str], request: &CancelRequest) -> Result<()> {
    let value = serde_json::to_string(request).context("cannot encode the cancel request")?;
    let open = redis::Script::new(OPEN);
    for chunk in jids.chunks(SEND_CHUNK) {
        // Before the requests: a fetch that sees a request sees it open.
        // Someone else's key of another type there turns every fetch's
        // lookups on, which is what an open request asks for; any other
        // failure stops the cancel before anything is written.
        let mut invocation = open.key(keys::CANCELS_OPEN);
        invocation.arg(keys::CANCEL_TTL_SECS).arg(chunk);
        match invocation.invoke_async::<()>(conn).await {
            Ok(()) => {}
            Err(err) if err.code() == Some("WRONGTYPE") => tracing::warn!(
                "cannot note the cancel requests as open in {}: {err}; fetches look every job's request up while that key is not a sorted set",
                keys::CANCELS_OPEN
            ),
            Err(err) => return Err(err).context("cannot note the cancel requests as open"),
        }
        let mut pipe = redis::pipe();
        for jid in chunk {
            pipe.cmd("SET")
                .arg(keys::cancel_request(jid))
                .arg(&value)
                .arg("EX")
                .arg(keys::CANCEL_TTL_SECS)
                .ignore();
        }
        for jid in chunk {
            pipe.cmd("PUBLISH")
                .arg(keys::CONTROL_CHANNEL)
                .arg(Message::Cancel((*jid).to_owned()).encode())
                .ignore();
        }
        pipe.exec_async(conn).await.with_context(|| match chunk {
            [jid] => format!("cannot write the cancel request for {jid}"),
            _ => format!("cannot write the cancel requests of {} jobs", chunk.len()),
        })?;
    }
    Ok(())
}

/// Adds to `pipe` (a transaction recording the jobs `jids` as cancelled)
/// the close of their requests ([`keys::CANCELS_OPEN`]). In Lua with
/// `pcall`: that key of another type (someone else's) must not fail the
/// transaction that records the jobs.
pub fn stage_close(pipe: &mut redis::Pipeline, jids: &[&str]) {
    if jids.is_empty() {
        return;
    }
    pipe.cmd("EVAL")
        .arg("redis.pcall('ZREM', KEYS[1], unpack(ARGV)) return 0")
        .arg(1)
        .arg(keys::CANCELS_OPEN)
        .arg(jids)
        .ignore();
}

/// Closes the requests of `jids`: each job is recorded as cancelled, or
/// was found on another shard. Once no request is open, fetches stop
/// looking cancel requests up.
pub async fn close_requests<C: ConnectionLike + Send>(conn: &mut C, jids: &[&str]) -> Result<()> {
    for chunk in jids.chunks(SEND_CHUNK) {
        redis::cmd("ZREM")
            .arg(keys::CANCELS_OPEN)
            .arg(chunk)
            .exec_async(conn)
            .await
            .context("cannot close the cancel requests")?;
    }
    Ok(())
}

/// Where jobs wait to run.
#[derive(Clone, Copy)]
enum Waiting<'k> {
    /// A queue.
    List(&'k str),
    /// `schedule` or `retry`.
    SortedSet(&'k str),
}

/// Takes the jobs of `wanted` waiting in `place` out of it, every copy,
/// and records them as cancelled from `from`; returns the jid of each
/// copy taken (not of one that a process took first meanwhile), and
/// whether `place` was read to its end.
async fn take<'a, C: ConnectionLike + Send>(
    conn: &mut C,
    place: Waiting<'_>,
    wanted: &HashSet<&'a str>,
    request: &CancelRequest,
    from: &str,
) -> Result<(Vec<&'a str>, bool)> {
    let (range, key) = match place {
        Waiting::List(key) => ("LRANGE", key),
        Waiting::SortedSet(key) => ("ZRANGE", key),
    };
    let find::Hits { hits, complete } = find::entries(conn, range, key, wanted, find::Copies::All).await?;
    if hits.is_empty() {
        return Ok((Vec::new(), complete));
    }
    let mut pipe = redis::pipe();
    for (_, raw) in &hits {
        match place {
            Waiting::List(_) => pipe.cmd("LREM").arg(key).arg(1).arg(raw),
            Waiting::SortedSet(_) => pipe.cmd("ZREM").arg(key).arg(raw),
        };
    }
    let removed: Vec<i64> = pipe
        .query_async(conn)
        .await
        .with_context(|| format!("cannot take the cancelled jobs out of {key}"))?;
    let taken: Vec<(&'a str, String)> = hits
        .into_iter()
        .zip(removed)
        .filter(|(_, removed)| *removed == 1)
        .map(|(hit, _)| hit)
        .collect();
    record(conn, &taken, request, from).await?;
    Ok((taken.into_iter().map(|(jid, _)| jid).collect(), complete))
}

/// Records each of `taken` as cancelled (the set, trimmed, and the
/// counter) and releases its unique lock, if it holds one: it is gone for
/// good.
async fn record<C: ConnectionLike + Send>(
    conn: &mut C,
    taken: &[(&str, String)],
    request: &CancelRequest,
    from: &str,
) -> Result<()> {
    for chunk in taken.chunks(SEND_CHUNK) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (_, raw) in chunk {
            stage_cancelled(&mut pipe, &cancelled_payload(raw, request, from), request.at);
            if let Some((lock, _)) = super::unique::Lock::from_payload(raw) {
                lock.stage_release(&mut pipe);
            }
        }
        pipe.exec_async(conn)
            .await
            .context("cannot record the cancelled jobs")?;
    }
    Ok(())
}

/// `raw` with the cancel's `cancelled_at`, `cancelled_by` and
/// `cancelled_from`; a payload that is not a job is kept as text under
/// `payload`.
pub fn cancelled_payload(raw: &str, request: &CancelRequest, from: &str) -> String {
    let mut payload = match Payload::parse(raw) {
        Ok(payload) => payload,
        Err(_) => {
            match Payload::parse(&serde_json::json!({"class": "(malformed)", "args": [], "payload": raw}).to_string()) {
                Ok(payload) => payload,
                Err(_) => return raw.to_owned(),
            }
        }
    };
    payload.set_time("cancelled_at", request.at);
    payload.set("cancelled_by", Value::String(request.by.clone()));
    payload.set("cancelled_from", Value::String(from.to_owned()));
    payload.to_json()
}

/// Adds the writes recording `payload` as cancelled at `now` to `pipe`:
/// the cancelled set (trimmed) and the counter.
pub fn stage_cancelled(pipe: &mut redis::Pipeline, payload: &str, now: f64) {
    pipe.cmd("ZADD").arg(keys::CANCELLED).arg(now).arg(payload).ignore();
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(keys::CANCELLED)
        .arg("-inf")
        .arg(now - CANCELLED_MAX_AGE_SECS)
        .ignore();
    pipe.cmd("ZREMRANGEBYRANK")
        .arg(keys::CANCELLED)
        .arg(0)
        .arg(-(CANCELLED_MAX + 1))
        .ignore();
    pipe.cmd("INCR").arg(keys::STAT_CANCELLED).ignore();
}

/// The jobs recorded as cancelled by `request` or a later cancel: each
/// one's jid and where it was stopped (`cancelled_from`). Read from the
/// records scored from [`CLOCK_SKEW_SECS`] before the request on (a
/// process scores a record with its own clock).
pub async fn recorded_since<C: ConnectionLike + Send>(
    conn: &mut C,
    request: &CancelRequest,
) -> Result<Vec<(String, String)>> {
    let records: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(keys::CANCELLED)
        .arg(request.at - CLOCK_SKEW_SECS)
        .arg("+inf")
        .arg("BYSCORE")
        .query_async(conn)
        .await
        .context("cannot read the cancelled set")?;
    Ok(records
        .iter()
        .filter_map(|raw| Payload::parse(std::str::from_utf8(raw).ok()?).ok())
        // Times are kept to the millisecond at least.
        .filter(|payload| payload.time("cancelled_at").is_some_and(|at| at >= request.at - 0.002))
        .map(|payload| {
            let from = payload.str("cancelled_from").unwrap_or("recorded").to_owned();
            (payload.jid().to_owned(), from)
        })
        .collect())
}

/// Which of `jids` are in the cancelled set already (newest first, as
/// `ZREVRANGE` reads it): for each, when it was cancelled (epoch seconds)
/// and where it was stopped (`cancelled_from`).
pub async fn already_cancelled<C: ConnectionLike + Send>(
    conn: &mut C,
    jids: &[&str],
) -> Result<HashMap<String, (Option<f64>, String)>> {
    let wanted: HashSet<&str> = jids.iter().copied().collect();
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(
        find::entries(conn, "ZREVRANGE", keys::CANCELLED, &wanted, find::Copies::First)
            .await?
            .hits
            .into_iter()
            .filter_map(|(jid, raw)| {
                let payload = Payload::parse(&raw).ok()?;
                let from = payload.str("cancelled_from").unwrap_or("recorded").to_owned();
                Some((jid.to_owned(), (payload.time("cancelled_at"), from)))
            })
            .collect(),
    )
}

/// How many jobs were ever recorded as cancelled (`None` if the counter is
/// not a number: another client wrote it).
pub async fn cancelled_count<C: ConnectionLike + Send>(conn: &mut C) -> Result<Option<u64>> {
    let count: Option<String> = match redis::cmd("GET").arg(keys::STAT_CANCELLED).query_async(conn).await {
        Ok(count) => count,
        Err(err) if err.code() == Some("WRONGTYPE") => return Ok(None),
        Err(err) => return Err(err).context("cannot read the cancelled counter"),
    };
    Ok(match count {
        None => Some(0),
        Some(count) => count.trim().parse().ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_ignored() {
        for message in [Message::Cancel("0123456789abcdef01234567".into()), Message::Paused] {
            assert_eq!(Message::decode(&message.encode()), Some(message));
        }
        for junk in [
            "",
            "cancel",
            "cancel ",
            "cancel a b",
            "paused x",
            "resume q",
            "cancel \u{1}",
        ] {
            assert_eq!(Message::decode(junk), None, "{junk:?}");
        }
        let long = format!("cancel {}", "a".repeat(MAX_JID_LEN + 1));
        assert_eq!(Message::decode(&long), None);
    }

    #[test]
    fn requests_read_every_writer() {
        let ours = CancelRequest {
            by: "me@host".into(),
            at: 12.5,
        };
        let text = serde_json::to_string(&ours).unwrap();
        assert_eq!(CancelRequest::from_value(&text, false), ours);
        let wiki = CancelRequest::from_value("1", false);
        assert!(wiki.by.contains("cancelled-<jid>"), "{wiki:?}");
        let iteration = CancelRequest::from_value("1700000000", true);
        assert_eq!(iteration.at, 1_700_000_000.0);
        assert!(iteration.by.contains("cancel!"), "{iteration:?}");
    }

    #[test]
    fn cancelled_payloads_say_who_and_when() {
        let request = CancelRequest {
            by: "me".into(),
            at: 100.0,
        };
        let text = cancelled_payload(r#"{"class":"A","args":[],"jid":"j"}"#, &request, "queue default");
        let payload = Payload::parse(&text).unwrap();
        assert_eq!(payload.str("cancelled_by"), Some("me"));
        assert_eq!(payload.str("cancelled_from"), Some("queue default"));
        assert_eq!(payload.time("cancelled_at"), Some(100.0));
        let junk = cancelled_payload("not json", &request, "x");
        assert_eq!(Payload::parse(&junk).unwrap().str("payload"), Some("not json"));
    }

    #[tokio::test]
    async fn many_jobs_are_found_wherever_they_wait_and_foreign_keys_are_skipped() {
        use super::super::client;
        let data = tempfile::tempdir().expect("tempdir");
        let redis = embedded(data.path()).await;
        let mut conn = redis.conn();
        let now = now_f64();
        let job = |queue: &str| Payload::new("A", vec![Value::from("x")], queue, now);
        let (mut queued, mut other, mut later, failed) = (job("default"), job("low"), job("default"), job("default"));
        client::push(&mut conn, &mut queued).await.expect("push");
        client::push(&mut conn, &mut other).await.expect("push");
        client::schedule(&mut conn, &mut later, now + 3_600.0)
            .await
            .expect("schedule");
        let _: () = redis::cmd("ZADD")
            .arg(keys::RETRY)
            .arg(now + 3_600.0)
            .arg(failed.to_json())
            .query_async(&mut conn)
            .await
            .expect("ZADD");
        // Another client's keys: a hash where a queue should be, listed in
        // `queues`, and a string as the in-progress owners.
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg("queue:junk")
            .arg("a")
            .arg("b")
            .ignore()
            .cmd("SADD")
            .arg(keys::QUEUES)
            .arg("junk")
            .ignore()
            .cmd("SET")
            .arg(keys::INPROGRESS_OWNERS)
            .arg("x")
            .ignore()
            .query_async(&mut conn)
            .await
            .expect("foreign keys");
        let unknown = "f".repeat(24);
        let jids: Vec<String> = [
            queued.jid(),
            later.jid(),
            failed.jid(),
            other.jid(),
            &unknown,
            queued.jid(),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let request = CancelRequest::now("me");
        let found = cancel_all(&mut conn, &jids, &request).await.expect("cancel");
        let expected = vec![
            (queued.jid().to_owned(), Found::Queue("default".into())),
            (later.jid().to_owned(), Found::Scheduled),
            (failed.jid().to_owned(), Found::Retry),
            (other.jid().to_owned(), Found::Queue("low".into())),
            (unknown.clone(), Found::Unknown),
        ];
        assert_eq!(found, expected);
        // Each recorded once, with where it was; every request written.
        let mut recorded = recorded_since(&mut conn, &request).await.expect("records");
        recorded.sort();
        let mut froms = vec![
            (queued.jid().to_owned(), "queue default".to_owned()),
            (later.jid().to_owned(), keys::SCHEDULE.to_owned()),
            (failed.jid().to_owned(), keys::RETRY.to_owned()),
            (other.jid().to_owned(), "queue low".to_owned()),
        ];
        froms.sort();
        assert_eq!(recorded, froms);
        assert_eq!(cancelled_count(&mut conn).await.expect("count"), Some(4));
        for jid in &jids {
            let exists: bool = redis::cmd("EXISTS")
                .arg(keys::cancel_request(jid))
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            assert!(exists, "{jid}");
        }
        // A later cancel's records are not this one's.
        let before = CancelRequest {
            by: "me".into(),
            at: request.at + 10.0,
        };
        assert!(recorded_since(&mut conn, &before).await.expect("records").is_empty());
        drop(conn);
        redis.close().await.expect("close");
    }

    /// A private redis-server in `data`.
    async fn embedded(data: &std::path::Path) -> super::super::Redis {
        super::super::connect(&super::super::Target::Embedded(data.to_path_buf()))
            .await
            .expect("the embedded redis-server")
    }

    /// When `jid`'s open request expires, if it is open.
    async fn open_score(conn: &mut redis::aio::ConnectionManager, jid: &str) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(keys::CANCELS_OPEN)
            .arg(jid)
            .query_async(conn)
            .await
            .expect("ZSCORE")
    }

    /// A queue too long to read to its end: the copies read are taken,
    /// and the request stays open, so the fetch finds any copy further on
    /// (a request closed then would let it run unlooked). A short one
    /// closes it. Run on a real Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_stay_open_when_a_place_is_too_long_to_read() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = embedded(data.path()).await;
        let mut conn = redis.conn();
        let jid = "0123456789abcdef01234567";
        let job = format!(r#"{{"class":"A","args":[],"jid":"{jid}","queue":"long"}}"#);
        let other = r#"{"class":"A","args":[],"jid":"ffffffffffffffffffffffff","queue":"long"}"#;
        // The copy read first (LRANGE from index 0), the rest past the budget.
        let mut pipe = redis::pipe();
        pipe.sadd(keys::QUEUES, "long").ignore();
        pipe.rpush(keys::queue("long"), &job).ignore();
        for _ in 0..(find::ALL_COPIES_AT_MOST as usize) {
            pipe.rpush(keys::queue("long"), other).ignore();
        }
        pipe.rpush(keys::queue("long"), &job).ignore();
        let _: () = pipe.query_async(&mut conn).await.expect("push");

        let request = CancelRequest::now("me");
        let found = cancel_all(&mut conn, &[jid.to_owned()], &request)
            .await
            .expect("cancel");
        assert_eq!(found, vec![(jid.to_owned(), Found::Queue("long".into()))]);
        let open = open_score(&mut conn, jid).await;
        assert!(open.is_some(), "closed with a copy left unread");
        let left: usize = redis::cmd("LLEN")
            .arg(keys::queue("long"))
            .query_async(&mut conn)
            .await
            .expect("LLEN");
        assert_eq!(left, find::ALL_COPIES_AT_MOST as usize + 1, "the first copy is taken");

        let _: () = redis::cmd("DEL")
            .arg(keys::queue("long"))
            .query_async(&mut conn)
            .await
            .expect("DEL");
        let _: () = redis::cmd("RPUSH")
            .arg(keys::queue("long"))
            .arg(&job)
            .query_async(&mut conn)
            .await
            .expect("RPUSH");
        cancel_all(&mut conn, &[jid.to_owned()], &request)
            .await
            .expect("cancel");
        let open = open_score(&mut conn, jid).await;
        assert_eq!(open, None, "every place read: closed");
        drop(conn);
        redis.close().await.expect("close");
    }
}
