//! `wasmjobs run` end to end: a real redis-server, the real binary, the
//! repo's own components.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{
    Runner, held_by, held_lists, int, jobs_in_progress, lines, make_retries_due, plugins, push, wait_processed, zset,
};
use wasmjobs_e2e::sidekiq::ruby_json;

fn counts(lines: &[String]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(line.clone()).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_noops_and_a_mix_each_run_exactly_once() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop", "file-append", "fib", "echo"], &[]);
    push(
        &mut conn,
        "NoopJob",
        "default",
        (0..10_000).map(|i| json!([i])).collect(),
    )
    .await;
    push(
        &mut conn,
        "FileAppendJob",
        "default",
        (0..1_000).map(|i| json!(["mix.txt", i])).collect(),
    )
    .await;
    push(&mut conn, "FibJob", "default", (0..20).map(|_| json!([15])).collect()).await;
    push(
        &mut conn,
        "EchoJob",
        "critical",
        (0..50).map(|i| json!(["hello", i])).collect(),
    )
    .await;

    let mut runner = Runner::start(
        &redis.url(),
        dir.path(),
        &["--concurrency", "50", "--queues", "critical,default"],
    );
    wait_processed(&mut conn, 11_070, Duration::from_secs(120), || runner.log()).await;
    assert!(runner.stop().success());

    assert_eq!(int(&mut conn, "stat:processed").await, 11_070, "no job ran twice");
    // Sidekiq's daily keys add up to the same (summed: a run may straddle midnight).
    let daily: Vec<String> = conn.keys("stat:processed:*").await.expect("KEYS");
    let mut per_day = 0;
    for key in &daily {
        assert!(key.len() == "stat:processed:2026-11-30".len(), "{key}");
        per_day += int(&mut conn, key).await;
    }
    assert_eq!(per_day, 11_070, "{daily:?}");
    let log = runner.log();
    let echo = log
        .lines()
        .find(|l| l.contains(r#"args: ["hello","#))
        .unwrap_or_else(|| panic!("no EchoJob line in:\n{log}"));
    assert!(
        echo.contains("jid=") && echo.contains("class=EchoJob") && echo.contains("plugin=echo"),
        "{echo}"
    );
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    let appended = lines(&dir.path().join("file-append/data/mix.txt"));
    assert_eq!(appended.len(), 1_000);
    let ids = counts(&appended);
    assert!(
        (0..1_000).all(|i| ids.get(&i.to_string()) == Some(&1)),
        "every FileAppendJob ran exactly once"
    );
    let left: u64 = conn.llen("queue:default").await.expect("LLEN");
    assert_eq!(left, 0);
    let owners: Vec<String> = conn.smembers("wasmjobs:holders").await.expect("SMEMBERS");
    assert!(
        owners.is_empty(),
        "the in-progress list is gone after a clean stop: {owners:?}"
    );
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert!(processes.is_empty(), "the heartbeat is removed on stop: {processes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_follow_the_retry_policy() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--poll-interval", "0.05"]);
    runner.wait_running();

    // Fails once, then succeeds on its first retry.
    push(&mut conn, "ChaosJob", "default", vec![json!(["fail-times", 1])]).await;
    wait_processed(&mut conn, 1, Duration::from_secs(20), || runner.log()).await;
    let retries = zset(&mut conn, "retry").await;
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].retry_count(), Some(0));
    assert_eq!(retries[0].str("error_message"), Some("failing on purpose, attempt 1"));
    assert!(retries[0].time("failed_at").is_some());
    make_retries_due(&mut conn).await;
    wait_processed(&mut conn, 2, Duration::from_secs(20), || runner.log()).await;
    assert_eq!(int(&mut conn, "stat:failed").await, 1);
    assert!(zset(&mut conn, "retry").await.is_empty());
    assert!(zset(&mut conn, "dead").await.is_empty());

    // Always fails, `retry: 2`: two retries, then the dead set, with the
    // error fields and the client's own keys intact.
    let raw = json!({"class": "ChaosJob", "args": ["retry", "still broken"], "jid": "0123456789abcdef01234567",
        "queue": "default", "retry": 2, "created_at": 1_764_500_000.25, "enqueued_at": 1_764_500_000.5,
        "my_trace": {"id": "t-1"}});
    let _: () = conn.lpush("queue:default", raw.to_string()).await.expect("LPUSH");
    for processed in 3..=5 {
        wait_processed(&mut conn, processed, Duration::from_secs(20), || runner.log()).await;
        make_retries_due(&mut conn).await;
    }
    let dead = zset(&mut conn, "dead").await;
    assert_eq!(dead.len(), 1, "{}", runner.log());
    let dead = &dead[0];
    assert_eq!(dead.jid(), "0123456789abcdef01234567");
    assert_eq!(dead.str("error_message"), Some("still broken"));
    assert_eq!(dead.str("error_class"), Some("wasmjobs::Retry"));
    assert_eq!(dead.retry_count(), Some(2));
    assert!(dead.time("retried_at").is_some());
    assert_eq!(dead.time("failed_at").map(|t| t > 1_764_500_000.0), Some(true));
    assert_eq!(dead.get("my_trace"), Some(&json!({"id": "t-1"})));
    assert_eq!(dead.time("created_at"), Some(1_764_500_000.25));

    // `retry: false`: dropped after one failure, neither retried nor dead.
    let raw = json!({"class": "ChaosJob", "args": ["retry", "x"], "queue": "default", "retry": false});
    let _: () = conn.lpush("queue:default", raw.to_string()).await.expect("LPUSH");
    wait_processed(&mut conn, 6, Duration::from_secs(20), || runner.log()).await;

    // Discard: counted, gone. Dead: straight to the dead set.
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![json!(["discard", "not needed"]), json!(["dead", "hopeless"])],
    )
    .await;
    wait_processed(&mut conn, 8, Duration::from_secs(20), || runner.log()).await;
    assert_eq!(int(&mut conn, "wasmjobs:stat:discarded").await, 1);
    let dead = zset(&mut conn, "dead").await;
    assert!(dead.iter().any(|d| d.str("error_message") == Some("hopeless")));
    assert_eq!(dead.len(), 2);
    assert!(zset(&mut conn, "retry").await.is_empty());
    assert_eq!(int(&mut conn, "stat:failed").await, 1 + 3 + 1 + 1);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payloads_go_dead_and_unknown_classes_retry_with_a_reason() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    for raw in [
        "this is not json",
        r#"{"class":"NoopJob"}"#,
        r#"{"class":"NoSuchJob","args":[1],"keep":true}"#,
        r#"{"class":"NoSuchJob","args":[2],"retry":false}"#,
        "[1,2]",
    ] {
        let _: () = conn.lpush("queue:default", raw).await.expect("LPUSH");
    }
    push(&mut conn, "NoopJob", "default", vec![json!([])]).await;
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    wait_processed(&mut conn, 6, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success());

    let dead = zset(&mut conn, "dead").await;
    assert_eq!(dead.len(), 4, "{dead:?}");
    let message = |needle: &str| {
        dead.iter()
            .find_map(|d| d.str("error_message").filter(|m| m.contains(needle)).map(str::to_owned))
            .unwrap_or_else(|| panic!("no dead job mentions {needle:?}: {dead:?}"))
    };
    message("not valid JSON");
    message("has no \"args\"");
    message("not a JSON object");
    // Never ran, so never dropped: `retry: false` goes to the dead set.
    message("no plugin serves job class \"NoSuchJob\"");
    let mut wrapped: Vec<&str> = dead.iter().filter_map(|d| d.str("malformed_payload")).collect();
    wrapped.sort();
    assert_eq!(
        wrapped,
        ["[1,2]", "this is not json"],
        "payloads that are not objects are kept verbatim"
    );
    // An unknown class waits in the retry set for its plugin to appear,
    // its payload intact.
    let retries = zset(&mut conn, "retry").await;
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0].class(), "NoSuchJob");
    assert_eq!(retries[0].get("keep"), Some(&Value::Bool(true)));
    assert_eq!(retries[0].str("error_class"), Some("wasmjobs::NoPlugin"));
    assert_eq!(int(&mut conn, "stat:processed").await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_nothing_in_reliable_mode() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["file-append"], &[]);
    let file = dir.path().join("file-append/data/crash.txt");
    push(
        &mut conn,
        "FileAppendJob",
        "default",
        (0..20_000).map(|i| json!(["crash.txt", i])).collect(),
    )
    .await;

    let mut first = Runner::start(&redis.url(), dir.path(), &["--concurrency", "50"]);
    first.wait_running();
    let owners: Vec<String> = conn.smembers("wasmjobs:holders").await.expect("SMEMBERS");
    assert_eq!(owners.len(), 1);
    while lines(&file).len() < 5_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.signal("KILL");
    first.wait(Duration::from_secs(10));
    let in_flight = held_by(&mut conn, &owners[0]).await.len();
    let done_before = lines(&file).len();
    assert!(done_before < 20_000, "the crash must happen mid-run");

    let mut second = Runner::start(&redis.url(), dir.path(), &["--concurrency", "50"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let queued: u64 = conn.llen("queue:default").await.expect("LLEN");
        let ids = counts(&lines(&file));
        if queued == 0 && ids.len() == 20_000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of 20000 ran:\n{}",
            ids.len(),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(second.stop().success());
    let all = lines(&file);
    let ids = counts(&all);
    assert!(
        (0..20_000).all(|i| ids.contains_key(&i.to_string())),
        "every job ran at least once"
    );
    let duplicates = all.len() - ids.len();
    assert!(
        duplicates <= in_flight,
        "{duplicates} duplicates but only {in_flight} jobs were in flight"
    );
    assert!(second.log().contains("recovered"), "{}", second.log());
    let owners: Vec<String> = conn.smembers("wasmjobs:holders").await.expect("SMEMBERS");
    assert!(owners.is_empty(), "{owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_requeues_jobs_still_running_at_the_deadline() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..10).map(|_| json!(["sleep", 20_000])).collect(),
    )
    .await;
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..5).map(|_| json!(["sleep", 100])).collect(),
    )
    .await;
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "20", "--timeout", "1"]);
    runner.wait_running();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let status = runner.stop();
    assert!(status.success(), "{status}: {}", runner.log());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    let queued: Vec<String> = conn.lrange("queue:default", 0, -1).await.expect("LRANGE");
    assert_eq!(
        queued.len(),
        10,
        "the long jobs are back in their queue: {}",
        runner.log()
    );
    assert!(queued.iter().all(|j| j.contains("20000")));
    assert_eq!(int(&mut conn, "stat:processed").await, 5);
    let keys: Vec<String> = conn.keys("wasmjobs:inprogress*").await.expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
}

