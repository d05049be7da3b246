//! The work protocol's Redis side, as the runner speaks it: the runner's
//! own fetch script (`wasmjobs::runner::FETCH_SCRIPT`) into a free batch
//! list ([`Lists`], the runner's `runtime/src/runner/source/batches.rs`)
//! with the list read in the same round trip, and the batched ack
//! transaction of
//! `runtime/src/runner/source/record.rs` for jobs that succeeded or failed
//! without a retry (a batch list whose last jobs it acks is deleted whole),
//! with the counters summed between writes and written
//! with the first batch [`STATS_LAG`] after the last, and at the end (the
//! runner's `runner/owed.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;

/// Most jobs one fetch takes (the runner's `source::MAX_BATCH`).
pub const MAX_FETCH: usize = 500;
/// Most outcomes one ack transaction writes (the runner's `outcome::MAX_BATCH`).
pub const MAX_ACK_BATCH: usize = 1_000;

const QUEUE: &str = "queue:default";
/// The open `wasmjobs cancel` requests (the runner's `keys::CANCELS_OPEN`).
const CANCELS_OPEN: &str = "wasmjobs:cancels:open";
const STAT_PROCESSED: &str = "stat:processed";
const STAT_FAILED: &str = "stat:failed";
/// Sidekiq's five-year expiry of the daily stat keys.
const STATS_TTL_SECS: i64 = 5 * 365 * 24 * 3600;
/// Least time between two writes of the counters (the runner's
/// `owed::STATS_LAG`).
const STATS_LAG: Duration = Duration::from_millis(10);

/// The runner's own fetch script: moves up to ARGV[1] jobs from KEYS[4..]
/// (in order) to the batch list KEYS[3] (reliable, ARGV[4] == "1") or the
/// in-progress list KEYS[1] (reliable), or pops them (basic, ARGV[2] == "0").
pub const FETCH: &str = wasmjobs::runner::FETCH_SCRIPT;

/// How many batch lists a process has (the runner's `keys::BATCH_LISTS`).
const BATCH_LISTS: usize = 32;

/// A reliable worker's lists: its in-progress list, and its batch lists
/// with which are free.
pub struct Lists {
    pub list: String,
    batches: Vec<String>,
    free: Mutex<Vec<bool>>,
}

/// A batch list holding jobs: its key, its slot, and how many of its jobs
/// are not acked yet.
pub struct Batch {
    key: String,
    slot: usize,
    left: AtomicUsize,
}

impl Lists {
    pub fn new(list: String) -> Self {
        Self {
            batches: (0..BATCH_LISTS).map(|slot| format!("{list}:b{slot}")).collect(),
            list,
            free: Mutex::new(vec![true; BATCH_LISTS]),
        }
    }

    fn claim(&self) -> Option<usize> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = free.iter().position(|&f| f)?;
        free[slot] = false;
        Some(slot)
    }

    fn release(&self, slot: usize) {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)[slot] = true;
    }

    /// `jobs` jobs of `batch` were acked: its slot is free once all were.
    fn leave(&self, batch: &Batch, jobs: usize) {
        if batch.left.fetch_sub(jobs, Ordering::AcqRel) == jobs {
            self.release(batch.slot);
        }
    }
}

/// A job that ended: its raw payload (as fetched), whether it succeeded,
/// and the batch list holding it.
pub struct Done {
    /// The payload, byte for byte as it sits in its list.
    pub raw: Vec<u8>,
    /// Succeeded (counted as processed) or failed (processed and failed).
    pub ok: bool,
    /// Its batch list (else it is in the in-progress list, or popped).
    pub held: Option<Arc<Batch>>,
}

/// Loads the fetch script (a pipelined call cannot load it on demand).
pub async fn load(conn: &mut ConnectionManager, script: &redis::Script) -> Result<()> {
    let _: String = script
        .prepare_invoke()
        .load_async(conn)
        .await
        .context("loading the fetch script")?;
    Ok(())
}

