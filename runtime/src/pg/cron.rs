//! Cron ticks on the PostgreSQL store: a tick is claimed by inserting
//! `(schedule, tick)` into `wasmjobs.cron_ticks` in the transaction that
//! enqueues its job (migration 2), so exactly one runner enqueues each
//! tick and the job exists if and only if the claim does. The schedules
//! themselves stay registered in Redis, in sidekiq-cron's format
//! (`crate::redis::cron`), where `wasmjobs schedule` and the Web UI read
//! them.

use anyhow::{Context, Result};

use super::Pg;
use wasmjobs_client::Payload;

/// Claims stay this long (a tick older than that cannot come round again).
const REMEMBER_SECS: i64 = 24 * 3600;

/// Claims `tick` of `schedule` and enqueues `payload` with it. With
/// `catch_up`, a tick at or before the schedule's last claimed one is not
/// claimed (a process catching up after a pause must not enqueue a tick
/// older than one already run). Returns the job's jid, or `None` if the
/// tick was claimed elsewhere.
pub async fn claim(pg: &Pg, schedule: &str, tick: i64, payload: Payload, catch_up: bool) -> Result<Option<String>> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await.context("claiming a cron tick")?;
    if catch_up {
        let last: Option<i64> = tx
            .query_one(
                "SELECT max(tick) FROM wasmjobs.cron_ticks WHERE schedule = $1",
                &[&schedule],
            )
            .await
            .context("reading the last claimed tick")?
            .get(0);
        if last.is_some_and(|last| last >= tick) {
            return Ok(None);
        }
    }
    let claimed = tx
        .execute(
            "INSERT INTO wasmjobs.cron_ticks (schedule, tick) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&schedule, &tick],
        )
        .await
        .context("claiming a cron tick")?;
    if claimed == 0 {
        return Ok(None);
    }
    let jid = wasmjobs_client::pg::push_payload(&*tx, payload, None, None).await?;
    tx.execute(
        "DELETE FROM wasmjobs.cron_ticks WHERE schedule = $1 AND tick < $2",
        &[&schedule, &(tick - REMEMBER_SECS)],
    )
    .await
    .context("trimming old cron ticks")?;
    tx.commit().await.context("committing a cron tick")?;
    Ok(jid)
}
