//! The work protocol's Redis side, as the runner speaks it: the runner's
//! own fetch script (`wasmjobs::runner::FETCH_SCRIPT`) and the batched ack
//! transaction of
//! `runtime/src/runner/source/record.rs` for jobs that succeeded or failed
//! without a retry, with the counters summed between writes and written
//! with the first batch [`STATS_LAG`] after the last, and at the end (the
//! runner's `runner/owed.rs`).

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

/// The runner's own fetch script: moves up to ARGV[1] jobs from KEYS[3..]
/// (in order) to KEYS[1] (reliable), or pops them (basic, ARGV[2] == "0").
pub const FETCH: &str = wasmjobs::runner::FETCH_SCRIPT;

/// A job that ended: its raw payload (as fetched) and whether it succeeded.
pub struct Done {
    /// The payload, byte for byte as it sits in the in-progress list.
    pub raw: Vec<u8>,
    /// Succeeded (counted as processed) or failed (processed and failed).
    pub ok: bool,
}

/// Takes up to `max` jobs from `queue:default`, into `held_in` (reliable)
/// or popped (basic).
pub async fn fetch(
    conn: &mut ConnectionManager,
    script: &redis::Script,
    held_in: Option<&str>,
    max: usize,
) -> Result<Vec<Vec<u8>>> {
    let reply: Vec<redis::Value> = script
        .key(held_in.unwrap_or("wasmjobs:unused"))
        .key(CANCELS_OPEN)
        .key(QUEUE)
        .arg(max.min(MAX_FETCH))
        .arg(if held_in.is_some() { "1" } else { "0" })
        // As the runner fetches by default (no `--sidekiq-cancels`).
        .arg("0")
        .invoke_async(conn)
        .await
        .context("fetching jobs")?;
    // [runs, marks, job, …]: one queue, so keep the jobs (the script
    // looks the cancel requests up when the runner's would).
    reply
        .into_iter()
        .skip(2)
        .map(|job| match job {
            redis::Value::BulkString(raw) => Ok(raw),
            other => anyhow::bail!("the fetch script returned a job that is not text: {other:?}"),
        })
        .collect()
}

/// Writes the outcomes `rx` hands over, in batches, until every sender is
/// gone. Returns how many jobs were processed and how many of them failed.
pub async fn write_acks(
    mut conn: ConnectionManager,
    held_in: Option<String>,
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
        let pipe = ack(&batch, held_in.as_deref(), &date, counts);
        if !pipe.is_empty() {
            pipe.query_async::<()>(&mut conn)
                .await
                .context("writing job outcomes")?;
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

/// The transaction recording `batch`: each job leaves the in-progress list
/// `held_in` (reliable), and the counters and their daily twins move by
/// `counts` (processed, failed).
pub fn ack(batch: &[Done], held_in: Option<&str>, date: &str, counts: (u64, u64)) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    if let Some(list) = held_in {
        for done in batch {
            pipe.cmd("LREM").arg(list).arg(-1).arg(&done.raw).ignore();
        }
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
    pipe
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
            },
            Done {
                raw: b"{\"jid\":\"b\"}".to_vec(),
                ok: false,
            },
        ];
        let packed = commands(&ack(&batch, Some("wasmjobs:inprogress:native-1"), "2026-12-01", (2, 1)));
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
        }];
        let packed = commands(&ack(&batch, None, "2026-12-01", (1, 0)));
        assert!(!packed.contains("LREM"));
        assert!(!packed.contains("stat:failed"));
        assert!(packed.contains("stat:processed:2026-12-01"));
    }

    #[test]
    fn counters_not_due_leave_a_basic_ack_empty() {
        let batch = [Done {
            raw: b"{}".to_vec(),
            ok: true,
        }];
        assert!(ack(&batch, None, "2026-12-01", (0, 0)).is_empty());
        let reliable = commands(&ack(&batch, Some("l"), "2026-12-01", (0, 0)));
        assert_eq!(reliable.matches("LREM").count(), 1);
        assert!(!reliable.contains("stat:"), "{reliable}");
    }

    #[test]
    fn dates_are_utc_days() {
        assert_eq!(utc_date(0.0), "1970-01-01");
        assert_eq!(utc_date(1_796_083_200.0), "2026-12-01");
    }
}
