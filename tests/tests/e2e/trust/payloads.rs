//! Huge payloads against one process: a job over `--max-payload` goes to
//! the dead set unrun with every byte kept, whether it is taken by the
//! batched fetch, by a blocking wait or from `schedule`, without the
//! runner's memory following its size; and a large job that is allowed
//! never makes the heartbeat large (its `work` entry is a bounded
//! preview), so the process stays in `processes`.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, plugins, wait_processed};

/// A job of `class` whose one argument is `quotes` double quotes: its JSON
/// text is twice that (each is escaped), and twice again if written
/// escaped inside another JSON string, as the heartbeat's `work` entry is.
fn quoted_job(class: &str, quotes: usize, extra_args: &[Value]) -> Payload {
    let mut args = vec![Value::String("\"".repeat(quotes))];
    args.extend_from_slice(extra_args);
    Payload::new(class, args, "default", wasmjobs::redis::now_f64())
}

/// `VmHWM` (peak RSS) of `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// The dead set's entries, as text.
async fn dead(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    conn.zrange("dead", 0, -1).await.expect("ZRANGE dead")
}

/// Waits until the dead set holds `n` entries.
async fn wait_dead(conn: &mut redis::aio::MultiplexedConnection, n: usize, runner: &Runner) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let count: usize = conn.zcard("dead").await.expect("ZCARD");
        if count >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{count} of {n} dead:\n{}", runner.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `entry` is `job` kept whole, with the payload-too-large error.
