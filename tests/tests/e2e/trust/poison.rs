//! Trust tests: poison input in Redis, and a full Redis.
//!
//! Anyone who can write to the Redis the runners share can put anything
//! there: bytes that are not UTF-8, text that is not JSON, a million
//! distinct class names, a class name of a megabyte. None of it may wedge
//! a runner, stall the jobs fetched beside it, or grow the runner's memory
//! or `/metrics` without bound. And a Redis that is full (`maxmemory`
//! with `noeviction`) must delay outcomes visibly, never lose them.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, int, jobs_in_progress, plugins, push};

/// A payload that starts with bytes no UTF-8 text can hold.
const NOT_UTF8: &[u8] = b"\xff\xfe{\"class\":\"ChaosJob\",\"args\":[\"ok\"]}";

/// The value of the unlabelled sample `name` in a Prometheus text body.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// [`wasmjobs_e2e::eventually`], naming `what` and showing the runner's log.
async fn until<F, Fut>(timeout: Duration, what: &str, runner: &Runner, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wasmjobs_e2e::eventually(timeout, || format!("{what}:\n{}", runner.log()), check).await;
}

/// The dead set's entries, parsed from their bytes (each must be JSON).
async fn dead(conn: &mut redis::aio::MultiplexedConnection) -> Vec<Value> {
    let members: Vec<Vec<u8>> = conn.zrange("dead", 0, -1).await.expect("ZRANGE dead");
    members
        .iter()
        .map(|m| serde_json::from_slice(m).unwrap_or_else(|e| panic!("dead entry is not JSON ({e}): {m:?}")))
        .collect()
}

