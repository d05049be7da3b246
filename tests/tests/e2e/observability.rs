//! Metrics end to end: a real `wasmjobs run` with `--metrics-addr`, a
//! known mix of jobs, the JSON and Prometheus endpoints read over HTTP, and
//! `--exit-when-empty` with its JSON summary, and a heartbeat that Redis
//! refuses for a while.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, int, plugins, push, wait_processed};

/// Pushes the known mix: 200 NoopJob (fast), 20 ChaosJob sleeping 300 ms
/// in a host call (slow), 10 FibJob with bad args (failing: dead).
async fn push_mix(conn: &mut redis::aio::MultiplexedConnection) {
    push(conn, "NoopJob", "default", (0..200).map(|i| json!([i])).collect()).await;
    push(
        conn,
        "ChaosJob",
        "default",
        (0..20).map(|_| json!(["sleep", 300])).collect(),
    )
    .await;
    push(
        conn,
        "FibJob",
        "default",
        (0..10).map(|_| json!(["not a number"])).collect(),
    )
    .await;
}

fn class<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["classes"]
        .as_array()
        .and_then(|classes| classes.iter().find(|c| c["class"] == name))
        .unwrap_or_else(|| panic!("no class {name} in {stats:#}"))
}

/// A runner serving metrics on a free port, after the known mix has run.
struct MixRun {
    _redis: TestRedis,
    _plugins: tempfile::TempDir,
    runner: Runner,
    addr: String,
}