fn assert_kept_with_reason(entry: &str, job: &str) {
    assert!(
        entry.starts_with(&job[..job.len() - 1]),
        "the dead entry keeps the payload's bytes ({} of {} bytes)",
        entry.len(),
        job.len()
    );
    let parsed = Payload::parse(entry).expect("the dead entry is a job");
    assert_eq!(parsed.str("error_class"), Some("wasmjobs::PayloadTooLarge"));
    let message = parsed.str("error_message").unwrap_or_default();
    assert!(message.contains("--max-payload"), "{message}");
    assert!(message.contains(&job.len().to_string()), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_the_limit_go_to_dead_whole_without_the_runner_reading_them() {
    let redis = TestRedis::start();
    let mut conn = redis.patient_conn().await;
    let dir = plugins(&["noop"], &[]);
    // 48 MiB of quotes: a 96 MiB payload, six times the default limit.
    let quotes = 48 << 20;
    let big = quoted_job("NoopJob", quotes, &[]).to_json();

    // Taken by the batched fetch: queued before the runner starts.
    let _: () = conn.lpush("queue:default", &big).await.expect("LPUSH");
    let _: () = conn.sadd("queues", "default").await.expect("SADD");
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    wait_dead(&mut conn, 1, &runner).await;

    // Due in `schedule`, written as Sidekiq 8 writes times (milliseconds);
    // its last argument has a `created_at` of its own, in seconds.
    let mut scheduled = quoted_job(
        "NoopJob",
        quotes,
        &[json!("scheduled"), json!({"created_at": 1_700_000_000})],
    );
    let created_ms = (wasmjobs::redis::now_f64() * 1000.0) as u64;
    scheduled.set("created_at", json!(created_ms));
    let scheduled = scheduled.to_json();
    let _: () = conn.zadd("schedule", &scheduled, 0).await.expect("ZADD");
    wait_dead(&mut conn, 2, &runner).await;
    // Neither crossed the network: the runner never held one.
    let unread = peak_rss(runner.pid());

    // Taken by a blocking wait (pushed while the runner is idle): it does
    // arrive, once, and is buried without being sent back.
    let waited = quoted_job("NoopJob", quotes, &[json!("waited")]).to_json();
    let _: () = conn.lpush("queue:default", &waited).await.expect("LPUSH");
    wait_dead(&mut conn, 3, &runner).await;
    let read_once = peak_rss(runner.pid());

    // Good jobs around them run.
    let good = Payload::new("NoopJob", vec![json!(1)], "default", wasmjobs::redis::now_f64());
    let _: () = conn.lpush("queue:default", good.to_json()).await.expect("LPUSH");
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;

    let entries = dead(&mut conn).await;
    assert_eq!(entries.len(), 3);
    for job in [&big, &scheduled, &waited] {
        let jid = Payload::parse(job).expect("a job").jid().to_owned();
        let entry = entries
            .iter()
            .find(|e| Payload::parse(e).is_ok_and(|p| p.jid() == jid))
            .unwrap_or_else(|| panic!("no dead entry for {jid}"));
        assert_kept_with_reason(entry, job);
        // Each keeps its own style of time.
        let failed_at = Payload::parse(entry).expect("a job").get("failed_at").cloned();
        if job == &scheduled {
            let ms = failed_at.as_ref().and_then(Value::as_u64).unwrap_or(0);
            assert!(
                ms >= created_ms && ms < created_ms + 600_000,
                "failed_at {failed_at:?} in ms"
            );
        } else {
            assert!(
                failed_at.as_ref().is_some_and(Value::is_f64),
                "failed_at {failed_at:?} in seconds"
            );
        }
    }
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert_eq!(processes.len(), 1, "the runner is still registered");
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
    assert!(runner.log().contains("over --max-payload"), "{}", runner.log());
    assert!(runner.stop().success(), "{}", runner.log());
    let payload = big.len() as u64;
    let mib = |bytes: u64| bytes as f64 / 1048576.0;
    eprintln!(
        "payloads of {:.1} MiB: peak RSS {:.1} MiB after the fetched and the scheduled one, {:.1} MiB after the one taken by a blocking wait",
        mib(payload),
        mib(unread),
        mib(read_once)
    );
    assert!(
        unread < payload,
        "peak RSS {unread} bytes after payloads of {payload} bytes that should never have been read"
    );
    // Reading a reply of N bytes costs the Redis client ~2.7 N at its
    // peak (its read buffer grows by doubling, then the value is copied
    // out); nothing is sent back.
    assert!(
        read_once < 4 * payload,
        "peak RSS {read_once} bytes after reading one payload of {payload} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_job_in_flight_keeps_the_heartbeat_small() {
    let redis = TestRedis::start();
    let mut conn = redis.patient_conn().await;
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--max-payload", "64MiB"]);
    runner.wait_running();
    // 8 MiB of quotes (a 16 MiB payload), sleeping in the guest for 30 s:
    // ["\"\"…", ...] is not a chaos mode, so the job carries its mode
    // first and the quotes after.
    let quotes = "\"".repeat(8 << 20);
    let job = Payload::new(
        "ChaosJob",
        vec![json!("sleep"), json!(30_000), json!(quotes)],
        "default",
        wasmjobs::redis::now_f64(),
    );
    let jid = job.jid().to_owned();
    let _: () = conn.lpush("queue:default", job.to_json()).await.expect("LPUSH");
    let _: () = conn.sadd("queues", "default").await.expect("SADD");

    // Its `work` entry appears with the next beat (a beat comes at once
    // after start, then every 10 s).
    let identity: String = {
        let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
        processes.into_iter().next().expect("a process")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let entry = loop {
        let work: Vec<String> = conn.hvals(format!("{identity}:work")).await.expect("HVALS");
        if let Some(entry) = work.into_iter().next() {
            break entry;
        }
        assert!(Instant::now() < deadline, "no work entry:\n{}", runner.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(entry.len() < 4096, "the work entry is {} bytes", entry.len());
    let entry: Value = serde_json::from_str(&entry).expect("JSON");
    let payload: Value = serde_json::from_str(entry["payload"].as_str().expect("payload text")).expect("payload JSON");
    assert_eq!(payload["jid"], jid.as_str());
    assert_eq!(payload["class"], "ChaosJob");

    // And `wasmjobs cancel` still finds and stops it by its preview.
    let cancel = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .args(["cancel", "--redis", &redis.url(), &jid])
        .output()
        .expect("wasmjobs cancel");
    let said = String::from_utf8_lossy(&cancel.stdout);
    assert!(
        said.contains("cancelled"),
        "{said}\n{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    assert!(runner.stop().success(), "{}", runner.log());
}