/// Decodes lowercase or uppercase hex.
fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd hex length");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Checks a dead-set entry made from the non-UTF-8 payload: Sidekiq's
/// fields, an error saying why, the text lossily decoded, the exact bytes
/// recoverable.
fn assert_undecodable_entry(entry: &Value) {
    assert_eq!(entry["error_class"], "wasmjobs::MalformedPayload", "{entry}");
    let message = entry["error_message"].as_str().expect("error_message");
    assert!(message.contains("UTF-8"), "{message}");
    assert!(entry["jid"].as_str().is_some_and(|j| !j.is_empty()), "{entry}");
    assert!(entry["args"].is_array(), "{entry}");
    assert!(entry["failed_at"].is_number(), "{entry}");
    let shown = entry["malformed_payload"].as_str().expect("malformed_payload");
    assert_eq!(shown, String::from_utf8_lossy(NOT_UTF8), "{entry}");
    let raw = entry["raw_hex"].as_str().expect("raw_hex");
    assert_eq!(unhex(raw), NOT_UTF8, "{entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_utf8_payload_in_a_queue_goes_to_dead_and_the_jobs_beside_it_run() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&[], &["chaos"]);
    // Batch fetch: the bad payload sits between good ones, all taken by
    // one fetch when the runner starts.
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..10).map(|_| json!(["ok"])).collect(),
    )
    .await;
    let _: () = conn.lpush("queue:default", NOT_UTF8).await.expect("LPUSH");
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..10).map(|_| json!(["ok"])).collect(),
    )
    .await;
    let mut runner = Runner::start(&redis.url(), plugins.path(), &[]);
    runner.wait_running();
    until(Duration::from_secs(30), "20 jobs processed, 1 dead", &runner, || {
        let mut conn = conn.clone();
        async move {
            int(&mut conn, "stat:processed").await >= 20 && conn.zcard::<_, u64>("dead").await.expect("ZCARD") == 1
        }
    })
    .await;

    // Blocking fetch: the runner is idle, waiting in Redis, when the bad
    // payload arrives; a good job pushed after it still runs.
    let _: () = conn.lpush("queue:default", NOT_UTF8).await.expect("LPUSH");
    push(&mut conn, "ChaosJob", "default", vec![json!(["ok"])]).await;
    until(Duration::from_secs(30), "21 jobs processed, 2 dead", &runner, || {
        let mut conn = conn.clone();
        async move {
            int(&mut conn, "stat:processed").await >= 21
                && conn.zcard::<_, u64>("dead").await.expect("ZCARD") == 2
                && jobs_in_progress(&mut conn).await == 0
        }
    })
    .await;

    for entry in dead(&mut conn).await {
        assert_undecodable_entry(&entry);
    }
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 0);
    assert_eq!(int(&mut conn, "stat:processed").await, 21, "only the good jobs ran");
    assert!(!runner.log().contains("will check again"), "{}", runner.log());
    assert!(runner.stop().success(), "{}", runner.log());
    assert_eq!(jobs_in_progress(&mut conn).await, 0, "{}", runner.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_payloads_due_in_retry_and_schedule_go_to_dead_and_the_poller_keeps_working() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&[], &["chaos"]);
    let _: () = conn.zadd("schedule", NOT_UTF8, 0).await.expect("ZADD schedule");
    let _: () = conn.zadd("retry", NOT_UTF8, 0).await.expect("ZADD retry");
    let now = wasmjobs::redis::now_f64();
    let mut scheduled = Payload::new("ChaosJob", vec![json!("ok")], "default", now);
    client::schedule(&mut conn, &mut scheduled, now - 1.0)
        .await
        .expect("schedule");
    let mut retried = Payload::new("ChaosJob", vec![json!("ok")], "default", now);
    retried.set("retry_count", json!(0));
    let _: () = conn.zadd("retry", retried.to_json(), 1).await.expect("ZADD retry");

    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--poll-interval", "0.1"]);
    runner.wait_running();
    until(Duration::from_secs(30), "2 jobs processed, 2 dead", &runner, || {
        let mut conn = conn.clone();
        async move {
            int(&mut conn, "stat:processed").await >= 2 && conn.zcard::<_, u64>("dead").await.expect("ZCARD") == 2
        }
    })
    .await;
    // The poller keeps going: a job scheduled now is enqueued and runs.
    let mut later = Payload::new("ChaosJob", vec![json!("ok")], "default", now);
    client::schedule(&mut conn, &mut later, wasmjobs::redis::now_f64())
        .await
        .expect("schedule");
    until(Duration::from_secs(30), "the third job processed", &runner, || {
        let mut conn = conn.clone();
        async move { int(&mut conn, "stat:processed").await >= 3 }
    })
    .await;

    for entry in dead(&mut conn).await {
        assert_undecodable_entry(&entry);
    }
    assert_eq!(conn.zcard::<_, u64>("schedule").await.expect("ZCARD"), 0);
    assert_eq!(conn.zcard::<_, u64>("retry").await.expect("ZCARD"), 0);
    assert!(runner.stop().success(), "{}", runner.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_classes_share_one_metrics_label_and_a_huge_class_name_is_refused() {
    const JUNK: usize = 5_000;
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&[], &["chaos"]);
    let addr = free_addr();
    let now = wasmjobs::redis::now_f64();
    let mut junk: Vec<Payload> = (0..JUNK)
        .map(|i| Payload::new(&format!("Junk{i}x{:016x}", rand_u64(i)), Vec::new(), "default", now))
        .collect();
    client::push_bulk(&mut conn, &mut junk).await.expect("push junk");
    let mut huge = Payload::new(&"H".repeat(1 << 20), Vec::new(), "default", now);
    client::push(&mut conn, &mut huge).await.expect("push the huge class");

    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr]);
    runner.wait_running();
    until(
        Duration::from_secs(120),
        "every junk job retried or dead",
        &runner,
        || {
            let mut conn = conn.clone();
            async move {
                let retry: u64 = conn.zcard("retry").await.expect("ZCARD");
                let dead: u64 = conn.zcard("dead").await.expect("ZCARD");
                retry + dead == JUNK as u64 + 1 && jobs_in_progress(&mut conn).await == 0
            }
        },
    )
    .await;

    let body = http_get(&addr, "/metrics");
    let mut classes = std::collections::BTreeSet::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some(start) = line.find("class=\"") {
            let rest = &line[start + 7..];
            classes.insert(rest[..rest.find('"').unwrap_or(rest.len())].to_owned());
        }
    }
    assert!(
        classes.len() <= 4,
        "{} class label values in /metrics, e.g. {:?}",
        classes.len(),
        classes.iter().take(5).collect::<Vec<_>>()
    );
    assert!(body.len() < 200_000, "/metrics is {} bytes", body.len());

    // The huge class: refused with a clear, short error, wherever it went.
    let mut found = None;
    for set in ["dead", "retry"] {
        let members: Vec<Vec<u8>> = conn.zrange(set, 0, -1).await.expect("ZRANGE");
        for member in members.iter().filter(|m| m.len() > 1 << 20) {
            let entry: Value = serde_json::from_slice(member).expect("JSON");
            found = Some(entry["error_message"].as_str().unwrap_or_default().to_owned());
        }
    }
    let message = found.expect("the huge-class job is in retry or dead");
    assert!(message.len() < 1_000, "error_message of {} bytes", message.len());
    assert!(message.contains("class"), "{message}");

    // Still healthy: a served job runs.
    push(&mut conn, "ChaosJob", "default", vec![json!(["ok"])]).await;
    until(Duration::from_secs(30), "the served job processed", &runner, || {
        let mut conn = conn.clone();
        async move { int(&mut conn, "stat:processed").await > JUNK as u64 + 1 }
    })
    .await;
    assert!(runner.stop().success(), "{}", runner.log());
}