async fn run_mix() -> MixRun {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&["noop", "fib"], &["chaos"]);
    let addr = free_addr();
    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr]);
    runner.wait_running();
    push_mix(&mut conn).await;
    wait_processed(&mut conn, 230, Duration::from_secs(60), || runner.log()).await;
    MixRun {
        _redis: redis,
        _plugins: plugins,
        runner,
        addr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_mix_is_counted_exactly_and_timed_sanely() {
    // Every field bound (no `..`): Redis and the plugins must outlive the runner.
    let MixRun {
        _redis,
        _plugins,
        mut runner,
        addr,
    } = run_mix().await;
    // Outcomes are recorded in the runner before they are written to Redis.
    let stats: Value = serde_json::from_str(&http_get(&addr, "/stats")).expect("JSON");

    let noop = class(&stats, "NoopJob");
    assert_eq!(noop["processed"], 200);
    assert_eq!(noop["failed"], 0);
    let slow = class(&stats, "ChaosJob");
    assert_eq!(slow["processed"], 20);
    let exec_p50 = slow["execution_ms"]["p50"].as_f64().expect("p50");
    assert!((300.0..2_000.0).contains(&exec_p50), "slow p50 {exec_p50} ms");
    assert!(slow["execution_ms"]["max"].as_f64() >= slow["execution_ms"]["p99"].as_f64());
    let fast_p50 = noop["execution_ms"]["p50"].as_f64().expect("p50");
    assert!(fast_p50 < exec_p50, "noop {fast_p50} ms vs slow {exec_p50} ms");
    let failing = class(&stats, "FibJob");
    assert_eq!(failing["processed"], 10);
    assert_eq!(failing["failed"], 10);
    assert_eq!(failing["dead"], 10);
    for name in ["NoopJob", "ChaosJob", "FibJob"] {
        let queue = &class(&stats, name)["queue_latency_ms"];
        let (p50, p99) = (
            queue["p50"].as_f64().unwrap_or(-1.0),
            queue["p99"].as_f64().unwrap_or(-1.0),
        );
        assert!(p50 >= 0.0 && p50 <= p99 && p99 < 30_000.0, "{name}: {queue}");
    }
    let process = &stats["process"];
    assert!(process["rss_kb"].as_u64() > Some(1_000), "{process}");
    assert!(process["peak_rss_kb"].as_u64() >= process["rss_kb"].as_u64());
    assert_eq!(process["concurrency"], 100);
    // Per plugin version too: the chaos row carries its version id.
    let versions = stats["versions"].as_array().expect("versions");
    assert!(
        versions
            .iter()
            .any(|v| v["class"] == "ChaosJob" && v["version"].as_str().is_some_and(|s| s.len() == 12))
    );
    assert!(runner.stop().success(), "{}", runner.log());
    assert!(runner.log().contains("wasmjobs run summary"), "{}", runner.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prometheus_endpoint_parses_with_the_expected_families() {
    // Every field bound (no `..`): Redis and the plugins must outlive the runner.
    let MixRun {
        _redis,
        _plugins,
        mut runner,
        addr,
    } = run_mix().await;
    let text = http_get(&addr, "/metrics");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("valid exposition");
    let samples = |name: &'static str| scrape.samples.iter().filter(move |s| s.metric == name);

    let noop_success = samples("wasmjobs_jobs_total")
        .find(|s| s.labels.get("class") == Some("NoopJob") && s.labels.get("outcome") == Some("success"))
        .expect("wasmjobs_jobs_total for NoopJob");
    assert!(matches!(noop_success.value, prometheus_parse::Value::Counter(n) if n == 200.0));
    assert!(noop_success.labels.get("version").is_some_and(|v| v.len() == 12));
    let dead = samples("wasmjobs_jobs_total")
        .find(|s| s.labels.get("class") == Some("FibJob") && s.labels.get("outcome") == Some("dead"))
        .expect("dead FibJob");
    assert!(matches!(dead.value, prometheus_parse::Value::Counter(n) if n == 10.0));

    for family in ["wasmjobs_job_execution_seconds", "wasmjobs_job_queue_latency_seconds"] {
        let chaos = samples(family)
            .find(|s| s.labels.get("class") == Some("ChaosJob"))
            .unwrap_or_else(|| panic!("{family} for ChaosJob:\n{text}"));
        let prometheus_parse::Value::Histogram(buckets) = &chaos.value else {
            panic!("{family} is not a histogram: {:?}", chaos.value)
        };
        assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count), "cumulative");
        if family == "wasmjobs_job_execution_seconds" {
            let under_a_quarter = buckets.iter().find(|b| b.less_than == 0.25).expect("0.25 bucket");
            let under_half = buckets.iter().find(|b| b.less_than == 0.5).expect("0.5 bucket");
            assert_eq!(under_a_quarter.count, 0.0, "every slow job slept 300 ms");
            assert_eq!(under_half.count, 20.0);
        }
    }
    for gauge in [
        "process_resident_memory_bytes",
        "wasmjobs_process_resident_memory_peak_bytes",
        "wasmjobs_concurrency",
        "wasmjobs_jobs_in_flight",
        "wasmjobs_instances_live",
        "wasmjobs_instances_idle",
        "wasmjobs_redis_rtt_seconds",
    ] {
        let sample = samples(gauge).next().unwrap_or_else(|| panic!("{gauge}:\n{text}"));
        assert!(matches!(sample.value, prometheus_parse::Value::Gauge(_)), "{gauge}");
    }
    let rss = samples("process_resident_memory_bytes").next().expect("rss");
    assert!(matches!(rss.value, prometheus_parse::Value::Gauge(b) if b > 1e6));
    assert!(samples("process_cpu_seconds_total").next().is_some());
    assert!(samples("wasmjobs_instances_reused_total").next().is_some());
    // The instance counters are copied by the process sampler: wait for a
    // sample taken after the mix (an idle runner samples every 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = http_get(&addr, "/metrics");
        let created = text
            .lines()
            .find_map(|line| line.strip_prefix("wasmjobs_instances_created_total "))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no instances counter:\n{text}"));
        if created >= 20.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "every job of the mix got an instance: {created}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(samples("wasmjobs_plugin_reloads_total").count() == 4);
    assert!(runner.stop().success(), "{}", runner.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_when_empty_stops_after_the_last_job_with_a_matching_summary() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop", "fib"], &["chaos"]);
    push_mix(&mut conn).await;
    let summary_dir = tempfile::tempdir().expect("tempdir");
    let summary_path = summary_dir.path().join("summary.json");
    let mut runner = Runner::start(
        &redis.url(),
        dir.path(),
        &[
            "--exit-when-empty",
            "--summary-json",
            summary_path.to_str().expect("utf-8 path"),
        ],
    );
    let status = runner.wait(Duration::from_secs(60));
    assert!(status.success(), "{}", runner.log());
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).expect("summary written")).expect("summary JSON");
    let processed = int(&mut conn, "stat:processed").await;
    assert_eq!(processed, 230);
    assert_eq!(summary["processed"], processed);
    assert_eq!(summary["failed"], 10);
    assert_eq!(summary["dead"], 10);
    assert!(summary["peak_rss_kb"].as_u64() >= summary["start_rss_kb"].as_u64());
    assert!(summary["wall_secs"].as_f64() > Some(0.0));
    let classes = summary["classes"].as_array().expect("classes");
    assert_eq!(classes.len(), 3, "{summary:#}");
    let log = runner.log();
    assert!(log.contains("every queue is empty"), "{log}");
    assert!(log.contains("MiB at peak") && log.contains("Exec p99"), "{log}");
}

