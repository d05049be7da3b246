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
//!   process running it, which records it the same way.
//!
//! The cancelled set ([`keys::CANCELLED`]) keeps each cancelled payload
//! with `cancelled_at`, `cancelled_by` and `cancelled_from` (a queue, a
//! set or the process that stopped it), newest first, capped at
//! [`CANCELLED_MAX`] entries and [`CANCELLED_MAX_AGE_SECS`].

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
/// Entries read per round trip while looking for a job.
const SCAN_CHUNK: isize = 1_000;

/// Who asked for a cancel and when, as written in `cancelled-<jid>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// Who: `user@host (wasmjobs cancel)`, or how a Sidekiq client asked.
    pub by: String,
    /// When, epoch seconds.
    pub at: f64,
}

impl CancelRequest {
    /// Reads a request from the value of `cancelled-<jid>` (ours is JSON;
    /// the wiki's is any value, often "1") or, with `iteration`, from the
    /// `cancelled` field of `it-<jid>` (epoch seconds).
    pub fn from_value(value: &str, iteration: bool) -> Self {
        if iteration {
            return Self {
                by: "Sidekiq::Client#cancel! (it-<jid>)".into(),
                at: value.trim().parse().unwrap_or_else(|_| now_f64()),
            };
        }
        serde_json::from_str::<Self>(value).unwrap_or_else(|_| Self {
            by: "a cancelled-<jid> key (Sidekiq wiki)".into(),
            at: now_f64(),
        })
    }
}

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

/// Cancels `jid`: writes the request, tells every process, and takes the
/// job out of its queue, `schedule` or `retry` if it waits there. Returns
/// where it was.
pub async fn cancel<C: ConnectionLike + Send>(conn: &mut C, jid: &str, by: &str) -> Result<Found> {
    valid_jid(jid)?;
    let now = now_f64();
    let request = CancelRequest {
        by: by.to_owned(),
        at: now,
    };
    let value = serde_json::to_string(&request).context("cannot encode the cancel request")?;
    redis::pipe()
        .cmd("SET")
        .arg(keys::cancel_request(jid))
        .arg(value)
        .arg("EX")
        .arg(keys::CANCEL_TTL_SECS)
        .ignore()
        .cmd("PUBLISH")
        .arg(keys::CONTROL_CHANNEL)
        .arg(Message::Cancel(jid.to_owned()).encode())
        .ignore()
        .exec_async(conn)
        .await
        .with_context(|| format!("cannot write the cancel request for {jid}"))?;

    let queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys::QUEUES)
        .query_async(conn)
        .await
        .context("cannot read the queue names")?;
    for queue in queues {
        if let Some(raw) = find(conn, "LRANGE", &keys::queue(&queue), jid).await? {
            let removed: i64 = redis::cmd("LREM")
                .arg(keys::queue(&queue))
                .arg(1)
                .arg(&raw)
                .query_async(conn)
                .await
                .context("cannot remove the job from its queue")?;
            if removed == 1 {
                record(conn, &raw, &request, &format!("queue {queue}")).await?;
                return Ok(Found::Queue(queue));
            }
        }
    }
    for (set, found) in [(keys::SCHEDULE, Found::Scheduled), (keys::RETRY, Found::Retry)] {
        if let Some(raw) = find(conn, "ZRANGE", set, jid).await? {
            let removed: i64 = redis::cmd("ZREM")
                .arg(set)
                .arg(&raw)
                .query_async(conn)
                .await
                .with_context(|| format!("cannot remove the job from {set}"))?;
            if removed == 1 {
                record(conn, &raw, &request, set).await?;
                return Ok(found);
            }
        }
    }
    let running = running_in(conn, jid).await?;
    if running.is_empty() {
        return Ok(Found::Unknown);
    }
    Ok(Found::Running(running))
}

