//! `wasmjobs cancel JID...`: stop jobs wherever they are.
//!
//! A job waiting in its queue, in `schedule` or in `retry` is taken out
//! and recorded as cancelled; a job running in any process is stopped by
//! that process within about 100 ms (it hears the cancel on the control
//! channel) and recorded there. The command waits (up to `--wait`) for a
//! running job's process to confirm, and says where each job was. A jid
//! found nowhere is reported (exit status 1); its request stays in Redis
//! for a day, so a job with that jid pushed or fetched meanwhile is still
//! cancelled. `crate::redis::control` has the Redis side.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::redis::control::{self, Found};
use crate::redis::payload::Payload;

/// Arguments of `wasmjobs cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Who is cancelling, recorded with each job (default: user@host).
    #[arg(long)]
    pub by: Option<String>,
    /// How long to wait for a running job's process to confirm it stopped.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub wait: f64,
    /// The jobs' ids.
    #[arg(required = true, value_name = "JID")]
    pub jids: Vec<String>,
}

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
    let redis = crate::redis::connect(&args.redis.target(&cli.data_dir)).await?;
    let mut conn = redis.conn();
    let mut unknown = 0;
    let result = async {
        for jid in &args.jids {
            let found = control::cancel(&mut conn, jid, &by).await?;
            let line = match found {
                Found::Queue(queue) => format!("{jid}: cancelled; taken out of queue {queue} before it ran"),
                Found::Scheduled => format!("{jid}: cancelled; taken out of the schedule before it ran"),
                Found::Retry => format!("{jid}: cancelled; taken out of the retry set before it ran again"),
                Found::Running(processes) => {
                    let started = Instant::now();
                    let confirmed = confirm(&mut conn, jid, Duration::from_secs_f64(args.wait.max(0.0))).await?;
                    match confirmed {
                        Some(from) => format!(
                            "{jid}: cancelled; stopped while running ({from}, confirmed after {} ms)",
                            started.elapsed().as_millis()
                        ),
                        None => format!(
                            "{jid}: cancel sent to {} running it, not confirmed within {:.1} s (it stops as soon as that process hears it)",
                            processes.join(", "),
                            args.wait
                        ),
                    }
                }
                // A job taken in basic mode shows in Redis only with the
                // next heartbeat: give its process a moment to record it.
                Found::Unknown if confirm(&mut conn, jid, UNKNOWN_GRACE).await?.is_some() => {
                    format!("{jid}: cancelled; stopped while running")
                }
                Found::Unknown => {
                    unknown += 1;
                    format!(
                        "{jid}: no such job is queued, scheduled, retrying or running (it may have finished); the cancel is kept for 24 h in case it arrives"
                    )
                }
            };
            println!("{line}");
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    redis.close().await?;
    result?;
    Ok(if unknown > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// How long a jid found nowhere is given to show up as cancelled.
const UNKNOWN_GRACE: Duration = Duration::from_millis(500);

/// Waits up to `wait` for `jid` to be recorded as cancelled; where.
async fn confirm(conn: &mut redis::aio::ConnectionManager, jid: &str, wait: Duration) -> Result<Option<String>> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(from) = recorded(conn, jid).await? {
            return Ok(Some(from));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where the cancelled set says `jid` was stopped, if it is among the
/// newest entries.
async fn recorded(conn: &mut redis::aio::ConnectionManager, jid: &str) -> Result<Option<String>> {
    let newest = control::cancelled(conn, 100)
        .await
        .context("cannot read the cancelled set")?;
    Ok(newest
        .iter()
        .filter_map(|raw| Payload::parse(raw).ok())
        .find(|payload| payload.jid() == jid)
        .map(|payload| payload.str("cancelled_from").unwrap_or("recorded").to_owned()))
}
