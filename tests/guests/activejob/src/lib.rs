//! ActiveJob test jobs, for the host's end-to-end tests: `ReportJob`
//! appends one JSON line per job to `/data/seen.jsonl` with what the job
//! sees (its jid, class, args, retry count, ActiveJob context and raw
//! hash); `FailingJob` always asks for a retry. A `ReportJob` whose third
//! argument is a number sleeps that many milliseconds first.

use std::fs::OpenOptions;
use std::io::Write;

use wasmjobs_guest::serde_json::{self, Value, json};
use wasmjobs_guest::{Job, JobError, JobInfo, activejob, export_job};

/// Serves both classes.
pub struct ActiveJobReport;

impl Job for ActiveJobReport {
    type Args = Value;

    fn perform(job: &JobInfo, args: Value) -> Result<(), JobError> {
        if job.class == "FailingJob" {
            return Err(JobError::retry("FailingJob fails on purpose"));
        }
        if let Some(ms) = args.get(2).and_then(Value::as_u64) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let context = activejob::context().map(|c| {
            json!({
                "job_id": c.job_id, "job_class": c.job_class, "executions": c.executions,
                "priority": c.priority, "locale": c.locale, "timezone": c.timezone,
                "enqueued_at": c.enqueued_at, "scheduled_at": c.scheduled_at,
            })
        });
        let raw = activejob::raw().map(|raw| serde_json::from_str::<Value>(&raw).unwrap_or(Value::String(raw)));
        let line = json!({
            "jid": job.jid, "class": job.class, "args": args, "retry_count": job.retry_count,
            "enqueued_at_ms": job.enqueued_at_ms, "context": context, "raw": raw,
        });
        let mut file = OpenOptions::new().append(true).create(true).open("/data/seen.jsonl")?;
        file.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }
}

export_job!(ActiveJobReport);
