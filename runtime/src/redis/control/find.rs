//! Finding jobs by jid for a cancel: in a queue, `schedule` or `retry`
//! (one pass over each for every jid asked), and in the processes running
//! them.
//!
//! Every key read here can be written by any Redis client: an entry that is
//! not a job is skipped, and a key of another type than expected (a hash
//! at `queue:x`, a string in `processes`) is skipped with a warning instead
//! of failing the whole cancel.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use serde::Deserialize;
use serde_json::Value;

use super::super::keys;
use super::super::payload::Payload;

/// Entries read per round trip.
const SCAN_CHUNK: isize = 1_000;
/// Up to this many jids asked, an entry is searched for each as text
/// before it is parsed (most entries are then never parsed).
const SEARCH_AT_MOST: usize = 8;
/// Most entries of one list or set read for [`Copies::All`] (100 round
/// trips); past it the read is not complete, and the caller leaves the
/// requests open, so the fetch looks up any copy it did not reach.
pub(super) const ALL_COPIES_AT_MOST: isize = 100_000;

/// The members of the set `key` (none if another client wrote a key of
/// another type there).
pub(super) async fn members<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> Result<Vec<String>> {
    match redis::cmd("SMEMBERS").arg(key).query_async(conn).await {
        Ok(members) => Ok(members),
        Err(err) if err.code() == Some("WRONGTYPE") => {
            tracing::warn!(key, "{key} is not a set (another client wrote it); skipped");
            Ok(Vec::new())
        }
        Err(err) => Err(err).with_context(|| format!("cannot read {key}")),
    }
}

/// Which entries of a job [`entries`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Copies {
    /// The first one of each job: the read stops once every job is found.
    First,
    /// Every one: a jid an app chose, or a push replayed, can wait twice
    /// in one place, and a cancel must take each copy.
    All,
}

/// What [`entries`] found.
pub(super) struct Hits<'a> {
    /// Each entry that is a job asked for, with its jid.
    pub(super) hits: Vec<(&'a str, String)>,
    /// Whether `key` was read to its end (for [`Copies::All`]: not past
    /// [`ALL_COPIES_AT_MOST`]), or held no jobs.
    pub(super) complete: bool,
}

/// The entries of the list or sorted set `key` (read with `range`,
/// `LRANGE` or `ZRANGE`, by index, [`SCAN_CHUNK`] at a time) that are jobs
/// of `wanted`, each with its jid: the first or every one of each job, as
/// `copies` says.
pub(super) async fn entries<'a, C: ConnectionLike + Send>(
    conn: &mut C,
    range: &str,
    key: &str,
    wanted: &HashSet<&'a str>,
    copies: Copies,
) -> Result<Hits<'a>> {
    let mut hits = Vec::new();
    let mut seen = HashSet::new();
    let mut start = 0isize;
    loop {
        let chunk: Vec<Vec<u8>> = match redis::cmd(range)
            .arg(key)
            .arg(start)
            .arg(start + SCAN_CHUNK - 1)
            .query_async(conn)
            .await
        {
            Ok(chunk) => chunk,
            Err(err) if err.code() == Some("WRONGTYPE") => {
                tracing::warn!(
                    key,
                    "{key} holds no jobs (another client wrote a key of another type there); skipped"
                );
                return Ok(Hits { hits, complete: true });
            }
            Err(err) => return Err(err).with_context(|| format!("cannot read {key}")),
        };
        let done = (chunk.len() as isize) < SCAN_CHUNK;
        for raw in chunk {
            let Ok(raw) = String::from_utf8(raw) else { continue };
            if let Some(jid) = job_of(&raw, wanted)
                && (seen.insert(jid) || copies == Copies::All)
            {
                hits.push((jid, raw));
            }
        }
        if done || (copies == Copies::First && seen.len() == wanted.len()) {
            return Ok(Hits { hits, complete: true });
        }
        start += SCAN_CHUNK;
        if copies == Copies::All && start >= ALL_COPIES_AT_MOST {
            return Ok(Hits { hits, complete: false });
        }
    }
}

/// The jid of the job `raw` if it is one of `wanted` (parsed, so a jid
/// inside its args does not count).
pub(super) fn job_of<'a>(raw: &str, wanted: &HashSet<&'a str>) -> Option<&'a str> {
    /// Only the jid: the rest of the entry is skipped, not built.
    #[derive(Deserialize)]
    struct Head<'r> {
        #[serde(borrow, default)]
        jid: Option<Cow<'r, str>>,
    }
    if wanted.len() <= SEARCH_AT_MOST && !wanted.iter().any(|jid| raw.contains(jid)) {
        return None;
    }
    let head: Head<'_> = serde_json::from_str(raw).ok()?;
    let jid = wanted.get(head.jid?.as_ref()).copied()?;
    // The full parse, as the runner reads the job, has the last word.
    Payload::parse(raw)
        .is_ok_and(|payload| payload.jid() == jid)
        .then_some(jid)
}