/// Takes up to `max` jobs from `queue:default`, into a free batch list of
/// `lists` (reliable; the in-progress list when none is free) or popped
/// (basic). Returns each job with the batch list holding it.
pub async fn fetch(
    conn: &mut ConnectionManager,
    script: &redis::Script,
    lists: Option<&Lists>,
    max: usize,
) -> Result<Vec<(Vec<u8>, Option<Arc<Batch>>)>> {
    let slot = lists.and_then(Lists::claim);
    let batch_key = lists.zip(slot).map(|(lists, slot)| lists.batches[slot].as_str());
    let mut invocation = script.prepare_invoke();
    invocation
        .key(lists.map_or("wasmjobs:unused", |l| l.list.as_str()))
        .key(CANCELS_OPEN)
        .key(batch_key.unwrap_or("wasmjobs:unused"))
        .key(QUEUE)
        .arg(max.min(MAX_FETCH))
        .arg(if lists.is_some() { "1" } else { "0" })
        // As the runner fetches by default (no `--sidekiq-cancels`).
        .arg("0")
        .arg(if batch_key.is_some() { "1" } else { "0" });
    let mut pipe = redis::pipe();
    pipe.invoke_script(&invocation);
    pipe.cmd("LRANGE")
        .arg(batch_key.unwrap_or("wasmjobs:unused"))
        .arg(0)
        .arg(-1);
    let (reply, listed): (Vec<redis::Value>, Vec<Vec<u8>>) = pipe.query_async(conn).await.context("fetching jobs")?;
    // [[0, n], -1]: the jobs are in the batch list, read behind the script;
    // [runs, marks, job, …]: one queue, so keep the jobs (the script
    // looks the cancel requests up when the runner's would).
    if reply.get(1) == Some(&redis::Value::Int(-1)) {
        let (Some(lists), Some(slot)) = (lists, slot) else {
            anyhow::bail!("the fetch script used a batch list it was not given");
        };
        if listed.is_empty() {
            lists.release(slot);
            return Ok(Vec::new());
        }
        let batch = Arc::new(Batch {
            key: lists.batches[slot].clone(),
            slot,
            left: AtomicUsize::new(listed.len()),
        });
        return Ok(listed.into_iter().map(|raw| (raw, Some(batch.clone()))).collect());
    }
    if let (Some(lists), Some(slot)) = (lists, slot) {
        lists.release(slot);
    }
    reply
        .into_iter()
        .skip(2)
        .map(|job| match job {
            redis::Value::BulkString(raw) => Ok((raw, None)),
            other => anyhow::bail!("the fetch script returned a job that is not text: {other:?}"),
        })
        .collect()
}

/// Writes the outcomes `rx` hands over, in batches, until every sender is
/// gone. Returns how many jobs were processed and how many of them failed.
pub async fn write_acks(
    mut conn: ConnectionManager,
    lists: Option<Arc<Lists>>,
    mut rx: mpsc::Receiver<Done>,
) -> Result<(u64, u64)> {
    let (mut processed, mut failed) = (0u64, 0u64);
    let mut owed = (0u64, 0u64);
    let mut paid_at = Instant::now();
    let mut batch = Vec::with_capacity(MAX_ACK_BATCH);
    loop {
        let ended = rx.recv_many(&mut batch, MAX_ACK_BATCH).await == 0;
        let failures = batch.iter().filter(|done| !done.ok).count() as u64;
        owed = (owed.0 + batch.len() as u64, owed.1 + failures);
        let due = ended || paid_at.elapsed() >= STATS_LAG;
        let counts = if due { owed } else { (0, 0) };
        let date = utc_date(wasmjobs::redis::now_f64());
        let (pipe, leaving) = ack(&batch, lists.as_deref().map(|l| l.list.as_str()), &date, counts);
        if !pipe.is_empty() {
            pipe.query_async::<()>(&mut conn)
                .await
                .context("writing job outcomes")?;
        }
        if let Some(lists) = &lists {
            for (held, jobs) in leaving {
                lists.leave(&held, jobs);
            }
        }
        if due {
            owed = (0, 0);
            paid_at = Instant::now();
        }
        processed += batch.len() as u64;
        failed += failures;
        batch.clear();
        if ended {
            return Ok((processed, failed));
        }
    }
}

/// The transaction recording `batch`: each job leaves its batch list or
/// the in-progress list `held_in` (reliable) — a batch list whose every
/// remaining job is in `batch` is deleted instead —, and the counters and
/// their daily twins move by `counts` (processed, failed). Also returns
/// how many jobs leave each batch list.
pub fn ack(
    batch: &[Done],
    held_in: Option<&str>,
    date: &str,
    counts: (u64, u64),
) -> (redis::Pipeline, Vec<(Arc<Batch>, usize)>) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut leaving: Vec<(Arc<Batch>, usize)> = Vec::new();
    for held in batch.iter().filter_map(|done| done.held.as_ref()) {
        match leaving.iter_mut().find(|(b, _)| Arc::ptr_eq(b, held)) {
            Some((_, jobs)) => *jobs += 1,
            None => leaving.push((held.clone(), 1)),
        }
    }
    let emptied = |held: &Arc<Batch>| {
        leaving
            .iter()
            .any(|(b, jobs)| Arc::ptr_eq(b, held) && b.left.load(Ordering::Acquire) == *jobs)
    };
    for done in batch {
        match &done.held {
            Some(held) if emptied(held) => {}
            Some(held) => {
                pipe.cmd("LREM").arg(&held.key).arg(-1).arg(&done.raw).ignore();
            }
            None => {
                if let Some(list) = held_in {
                    pipe.cmd("LREM").arg(list).arg(-1).arg(&done.raw).ignore();
                }
            }
        }
    }
    for (held, _) in leaving.iter().filter(|(held, _)| emptied(held)) {
        pipe.cmd("DEL").arg(&held.key).ignore();
    }
    for (stat, by) in [(STAT_PROCESSED, counts.0), (STAT_FAILED, counts.1)] {
        if by == 0 {
            continue;
        }
        let daily = format!("{stat}:{date}");
        pipe.cmd("INCRBY").arg(stat).arg(by).ignore();
        pipe.cmd("INCRBY").arg(&daily).arg(by).ignore();
        pipe.cmd("EXPIRE").arg(&daily).arg(STATS_TTL_SECS).ignore();
    }
    (pipe, leaving)
}

