//! Trust tests: logs. A guest (or whoever can write to Redis) must not be
//! able to flood the runner's log, forge log lines, or recolour the
//! operator's terminal.
//!
//! - every job has a budget of log bytes and lines (default 1 MiB / 10,000
//!   lines, `limits.log` in the manifest), shared by the `log` import and
//!   the guest's stdout and stderr; past it lines are dropped and one line
//!   says how many;
//! - control characters in guest messages and in Redis-controlled strings
//!   (job classes, error messages) are escaped in text logs;
//! - the failed job's log line carries its error cut as `error_message` is.

use std::time::Duration;

use serde_json::json;
use wasmjobs::host::log::LogLine;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, plugins, push, wait_processed};
use wasmjobs_e2e::{catalog, copy_plugin, executor, run, test_guests_dir};

/// The documented default budget of log lines per job.
const DEFAULT_LINES: usize = 10_000;

fn dropped_lines(logs: &[LogLine]) -> Vec<&LogLine> {
    logs.iter()
        .filter(|l| l.message.contains("past the job's log budget"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_past_the_default_budget_are_dropped_and_counted() {
    let dir = plugins(&[], &["chaos"]);
    let executor = executor(1);
    let catalog = catalog(dir.path(), &executor);

    // Through the `log` import, one call per line.
    let execution = run(&executor, &catalog, "ChaosJob", r#"["log-lines", 20000, "flood"]"#).await;
    assert!(execution.outcome.is_success(), "{}", execution.outcome);
    let kept = execution.logs.iter().filter(|l| l.message == "flood").count();
    assert_eq!(kept, DEFAULT_LINES, "lines kept within the budget");
    let dropped = dropped_lines(&execution.logs);
    assert_eq!(dropped.len(), 1, "one line reports the drops: {dropped:?}");
    assert!(
        dropped[0].message.contains("dropped 10000 log lines (50000 bytes)"),
        "{}",
        dropped[0].message
    );
    assert_eq!(execution.logs.len(), DEFAULT_LINES + 1);

    // Through stdout: one write holding 20,000 lines.
    let text = vec!["out"; 20_000].join("\n");
    let args = serde_json::to_string(&json!(["stdout", text])).expect("json");
    let execution = run(&executor, &catalog, "ChaosJob", &args).await;
    assert!(execution.outcome.is_success(), "{}", execution.outcome);
    assert_eq!(
        execution.logs.iter().filter(|l| l.message == "out").count(),
        DEFAULT_LINES
    );
    assert_eq!(dropped_lines(&execution.logs).len(), 1, "{:?}", execution.logs.last());
    assert_eq!(execution.logs.len(), DEFAULT_LINES + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_sets_the_log_budget_in_bytes_and_lines() {
    let temp = tempfile::tempdir().expect("tempdir");
    let plugin = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    wasmjobs_e2e::append_to_manifest(&plugin, "[limits]\nlog = { bytes = \"1KiB\", lines = 100 }");
    let executor = executor(1);
    let catalog = catalog(temp.path(), &executor);

    // The line budget binds first: 100 lines of 5 bytes.
    let execution = run(&executor, &catalog, "ChaosJob", r#"["log-lines", 1000, "flood"]"#).await;
    assert_eq!(execution.logs.iter().filter(|l| l.message == "flood").count(), 100);
    let dropped = dropped_lines(&execution.logs);
    assert_eq!(dropped.len(), 1, "{:?}", execution.logs.last());
    assert!(
        dropped[0].message.contains("dropped 900 log lines"),
        "{}",
        dropped[0].message
    );

    // The byte budget binds first: 1 KiB holds ten 100-byte lines.
    let line = "b".repeat(100);
    let args = serde_json::to_string(&json!(["log-lines", 50, line])).expect("json");
    let execution = run(&executor, &catalog, "ChaosJob", &args).await;
    assert_eq!(execution.logs.iter().filter(|l| l.message == line).count(), 10);
    assert_eq!(dropped_lines(&execution.logs).len(), 1, "{:?}", execution.logs.last());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_cannot_forge_text_log_lines() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--poll-interval", "0.05"]);
    runner.wait_running();

    // A guest message, a guest error, and a job class from Redis, each with
    // a newline, a carriage return and an ANSI colour sequence.
    let forged = "FORGED 2026-01-01T00:00:00Z ERROR wasmjobs: pwned";
    let evil = format!("guest-marker\n{forged}\r\n{forged}\x1b[31mred");
    push(&mut conn, "ChaosJob", "default", vec![json!(["log", "info", evil])]).await;
    push(&mut conn, "ChaosJob", "default", vec![json!(["retry", evil])]).await;
    push(&mut conn, &format!("Nope\n{forged}\x1b[2J"), "default", vec![json!([])]).await;
    wait_processed(&mut conn, 3, Duration::from_secs(30), || runner.log()).await;
    runner.wait_for_log("no plugin serves this class", Duration::from_secs(10));
    runner.wait_for_log("job failed", Duration::from_secs(10));

    let log = runner.log();
    assert!(log.contains("guest-marker"), "{log}");
    for line in log.lines() {
        assert!(
            !line.starts_with("FORGED"),
            "a forged line made it into the log:\n{log}"
        );
        assert!(
            !line.contains('\r') && !line.contains('\x1b'),
            "raw control character in {line:?}"
        );
    }
    assert!(log.contains("guest-marker\\n"), "the newline is shown escaped:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_guest_error_is_cut_in_the_log_line() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--poll-interval", "0.05"]);
    runner.wait_running();

    push(&mut conn, "ChaosJob", "default", vec![json!(["big-error", 1_000_000])]).await;
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    runner.wait_for_log("job failed", Duration::from_secs(10));
    let log = runner.log();
    let line = log
        .lines()
        .find(|l| l.contains("job failed"))
        .expect("a job failed line");
    // `error_message` keeps 10,000 characters; the line adds its fields.
    assert!(line.len() < 12_000, "the failed job's log line is {} bytes", line.len());
    assert!(line.contains(&"e".repeat(10_000)), "the cut error is still shown");
    assert!(log.len() < 100_000, "the runner's log is {} bytes", log.len());
}