/// Issue 35: a second Ctrl-C while a shutdown waits for its jobs stops them
/// at once and puts them back in their queue, instead of being ignored
/// for the whole `--timeout`; meanwhile the wait counts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigint_ends_the_shutdown_wait_and_requeues_the_jobs() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..3).map(|_| json!(["sleep", 600_000])).collect(),
    )
    .await;
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "5", "--timeout", "300"]);
    runner.wait_running();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while conn.llen::<_, u64>("queue:default").await.expect("LLEN") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs were not taken: {}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runner.signal("INT");
    runner.wait_for_log("Ctrl-C again stops them now", Duration::from_secs(30));
    runner.wait_for_log("s left (Ctrl-C again", Duration::from_secs(30));
    let again = std::time::Instant::now();
    runner.signal("INT");
    let status = runner.wait(Duration::from_secs(120));
    assert!(status.success(), "{status}: {}", runner.log());
    assert!(
        again.elapsed() < Duration::from_secs(60),
        "the second SIGINT was not acted on ({:?}, --timeout 300):\n{}",
        again.elapsed(),
        runner.log()
    );
    assert!(runner.log().contains("a second SIGINT"), "{}", runner.log());
    let queued: Vec<String> = conn.lrange("queue:default", 0, -1).await.expect("LRANGE");
    assert_eq!(queued.len(), 3, "the jobs are back in their queue: {}", runner.log());
    assert_eq!(int(&mut conn, "stat:processed").await, 0);
}