/// `wasmjobs stats --json`, parsed.
fn stats_json(redis_url: &str) -> Value {
    let out = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .args(["stats", "--json", "--redis", redis_url])
        .output()
        .expect("wasmjobs stats");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_percentiles_are_published_with_the_heartbeat_and_merged_across_processes() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop", "fib"], &["chaos"]);
    let mut runners: Vec<Runner> = (0..2).map(|_| Runner::start(&redis.url(), dir.path(), &[])).collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    push_mix(&mut conn).await;
    wait_processed(&mut conn, 230, Duration::from_secs(60), || {
        runners.iter().map(Runner::log).collect()
    })
    .await;

    // While both run: each heartbeat (every 10 s) publishes what its
    // process recorded, and `stats` merges them.
    let url = redis.url();
    let latency_count = |stats: &Value, class: &str| stats["latency"][class]["execution"]["count"].as_u64();
    wasmjobs_e2e::eventually(
        Duration::from_secs(25),
        || format!("{:#}", stats_json(&url)["latency"]),
        || {
            let stats = stats_json(&url);
            async move { latency_count(&stats, "NoopJob") == Some(200) && latency_count(&stats, "ChaosJob") == Some(20) }
        },
    )
    .await;
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
    // Stopping publishes what is left, and nothing twice.
    let stats = stats_json(&url);
    let latency = &stats["latency"];
    assert_eq!(latency_count(&stats, "NoopJob"), Some(200), "{latency:#}");
    assert_eq!(latency_count(&stats, "ChaosJob"), Some(20), "{latency:#}");
    assert_eq!(
        latency["FibJob"]["execution"]["count"], 10,
        "dead jobs ran too: {latency:#}"
    );
    assert_eq!(latency["NoopJob"]["queue"]["count"], 200, "{latency:#}");
    let chaos = &latency["ChaosJob"]["execution"];
    let p = |q: &str| chaos[q].as_f64().unwrap_or(-1.0);
    assert!((280.0..2_000.0).contains(&p("p50")), "slept 300 ms: {chaos}");
    assert!(p("p50") <= p("p95") && p("p95") <= p("p99"), "{chaos}");
    let noop_p99 = latency["NoopJob"]["execution"]["p99"].as_f64().unwrap_or(f64::MAX);
    assert!(noop_p99 < p("p50"), "noop p99 {noop_p99} vs chaos p50 {}", p("p50"));

    // Bounded: one hash per minute, each expiring.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("wasmjobs:latency:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!((1..=3).contains(&keys.len()), "{keys:?}");
    for key in &keys {
        let ttl: i64 = redis::cmd("TTL").arg(key).query_async(&mut conn).await.expect("TTL");
        assert!((1..=7_200).contains(&ttl), "{key}: TTL {ttl}");
    }

    // The human table.
    let out = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .args(["stats", "--redis", &url])
        .output()
        .expect("wasmjobs stats");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("EXECUTION p50/p95/p99"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("ChaosJob") && l.contains("ms/")),
        "{text}"
    );
}