/// `YYYY-MM-DD` in UTC (the daily stat keys' suffix).
fn utc_date(epoch_secs: f64) -> String {
    let (year, month, day) = wasmjobs::time::civil_from_days((epoch_secs / 86_400.0).floor() as i64);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(pipe: &redis::Pipeline) -> String {
        String::from_utf8_lossy(&pipe.get_packed_pipeline()).into_owned()
    }

    #[test]
    fn a_reliable_ack_removes_each_job_and_counts_the_batch() {
        let batch = [
            Done {
                raw: b"{\"jid\":\"a\"}".to_vec(),
                ok: true,
                held: None,
            },
            Done {
                raw: b"{\"jid\":\"b\"}".to_vec(),
                ok: false,
                held: None,
            },
        ];
        let packed = commands(&ack(&batch, Some("wasmjobs:inprogress:native-1"), "2026-12-01", (2, 1)).0);
        assert!(packed.starts_with("*1\r\n$5\r\nMULTI\r\n"), "{packed}");
        assert_eq!(packed.matches("LREM").count(), 2);
        assert!(packed.contains("{\"jid\":\"b\"}"));
        for key in [
            "stat:processed",
            "stat:processed:2026-12-01",
            "stat:failed",
            "stat:failed:2026-12-01",
        ] {
            assert!(
                packed.contains(&format!("${}\r\n{key}\r\n", key.len())),
                "{key}: {packed}"
            );
        }
        assert!(packed.contains("$1\r\n2\r\n"), "processed by 2: {packed}");
        assert!(packed.trim_end().ends_with("EXEC"), "{packed}");
    }

    #[test]
    fn a_basic_ack_touches_no_list_and_no_failure_counter_when_all_succeeded() {
        let batch = [Done {
            raw: b"{}".to_vec(),
            ok: true,
            held: None,
        }];
        let packed = commands(&ack(&batch, None, "2026-12-01", (1, 0)).0);
        assert!(!packed.contains("LREM"));
        assert!(!packed.contains("stat:failed"));
        assert!(packed.contains("stat:processed:2026-12-01"));
    }

    #[test]
    fn counters_not_due_leave_a_basic_ack_empty() {
        let batch = [Done {
            raw: b"{}".to_vec(),
            ok: true,
            held: None,
        }];
        assert!(ack(&batch, None, "2026-12-01", (0, 0)).0.is_empty());
        let reliable = commands(&ack(&batch, Some("l"), "2026-12-01", (0, 0)).0);
        assert_eq!(reliable.matches("LREM").count(), 1);
        assert!(!reliable.contains("stat:"), "{reliable}");
    }

    /// Jobs of a batch list are removed one by one until an ack holds all
    /// that are left: then the list is deleted whole.
    #[test]
    fn the_ack_of_a_batch_lists_last_jobs_deletes_it() {
        let held = Arc::new(Batch {
            key: "l:b0".into(),
            slot: 0,
            left: AtomicUsize::new(3),
        });
        let done = |jid: &str| Done {
            raw: format!("{{\"jid\":\"{jid}\"}}").into_bytes(),
            ok: true,
            held: Some(held.clone()),
        };
        let (first, leaving) = ack(&[done("a")], Some("l"), "2026-12-01", (0, 0));
        let first = commands(&first);
        assert_eq!(
            (first.matches("LREM").count(), first.matches("DEL").count()),
            (1, 0),
            "{first}"
        );
        assert!(first.contains("l:b0"), "{first}");
        assert_eq!(leaving.len(), 1);
        held.left.fetch_sub(1, Ordering::AcqRel);
        let (last, leaving) = ack(&[done("b"), done("c")], Some("l"), "2026-12-01", (0, 0));
        let last = commands(&last);
        assert_eq!(
            (last.matches("LREM").count(), last.matches("DEL").count()),
            (0, 1),
            "{last}"
        );
        assert_eq!(leaving[0].1, 2);
    }

    #[test]
    fn dates_are_utc_days() {
        assert_eq!(utc_date(0.0), "1970-01-01");
        assert_eq!(utc_date(1_796_083_200.0), "2026-12-01");
    }
}