/// The lists of `owner` that exist ([`keys::held_lists`]), asked in one
/// round trip.
async fn held_lists<C: ConnectionLike + Send>(conn: &mut C, owner: &str) -> Result<Vec<String>> {
    let lists = keys::held_lists(owner);
    let mut pipe = redis::pipe();
    for list in &lists {
        pipe.cmd("EXISTS").arg(list);
    }
    let exist: Vec<bool> = pipe
        .query_async(conn)
        .await
        .with_context(|| format!("cannot list the in-progress lists of {owner}"))?;
    Ok(lists
        .into_iter()
        .zip(exist)
        .filter_map(|(list, e)| e.then_some(list))
        .collect())
}

/// The processes holding each job of `wanted`: in their in-progress list
/// or batch lists (reliable fetch, current to the moment) or, for a job in none, their
/// work hash (written with each heartbeat, the only trace of a job taken
/// in basic mode). One pass over each list and hash for every job.
pub(super) async fn running<'a, C: ConnectionLike + Send>(
    conn: &mut C,
    wanted: &HashSet<&'a str>,
) -> Result<HashMap<&'a str, Vec<String>>> {
    let mut running: HashMap<&'a str, Vec<String>> = HashMap::new();
    let mut owners = Vec::new();
    for set in keys::OWNER_SETS {
        owners.extend(members(conn, set).await?);
    }
    owners.sort();
    owners.dedup();
    for owner in owners {
        let mut found = HashSet::new();
        for list in held_lists(conn, &owner).await? {
            for (jid, _) in entries(conn, "LRANGE", &list, wanted, Copies::First).await?.hits {
                if found.insert(jid) {
                    running.entry(jid).or_default().push(owner.clone());
                }
            }
        }
    }
    let rest: HashSet<&'a str> = wanted
        .iter()
        .copied()
        .filter(|jid| !running.contains_key(jid))
        .collect();
    if rest.is_empty() {
        return Ok(running);
    }
    for identity in members(conn, keys::PROCESSES).await? {
        let work: Vec<String> = redis::cmd("HVALS")
            .arg(keys::work(&identity))
            .query_async(conn)
            .await
            .unwrap_or_default();
        let held: HashSet<&'a str> = work
            .iter()
            .filter_map(|entry| work_jid(entry))
            .filter_map(|jid| rest.get(jid.as_str()).copied())
            .collect();
        for jid in held {
            running.entry(jid).or_default().push(identity.clone());
        }
    }
    Ok(running)
}

/// The jid of the job a work-hash entry shows (its `payload` is the job's
/// JSON as text, or an object).
fn work_jid(entry: &str) -> Option<String> {
    let value: Value = serde_json::from_str(entry).ok()?;
    let payload = match value.get("payload")? {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        other => other.clone(),
    };
    payload.get("jid")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jid_in_the_args_is_not_the_job() {
        let raw = r#"{"class":"A","args":["0123"],"jid":"abcd"}"#;
        let wanted = |jids: &[&'static str]| jids.iter().copied().collect::<HashSet<&str>>();
        assert_eq!(job_of(raw, &wanted(&["abcd"])), Some("abcd"));
        assert_eq!(job_of(raw, &wanted(&["0123"])), None);
        // Past the text search too.
        let many: Vec<String> = (0..20).map(|n| format!("{n:04}")).collect();
        let mut set: HashSet<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(job_of(raw, &set), None);
        set.insert("abcd");
        assert_eq!(job_of(raw, &set), Some("abcd"));
        for junk in ["", "not json", "[\"abcd\"]", r#"{"jid":1}"#, r#"{"jid":"ab\u0063d"#] {
            assert_eq!(job_of(junk, &set), None, "{junk}");
        }
    }

    #[test]
    fn work_entries_name_their_job_either_way() {
        let text = r#"{"queue":"q","payload":"{\"class\":\"A\",\"jid\":\"j1\"}","run_at":1}"#;
        let object = r#"{"queue":"q","payload":{"class":"A","jid":"j2"},"run_at":1}"#;
        assert_eq!(work_jid(text).as_deref(), Some("j1"));
        assert_eq!(work_jid(object).as_deref(), Some("j2"));
        assert_eq!(work_jid(r#"{"payload":"not json"}"#), None);
        assert_eq!(work_jid("[]"), None);
    }
}