/// The OS signals a terminal or process manager sends: SIGTSTP quiets the
/// runner (Sidekiq's meaning: finish what runs, take nothing new), SIGINT
/// stops it like SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigtstp_quiets_the_runner_and_sigint_stops_it() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    push(&mut conn, "NoopJob", "default", (0..10).map(|i| json!([i])).collect()).await;
    wait_processed(&mut conn, 10, Duration::from_secs(30), || runner.log()).await;

    runner.signal("TSTP");
    // Logged once quiet has taken effect: the fetch loop and its blocking
    // waits have ended, so jobs pushed from now on stay queued.
    runner.wait_for_log("SIGTSTP: quiet", Duration::from_secs(10));
    push(&mut conn, "NoopJob", "default", (10..20).map(|i| json!([i])).collect()).await;
    // Not a synchronisation: the window in which a wrongly active runner
    // would have taken the jobs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting: u64 = conn.llen("queue:default").await.expect("LLEN");
    assert_eq!(waiting, 10, "a quiet runner takes no new job:\n{}", runner.log());
    assert_eq!(int(&mut conn, "stat:processed").await, 10);

    runner.signal("INT");
    let status = runner.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", runner.log());
    assert!(runner.log().contains("SIGINT"), "{}", runner.log());
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert!(processes.is_empty(), "the heartbeat is removed on stop: {processes:?}");
    let waiting: u64 = conn.llen("queue:default").await.expect("LLEN");
    assert_eq!(waiting, 10, "the jobs pushed while quiet are still queued");
}

