//! `wasmjobs cancel JID...`: stop jobs wherever they are.
//!
//! A job waiting in its queue, in `schedule` or in `retry` is taken out
//! and recorded as cancelled; a job running in any process is stopped by
//! that process within about 100 ms (it hears the cancel on the control
//! channel) and recorded there. Every request is sent before anything is
//! looked up, and the jobs are looked up together
//! ([`control::cancel_all`]); the command then waits (up to `--wait`) for
//! the running jobs' processes to confirm, all at once, and says where
//! each job was. A jid found nowhere is reported (exit status 1); its
//! request stays in Redis for a day, so a job with that jid pushed or
//! fetched meanwhile is still cancelled. `crate::redis::control` has the
//! Redis side. With `--source`, a jid not found in Redis is looked for in
//! the PostgreSQL store too, and taken out there if it waits unclaimed
//! (`crate::pg::cancel`); a running one is stopped as on Redis, and one
//! cancelled before is found in `wasmjobs.dead` and said to be. With
//! shards, every shard is searched at once (a jid does not say where its
//! job is) and the shard that held the job is named.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::control::{self, CancelRequest, Found};
use crate::redis::shards::{close_all, open_all};

/// Arguments of `wasmjobs cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Also take the jobs out of the PostgreSQL job store at URL.
    #[arg(long = "source", env = "WASMJOBS_SOURCE", hide_env_values = true, value_name = "URL")]
    pub jobs_source: Option<String>,
    /// Who is cancelling, recorded with each job (default: user@host).
    #[arg(long)]
    pub by: Option<String>,
    /// How long to wait for the running jobs' processes to confirm they stopped.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub wait: f64,
    /// The jobs' ids.
    #[arg(required = true, value_name = "JID")]
    pub jids: Vec<String>,
}