/// Records `raw` as cancelled (the set, trimmed, and the counter) and
/// releases its unique lock, if it holds one: it is gone for good.
async fn record<C: ConnectionLike + Send>(conn: &mut C, raw: &str, request: &CancelRequest, from: &str) -> Result<()> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    stage_cancelled(&mut pipe, &cancelled_payload(raw, request, from), request.at);
    if let Some((lock, _)) = super::unique::Lock::from_payload(raw) {
        lock.stage_release(&mut pipe);
    }
    pipe.exec_async(conn).await.context("cannot record the cancelled job")
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

/// Whether `raw` is the job `jid` (parsed, so a jid inside its args does
/// not count).
fn is_job(raw: &str, jid: &str) -> bool {
    raw.contains(jid) && Payload::parse(raw).is_ok_and(|payload| payload.jid() == jid)
}

/// The entry of the list or sorted set `key` (read with `range`, by index,
/// [`SCAN_CHUNK`] at a time) that is the job `jid`.
async fn find<C: ConnectionLike + Send>(conn: &mut C, range: &str, key: &str, jid: &str) -> Result<Option<String>> {
    let mut start = 0isize;
    loop {
        let chunk: Vec<Vec<u8>> = redis::cmd(range)
            .arg(key)
            .arg(start)
            .arg(start + SCAN_CHUNK - 1)
            .query_async(conn)
            .await
            .with_context(|| format!("cannot read {key}"))?;
        let done = (chunk.len() as isize) < SCAN_CHUNK;
        if let Some(raw) = chunk
            .into_iter()
            .filter_map(|raw| String::from_utf8(raw).ok())
            .find(|raw| is_job(raw, jid))
        {
            return Ok(Some(raw));
        }
        if done {
            return Ok(None);
        }
        start += SCAN_CHUNK;
    }
}

/// The processes holding `jid`: in their in-progress list (reliable
/// fetch, current to the moment) or their work hash (written with each
/// heartbeat, the only trace of a job taken in basic mode).
async fn running_in<C: ConnectionLike + Send>(conn: &mut C, jid: &str) -> Result<Vec<String>> {
    let owners: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys::INPROGRESS_OWNERS)
        .query_async(conn)
        .await
        .context("cannot read the in-progress owners")?;
    let mut running = Vec::new();
    for owner in owners {
        if find(conn, "LRANGE", &keys::inprogress(&owner), jid).await?.is_some() {
            running.push(owner);
        }
    }
    if !running.is_empty() {
        return Ok(running);
    }
    let identities: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys::PROCESSES)
        .query_async(conn)
        .await
        .context("cannot read the process set")?;
    for identity in identities {
        let work: Vec<String> = redis::cmd("HVALS")
            .arg(keys::work(&identity))
            .query_async(conn)
            .await
            .unwrap_or_default();
        let holds = work.iter().any(|entry| {
            serde_json::from_str::<Value>(entry).is_ok_and(|value| {
                let payload = value.get("payload");
                let payload = match payload {
                    Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok(),
                    Some(other) => Some(other.clone()),
                    None => None,
                };
                payload.is_some_and(|p| p.get("jid").and_then(Value::as_str) == Some(jid))
            })
        });
        if holds {
            running.push(identity);
        }
    }
    Ok(running)
}

/// The most recently cancelled jobs, newest first (at most `max`).
pub async fn cancelled<C: ConnectionLike + Send>(conn: &mut C, max: usize) -> Result<Vec<String>> {
    redis::cmd("ZRANGE")
        .arg(keys::CANCELLED)
        .arg(0)
        .arg(max.saturating_sub(1))
        .arg("REV")
        .query_async(conn)
        .await
        .context("cannot read the cancelled set")
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
    fn a_jid_in_the_args_is_not_the_job() {
        let raw = r#"{"class":"A","args":["0123"],"jid":"abcd"}"#;
        assert!(is_job(raw, "abcd"));
        assert!(!is_job(raw, "0123"));
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
}