/// A SIGTERM that arrives while the runner is still starting (here: while
/// it compiles a Python plugin, `--no-cache`) is a clean stop once start-up
/// is done, not the default action of the signal: a deploy that stops a
/// process it just started must not see it die by signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_is_a_clean_stop() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop", "py-noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--no-cache"]);
    runner.wait_for_log(" starting ", Duration::from_secs(30));
    runner.signal("TERM");
    let status = runner.wait(Duration::from_secs(120));
    assert!(status.success(), "{status}: {}", runner.log());
    assert!(runner.log().contains("SIGTERM"), "{}", runner.log());
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert!(processes.is_empty(), "the heartbeat is removed on stop: {processes:?}");
}

/// `--threads N` sets the threads that run jobs (one process per core with
/// `--threads 1` is the setting for fresh Python/JS instances).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_sets_the_worker_threads() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    for threads in ["1", "3"] {
        let mut runner = Runner::start(&redis.url(), dir.path(), &["--threads", threads]);
        runner.wait_running();
        assert!(
            runner.log().contains(&format!(" threads={threads}\n")),
            "{}",
            runner.log()
        );
        let before = int(&mut conn, "stat:processed").await;
        push(&mut conn, "NoopJob", "default", (0..100).map(|i| json!([i])).collect()).await;
        wait_processed(&mut conn, before + 100, Duration::from_secs(30), || runner.log()).await;
        assert!(runner.stop().success(), "{}", runner.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_run_loses_no_job() {
    let mut redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let file = dir.path().join("chaos/data/restart.txt");
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..3_000)
            .map(|i| json!(["slow-append", "restart.txt", i, 10]))
            .collect(),
    )
    .await;
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "20"]);
    runner.wait_running();
    while lines(&file).len() < 300 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.restart();
    let mut conn = redis.conn().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let queued: u64 = conn.llen("queue:default").await.unwrap_or(1);
        if queued == 0 && counts(&lines(&file)).len() == 3_000 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let keys: Vec<String> = conn.keys("*").await.unwrap_or_default();
            let mut state = Vec::new();
            for key in &keys {
                let kind: String = redis::cmd("TYPE")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                let size: i64 = match kind.as_str() {
                    "list" => conn.llen(key).await.unwrap_or(-1),
                    "zset" => conn.zcard(key).await.unwrap_or(-1),
                    "set" => conn.scard(key).await.unwrap_or(-1),
                    _ => 0,
                };
                state.push(format!("{key} ({kind}) {size}"));
            }
            let ids = counts(&lines(&file));
            let missing: Vec<u32> = (0..3_000).filter(|i| !ids.contains_key(&i.to_string())).collect();
            panic!(
                "{} of 3000 ran; missing {missing:?}; redis: {state:?}\n{}",
                ids.len(),
                runner.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every outcome is recorded once Redis is back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = jobs_in_progress(&mut conn).await;
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} jobs still in progress:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(runner.stop().success(), "{}", runner.log());
    let ids = counts(&lines(&file));
    assert!((0..3_000).all(|i| ids.contains_key(&i.to_string())), "no job lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_thirty_thousand_jobs_exactly_once() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["file-append"], &[]);
    let file = dir.path().join("file-append/data/shared.txt");
    push(
        &mut conn,
        "FileAppendJob",
        "default",
        (0..30_000).map(|i| json!(["shared.txt", i])).collect(),
    )
    .await;
    let mut runners: Vec<Runner> = (0..3)
        .map(|i| {
            Runner::start(
                &redis.url(),
                dir.path(),
                &["--concurrency", "20", "--tag", &format!("node-{i}")],
            )
        })
        .collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert_eq!(processes.len(), 3);
    let stats = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .args(["stats", "--json", "--redis", &redis.url()])
        .output()
        .expect("wasmjobs stats");
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["processes"].as_array().map(Vec::len), Some(3), "{stats}");
    let seen = ruby_json(
        &redis.url(),
        r#"puts JSON.generate(Sidekiq::ProcessSet.new.map { |p| p["tag"] }.sort)"#,
    );
    assert_eq!(seen, json!(["node-0", "node-1", "node-2"]), "Sidekiq's ProcessSet");

    wait_processed(&mut conn, 30_000, Duration::from_secs(180), || {
        runners.iter().map(Runner::log).collect()
    })
    .await;
    for runner in &mut runners {
        assert!(runner.stop().success());
    }
    let all = lines(&file);
    assert_eq!(all.len(), 30_000);
    assert_eq!(counts(&all).len(), 30_000, "each job ran exactly once");
    assert_eq!(int(&mut conn, "stat:processed").await, 30_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_at_its_concurrency_limit_does_not_hold_the_runners_slots() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["file-append"], &["chaos"]);
    wasmjobs_e2e::append_to_manifest(&dir.path().join("chaos"), "[limits]\nconcurrency = 2");
    let slow = dir.path().join("chaos/data/slow.txt");
    let fast = dir.path().join("file-append/data/fast.txt");
    // The slow jobs are first in line and could take all 10 runner slots.
    push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..10).map(|i| json!(["slow-append", "slow.txt", i, 300])).collect(),
    )
    .await;
    push(
        &mut conn,
        "FileAppendJob",
        "default",
        (0..300).map(|i| json!(["fast.txt", i])).collect(),
    )
    .await;

    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "10"]);
    runner.wait_running();
    let started = std::time::Instant::now();
    while lines(&fast).len() < 300 {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", runner.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fast_done = started.elapsed();
    let slow_then = lines(&slow).len();
    while lines(&slow).len() < 10 {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", runner.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let slow_done = started.elapsed();
    assert!(runner.stop().success());
    assert!(
        slow_then < 10,
        "the fast jobs finished first ({slow_then} slow ones done by then)"
    );
    assert!(fast_done < Duration::from_millis(1200), "fast jobs took {fast_done:?}");
    assert!(
        slow_done >= Duration::from_millis(1400),
        "at most 2 slow jobs at a time, yet all done in {slow_done:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_recovered_and_poison_pills_buried() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["file-append"], &[]);
    // A process that died on another host left two jobs behind: one never
    // recovered before (in its in-progress list), one already recovered
    // three times (in one of its batch lists, where a fetch leaves jobs).
    // A process from before the batch lists, registered where those were,
    // left one more.
    let ghost = "ghost-host:999999999:abcdef";
    let older = "old-host:999999999:abcdef";
    let old_job = json!({"class": "FileAppendJob", "args": ["orphans.txt", 3], "jid": "a3", "queue": "default"});
    let fresh = json!({"class": "FileAppendJob", "args": ["orphans.txt", 1], "jid": "a1", "queue": "default"});
    let pill = json!({"class": "FileAppendJob", "args": ["orphans.txt", 2], "jid": "a2", "queue": "default",
        "wasmjobs_recoveries": 3});
    let lists = held_lists(ghost);
    let _: () = conn.lpush(&lists[0], fresh.to_string()).await.expect("LPUSH");
    let _: () = conn.lpush(&lists[7], pill.to_string()).await.expect("LPUSH");
    let _: () = conn.sadd("wasmjobs:holders", ghost).await.expect("SADD");
    let _: () = conn
        .lpush(&held_lists(older)[0], old_job.to_string())
        .await
        .expect("LPUSH");
    let _: () = conn.sadd("wasmjobs:inprogress", older).await.expect("SADD");

    // The ghosts have no heartbeat, so the first sweep (at start) recovers them.
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    wait_processed(&mut conn, 2, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success());
    let mut ran = lines(&dir.path().join("file-append/data/orphans.txt"));
    ran.sort();
    assert_eq!(ran, ["1", "3"]);
    let dead = zset(&mut conn, "dead").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].jid(), "a2");
    assert_eq!(dead[0].str("error_class"), Some("wasmjobs::PoisonPill"));
    assert!(
        dead[0].str("error_message").is_some_and(|m| m.contains("4 processes")),
        "{dead:?}"
    );
    assert!(held_by(&mut conn, ghost).await.is_empty());
    assert!(held_by(&mut conn, older).await.is_empty());
    for set in ["wasmjobs:holders", "wasmjobs:inprogress"] {
        let owners: Vec<String> = conn.smembers(set).await.expect("SMEMBERS");
        assert!(owners.is_empty(), "{set}: {owners:?}");
    }
}