/// How long a jid found nowhere is given to show up as cancelled.
const UNKNOWN_GRACE: Duration = Duration::from_millis(500);
/// Time between two looks at the cancelled jobs' counter.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Runs the command.
pub async fn run(cli: &Cli, args: &CancelArgs) -> Result<ExitCode> {
    for jid in &args.jids {
        control::valid_jid(jid)?;
    }
    let by = match &args.by {
        Some(by) => by.clone(),
        None => format!(
            "{}@{} (wasmjobs cancel)",
            std::env::var("USER").unwrap_or_else(|_| "someone".into()),
            crate::runner::heartbeat::hostname()
        ),
    };
    let store = match &args.jobs_source {
        Some(url) => Some(crate::pg::Pg::connect(url).await?),
        None => None,
    };
    let map = args.redis.shard_map(&cli.data_dir)?;
    let shards = open_all(&map).await;
    if !map.is_sharded()
        && let Some(Err(err)) = shards.first().map(|shard| &shard.redis)
    {
        return Err(anyhow!("{err:#}"));
    }
    // At most a day; NaN or below zero: no wait.
    let wait = Duration::try_from_secs_f64(args.wait.clamp(0.0, 86_400.0)).unwrap_or(Duration::ZERO);
    let request = CancelRequest::now(&by);
    // Every shard at once: the jid does not say where the job is. The
    // PostgreSQL store is looked in once, beside the default shard.
    let per_shard = shards.iter().enumerate().map(|(index, shard)| {
        let (store, request) = (store.as_ref().filter(|_| index == 0), &request);
        async move {
            let mut conn = shard.redis.as_ref().map_err(|err| anyhow!("{err:#}"))?.conn();
            cancel(&mut conn, store, &args.jids, request, wait).await
        }
    });
    let results = futures_util::future::join_all(per_shard).await;
    close_resolved(&shards, &results).await;
    close_all(shards).await?;
    let results = results
        .into_iter()
        .map(|result| result.map(|said| said.into_iter().map(|s| (s.line, s.found)).collect()))
        .collect();
    let result = merge(map.routes.names(), results);
    let mut unknown = 0;
    for (line, found) in result? {
        unknown += usize::from(!found);
        println!("{line}");
    }
    Ok(if unknown > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// What one shard says of one jid.
struct Said {
    /// The jid.
    jid: String,
    /// The line printed.
    line: String,
    /// The job was found (or was cancelled before).
    found: bool,
    /// Its request stays open there: the job runs on this shard and its
    /// process has not confirmed yet, or a place on this shard was too
    /// long to read to its end (a copy may wait unread).
    open: bool,
}

/// Closes the requests that are done with on each shard (see
/// `control::close_requests`): every jid found somewhere, except where it
/// stays open (`Said::open`). A jid found nowhere stays
/// open on every shard for its day (a job with that jid may be pushed to
/// any of them). A failure only costs fetches a lookup for that day, so
/// it is said and not fatal.
async fn close_resolved(shards: &[crate::redis::shards::Opened], results: &[Result<Vec<Said>>]) {
    let said: Vec<&Vec<Said>> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let Some(first) = said.first() else {
        return;
    };
    let found_somewhere: Vec<bool> = (0..first.len())
        .map(|i| said.iter().any(|s| s.get(i).is_some_and(|s| s.found)))
        .collect();
    for (shard, result) in shards.iter().zip(results) {
        let (Ok(redis), Ok(lines)) = (&shard.redis, result) else {
            continue;
        };
        // Every shard says the same jids in the same order.
        let done: Vec<&str> = lines
            .iter()
            .zip(&found_somewhere)
            .filter(|(said, found)| **found && !said.open)
            .map(|(said, _)| said.jid.as_str())
            .collect();
        if let Err(err) = control::close_requests(&mut redis.conn(), &done).await {
            eprintln!("{err:#}; fetches look cancel requests up until they expire (a day)");
        }
    }
}

/// One line per jid from each shard's lines: the first shard that found
/// the job says where it was (and is named); a job found nowhere is said
/// to be, naming the shards that could not be searched. Without shards,
/// the one shard's answer.
fn merge(names: &[String], mut results: Vec<Result<Vec<(String, bool)>>>) -> Result<Vec<(String, bool)>> {
    if results.len() == 1 {
        return results.pop().unwrap_or_else(|| Ok(Vec::new()));
    }
    let mut down = Vec::new();
    let mut lines: Option<Vec<(String, bool)>> = None;
    for (name, result) in names.iter().zip(results) {
        let shard_lines = match result {
            Ok(shard_lines) => shard_lines,
            Err(err) => {
                eprintln!("shard {name} could not be searched: {err:#}");
                down.push(name.as_str());
                continue;
            }
        };
        let merged = lines.get_or_insert_with(|| vec![(String::new(), false); shard_lines.len()]);
        for ((line, found), (merged_line, merged_found)) in shard_lines.into_iter().zip(merged.iter_mut()) {
            if found && !*merged_found {
                *merged_line = format!("{line} (shard {name})");
                *merged_found = true;
            } else if !*merged_found && merged_line.is_empty() {
                *merged_line = line;
            }
        }
    }
    let Some(mut lines) = lines else {
        anyhow::bail!("no shard could be searched ({})", down.join(", "));
    };
    if !down.is_empty() {
        for (line, found) in &mut lines {
            if !*found {
                line.push_str(&format!(" (not searched: shard {} is down)", down.join(", ")));
            }
        }
    }
    Ok(lines)
}

/// Cancels `jids` with `request`, waiting up to `wait` for the running
/// ones; what is said of each jid (in the order given, each once).
async fn cancel(
    conn: &mut redis::aio::ConnectionManager,
    store: Option<&crate::pg::Pg>,
    jids: &[String],
    request: &CancelRequest,
    wait: Duration,
) -> Result<Vec<Said>> {
    let sent = Instant::now();
    let control::Looked { mut found, read_all } = control::cancel_looking(conn, jids, request).await?;
    if let Some(pg) = store {
        take_from_store(pg, &mut found, request).await?;
    }
    let looked = Instant::now();
    // The running jobs, and those found nowhere: a job taken in basic
    // mode shows in Redis only with the next heartbeat, so its process
    // gets a moment to record it.
    let deadlines = found
        .iter()
        .filter_map(|(jid, found)| match found {
            Found::Running(_) => Some((jid.as_str(), looked + wait)),
            Found::Unknown => Some((jid.as_str(), looked + UNKNOWN_GRACE)),
            _ => None,
        })
        .collect();
    let mut confirmed = confirm(conn, request, deadlines, sent).await?;
    // Found nowhere: perhaps cancelled before (a second `cancel`).
    let unknown: Vec<&str> = found
        .iter()
        .filter(|(jid, found)| matches!(found, Found::Unknown) && !confirmed.contains_key(jid))
        .map(|(jid, _)| jid.as_str())
        .collect();
    let mut earlier = control::already_cancelled(conn, &unknown).await?;
    if let Some(pg) = store {
        let left: Vec<&str> = unknown
            .iter()
            .copied()
            .filter(|jid| !earlier.contains_key(*jid))
            .collect();
        earlier.extend(crate::pg::cancel::already(pg, &left).await?);
    }
    Ok(found
        .into_iter()
        .map(|(jid, found)| match earlier.remove(&jid) {
            Some((at, from)) if matches!(found, Found::Unknown) => Said {
                line: already(&jid, at, &from),
                jid,
                found: true,
                open: !read_all,
            },
            _ => {
                let stopped = confirmed.remove(&jid);
                let open = !read_all || (matches!(found, Found::Running(_)) && stopped.is_none());
                let (line, found) = line(&jid, found, stopped, wait);
                Said { jid, line, found, open }
            }
        })
        .collect())
}

/// Takes the jobs found nowhere in Redis out of the PostgreSQL store,
/// where they wait unclaimed (the requests are already sent, so a job
/// claimed meanwhile is stopped by its process).
async fn take_from_store(pg: &crate::pg::Pg, found: &mut [(String, Found)], request: &CancelRequest) -> Result<()> {
    use crate::pg::cancel::Place;
    let unknown: Vec<&str> = found
        .iter()
        .filter(|(_, found)| matches!(found, Found::Unknown))
        .map(|(jid, _)| jid.as_str())
        .collect();
    let mut taken: HashMap<String, Place> = crate::pg::cancel::take(pg, &unknown, &request.by, request.at)
        .await?
        .into_iter()
        .collect();
    for (jid, place) in found.iter_mut() {
        if let Some(was) = taken.remove(jid.as_str()) {
            *place = match was {
                Place::Queue(queue) => Found::Queue(queue),
                Place::Scheduled => Found::Scheduled,
                Place::Retry => Found::Retry,
            };
        }
    }
    Ok(())
}

/// What is printed for `jid`, cancelled before this request, at `at`
/// (epoch seconds) where `from` says.
fn already(jid: &str, at: Option<f64>, from: &str) -> String {
    let when = at
        .and_then(|at| Duration::try_from_secs_f64(at).ok())
        .and_then(|d| std::time::UNIX_EPOCH.checked_add(d))
        .map(|t| format!(" at {}", humantime::format_rfc3339_seconds(t)))
        .unwrap_or_default();
    format!("{jid}: already cancelled{when} ({from}); nothing more to do")
}

/// What is printed for `jid`, found at `found` and confirmed stopped by a
/// process (where, how long after the requests were sent) or not; and
/// whether it was found.
fn line(jid: &str, found: Found, stopped: Option<(String, Duration)>, wait: Duration) -> (String, bool) {
    let text = match (found, stopped) {
        (Found::Queue(queue), _) => format!("{jid}: cancelled; taken out of queue {queue} before it ran"),
        (Found::Scheduled, _) => format!("{jid}: cancelled; taken out of the schedule before it ran"),
        (Found::Retry, _) => format!("{jid}: cancelled; taken out of the retry set before it ran again"),
        (Found::Running(_), Some((from, after))) => format!(
            "{jid}: cancelled; stopped while running ({from}, confirmed after {} ms)",
            after.as_millis()
        ),
        (Found::Running(processes), None) => format!(
            "{jid}: cancel sent to {} running it, not confirmed within {:.1} s (it stops as soon as that process hears it)",
            processes.join(", "),
            wait.as_secs_f64()
        ),
        (Found::Unknown, Some(_)) => format!("{jid}: cancelled; stopped while running"),
        (Found::Unknown, None) => {
            return (
                format!(
                    "{jid}: no such job is queued, scheduled, retrying or running (it may have finished); the cancel is kept for 24 h in case it arrives"
                ),
                false,
            );
        }
    };
    (text, true)
}

/// Waits until each jid of `deadlines` is recorded as cancelled by
/// `request` (or a later cancel), or its deadline passes. Returns where
/// each confirmed job was stopped and how long after `sent` that was seen.
/// The cancelled set is read again only when its counter moved.
async fn confirm(
    conn: &mut redis::aio::ConnectionManager,
    request: &CancelRequest,
    mut deadlines: HashMap<&str, Instant>,
    sent: Instant,
) -> Result<HashMap<String, (String, Duration)>> {
    let mut confirmed = HashMap::new();
    let mut counted = None;
    while !deadlines.is_empty() {
        // The counter first: a record made after it was read moves it
        // again, so none is missed.
        let count = control::cancelled_count(conn).await?;
        if count.is_none() || count != counted {
            counted = count;
            for (jid, from) in control::recorded_since(conn, request).await? {
                if deadlines.remove(jid.as_str()).is_some() {
                    confirmed.insert(jid, (from, sent.elapsed()));
                }
            }
        }
        let now = Instant::now();
        deadlines.retain(|_, deadline| *deadline > now);
        if !deadlines.is_empty() {
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
    Ok(confirmed)
}