/// A cheap, deterministic-per-run scramble (distinct class names).
fn rand_u64(i: usize) -> u64 {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_delays_outcomes_visibly_and_loses_none() {
    const JOBS: u64 = 20;
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    let plugins = plugins(&[], &["chaos"]);
    let addr = free_addr();
    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr]);
    runner.wait_running();
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..JOBS).map(|_| json!(["sleep", 1500])).collect(),
    )
    .await;
    until(Duration::from_secs(30), "every job taken", &runner, || {
        let mut conn = conn.clone();
        async move { jobs_in_progress(&mut conn).await == JOBS }
    })
    .await;

    // Fill Redis while the jobs run: some data, then a maxmemory below what
    // it uses (a margin over the client buffers, which come and go), so
    // every write that needs memory is refused.
    let filler = vec![b'x'; 256 << 10];
    for i in 0..16 {
        let _: () = conn.set(format!("filler:{i}"), &filler).await.expect("SET filler");
    }
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used - (1 << 20))
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory");
    let refused = conn.set::<_, _, ()>("probe", "x").await.expect_err("Redis is full");
    assert!(refused.to_string().contains("OOM"), "{refused}");

    until(
        Duration::from_secs(30),
        "failed outcome writes in /metrics",
        &runner,
        || {
            let addr = addr.clone();
            async move {
                let body = http_get(&addr, "/metrics");
                sample(&body, "wasmjobs_outcome_write_failures_total").is_some_and(|n| n > 0.0)
                    && sample(&body, "wasmjobs_outcomes_pending").is_some_and(|n| n > 0.0)
            }
        },
    )
    .await;
    let log = runner.log();
    let refused = log
        .lines()
        .find(|l| l.contains("cannot record job outcomes"))
        .unwrap_or_else(|| panic!("no outcome write error logged:\n{log}"));
    assert!(
        refused.contains("OOM") && refused.contains("Redis is full"),
        "{refused}"
    );
    assert_eq!(
        int(&mut conn, "stat:processed").await,
        0,
        "nothing can be written while full"
    );
    assert_eq!(jobs_in_progress(&mut conn).await, JOBS, "every job is still held");

    // Room again: every outcome is written, none lost.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory 0");
    until(Duration::from_secs(60), "every outcome written", &runner, || {
        let mut conn = conn.clone();
        let addr = addr.clone();
        async move {
            int(&mut conn, "stat:processed").await == JOBS
                && jobs_in_progress(&mut conn).await == 0
                && sample(&http_get(&addr, "/metrics"), "wasmjobs_outcomes_pending") == Some(0.0)
        }
    })
    .await;
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 0);
    assert!(
        runner.log().contains("job outcomes recorded after Redis refused them"),
        "{}",
        runner.log()
    );
    assert!(runner.stop().success(), "{}", runner.log());
    assert_eq!(int(&mut conn, "stat:processed").await, JOBS);
}