/// A sample of the Prometheus text `body`, if there is one.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_that_cannot_be_written_is_counted_logged_and_recovers() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&["noop"], &[]);
    let addr = free_addr();
    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr]);
    runner.wait_running();
    let metrics = http_get(&addr, "/metrics");
    assert_eq!(
        sample(&metrics, "wasmjobs_heartbeat_failures_total"),
        Some(0.0),
        "{metrics}"
    );
    let age = sample(&metrics, "wasmjobs_heartbeat_age_seconds").expect("the heartbeat's age");
    assert!(age < 15.0, "{age}");

    // Redis takes no writes for 20 s: the beats in that time fail.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .expect("CLIENT PAUSE");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&http_get(&addr, "/metrics"), "wasmjobs_heartbeat_failures_total").unwrap_or(0.0) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no heartbeat failure counted:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(runner.log().contains("heartbeat: "), "{}", runner.log());
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .expect("CLIENT UNPAUSE");
    // The next beat succeeds: the age falls back under a beat's interval.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = http_get(&addr, "/metrics");
        if sample(&metrics, "wasmjobs_heartbeat_age_seconds").is_some_and(|age| age < 11.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the heartbeat did not recover:\n{metrics}\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert_eq!(processes.len(), 1);
    assert!(runner.stop().success(), "{}", runner.log());
}

/// Each background service the fault hook of the tests' build makes panic
/// once (`tests/under_test/main.rs`). The fetch loop, the outcome writer,
/// the metrics server and the process sampler were spawned bare: a panic
/// in the fetch loop left a process that beat and fetched nothing, one in
/// the writer a process whose jobs never finished.
const FAILING: [&str; 8] = [
    "heartbeat",
    "reloader",
    "cron",
    "dashboard",
    "fetch loop",
    "outcome writer",
    "metrics server",
    "process sampler",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_services_that_panic_are_restarted_and_the_process_stays_registered() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let plugins = plugins(&["noop"], &[]);
    let addr = free_addr();
    let mut runner = Runner::start_with_env(
        &[("WASMJOBS_TEST_PANIC_ONCE", &FAILING.join(","))],
        &redis.url(),
        plugins.path(),
        &["--metrics-addr", &addr, "--web", "127.0.0.1:0"],
    );
    runner.wait_running();
    let restarts = |metrics: &str, service: &str| {
        sample(
            metrics,
            &format!("wasmjobs_service_restarts_total{{service=\"{service}\"}}"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = http_get(&addr, "/metrics");
        if FAILING.iter().all(|service| restarts(&metrics, service) == Some(1.0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every failed service restarted once:\n{metrics}\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for service in FAILING {
        assert!(
            runner.log().contains(&format!(
                "background service {service} panicked: fault injected into {service}"
            )),
            "{}",
            runner.log()
        );
    }

    // The restarted heartbeat beats: the process stays registered and
    // its beat moves on.
    let identity = wasmjobs_e2e::runner::identity_of(&mut conn, runner.pid(), || runner.log()).await;
    let beat = |conn: &mut redis::aio::MultiplexedConnection| {
        let identity = identity.clone();
        let mut conn = conn.clone();
        async move {
            let beat: Option<f64> = conn.hget(&identity, "beat").await.expect("HGET beat");
            beat.expect("the process's beat")
        }
    };
    let first = beat(&mut conn).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while beat(&mut conn).await <= first {
        assert!(
            Instant::now() < deadline,
            "the heartbeat did not beat again:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
    assert_eq!(processes, vec![identity.clone()]);

    // The restarted dashboard answers on the address it announced.
    let web = runner
        .log()
        .lines()
        .find_map(|line| Some(line.split("listening on http://").nth(1)?.trim().to_owned()))
        .expect("the dashboard's address");
    assert!(
        http_get(&web, "/api/overview").contains("processed"),
        "{}",
        runner.log()
    );

    // The restarted reloader still loads a plugin added now.
    wasmjobs_e2e::copy_plugin(&wasmjobs_e2e::test_guests_dir().join("chaos"), plugins.path());
    runner.wait_for_log("plugin added", Duration::from_secs(60));
    push(&mut conn, "NoopJob", "default", vec![json!([])]).await;
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success(), "{}", runner.log());
}
