//! Cluster-wide rate and concurrency limits (`docs/limits.md`) end to end:
//! one real redis-server, three real `wasmjobs run` processes sharing it,
//! and the chaos guest's `span` mode, which appends `start KEY JID MS` and
//! `end KEY JID MS` (wall-clock ms) to a file every process writes to, so
//! the test sees when each job really ran.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs_e2e::cli::wasmjobs_in;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, int, plugins, push};

/// One job run as the guest saw it.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub(crate) key: String,
    pub(crate) jid: String,
    start: u64,
    end: Option<u64>,
}

/// The lines of `file` that are complete: a guest may be writing the last
/// one as it is read (one test failed on a read of `"e"`, the first byte of
/// an `end` line), and it is read whole next time.
fn complete_lines(file: &Path) -> Vec<String> {
    let text = std::fs::read(file).unwrap_or_default();
    let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
    String::from_utf8_lossy(&text[..end])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The spans recorded in `file`, in start order.
pub(crate) fn spans(file: &Path) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    let mut open: HashMap<String, usize> = HashMap::new();
    for line in complete_lines(file) {
        let parts: Vec<&str> = line.split(' ').collect();
        let [what, key, jid, ms] = parts[..] else {
            panic!("bad span line {line:?}")
        };
        let ms: u64 = ms.parse().expect("ms");
        match what {
            "start" => {
                open.insert(jid.to_owned(), spans.len());
                spans.push(Span {
                    key: key.to_owned(),
                    jid: jid.to_owned(),
                    start: ms,
                    end: None,
                });
            }
            "end" => {
                let index = open.remove(jid).unwrap_or_else(|| panic!("end without start: {line}"));
                spans[index].end = Some(ms);
            }
            other => panic!("bad span line {other:?}"),
        }
    }
    spans.sort_by_key(|s| s.start);
    spans
}

/// Most spans running at one instant (an end at the same ms as a start
/// does not overlap it).
pub(crate) fn max_overlap<'a>(spans: impl Iterator<Item = &'a Span>) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for span in spans {
        events.push((span.start, 1));
        events.push((span.end.unwrap_or(u64::MAX), -1));
    }
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    most as usize
}

/// A plugins directory with the chaos guest and `limits` appended to its manifest.
pub(crate) fn chaos_with(limits: &str) -> tempfile::TempDir {
    let dir = plugins(&[], &["chaos"]);
    wasmjobs_e2e::append_to_manifest(&dir.path().join("chaos"), limits);
    dir
}

/// Waits until `file` shows `n` finished jobs (distinct jids).
pub(crate) async fn wait_ended(file: &Path, n: usize, timeout: Duration, runners: &[Runner]) {
    let deadline = Instant::now() + timeout;
    loop {
        let ended = spans(file)
            .iter()
            .filter(|s| s.end.is_some())
            .map(|s| s.jid.clone())
            .collect::<std::collections::HashSet<_>>()
            .len();
        if ended >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {ended} of {n} jobs ended in {timeout:?}:\n{}",
            runners.iter().map(Runner::log).collect::<Vec<_>>().join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the Prometheus sample `name{labels}` (exact label text), 0 if absent.
pub(crate) fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Pushes `n` chaos `span` jobs recording into `file`; returns the jids.
async fn push_spans(conn: &mut redis::aio::MultiplexedConnection, file: &str, n: usize) -> Vec<String> {
    push(
        conn,
        "ChaosJob",
        "default",
        (0..n).map(|_| json!(["span", file, "r", 0])).collect(),
    )
    .await
}

/// Most of `starts` (ms) in any window `[t, t + 1 s)`.
fn busiest_second(starts: &[u64]) -> usize {
    starts
        .iter()
        .map(|&from| starts.iter().filter(|&&t| t >= from && t < from + 1_000).count())
        .max()
        .unwrap_or(0)
}

/// The starts the limiter gave, read from its own log while the jobs run.
///
/// The log (`wasmjobs:limit:<plugin>:rate`, a sorted set of start times in
/// ms) keeps one window and the starts given ahead, so reading it every
/// 300 ms sees every start. It is the limiter's promise, exact to the
/// millisecond; the guests' clock readings add the scheduler's wake-up
/// jitter on a loaded two-core machine.
struct LimiterLog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: std::thread::JoinHandle<HashMap<String, u64>>,
}

impl LimiterLog {
    fn watch(redis_url: &str, plugin: &str) -> Self {
        let client = redis::Client::open(redis_url).expect("redis URL");
        let key = format!("wasmjobs:limit:{plugin}:rate");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let reader = std::thread::spawn(move || {
            let mut conn = client.get_connection().expect("connect");
            let mut seen = HashMap::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let log: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(&mut conn)
                    .expect("ZRANGE");
                seen.extend(log.into_iter().map(|(member, ms)| (member, ms as u64)));
                std::thread::sleep(Duration::from_millis(300));
            }
            seen
        });
        Self { stop, reader }
    }

    /// Every start seen, in order.
    fn starts(self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut starts: Vec<u64> = self.reader.join().expect("log reader").into_values().collect();
        starts.sort_unstable();
        starts
    }
}

/// Three runners on `dir`, each with its metrics endpoint.
fn three_runners(redis: &TestRedis, dir: &Path, extra: &[&str]) -> (Vec<Runner>, Vec<String>) {
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let mut runners: Vec<Runner> = addrs
        .iter()
        .map(|addr| {
            let mut args = vec!["--poll-interval", "0.1", "--metrics-addr", addr];
            args.extend_from_slice(extra);
            Runner::start(&redis.url(), dir, &args)
        })
        .collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    (runners, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_for_every_sliding_second_across_three_processes() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = chaos_with("[limits]\nrate = \"20/s\"");
    let file = dir.path().join("chaos/data/rate.log");
    // 300 slots and room to park: every job is held at once, 200 are
    // admitted for a start within the 10 s horizon, the rest are refused
    // and sent back to `schedule` for their turn.
    let (mut runners, addrs) = three_runners(&redis, dir.path(), &["--concurrency", "50"]);

    let log = LimiterLog::watch(&redis.url(), "chaos");
    let pushed = Instant::now();
    let jids = push_spans(&mut conn, "rate.log", 300).await;
    wait_ended(&file, 300, Duration::from_secs(180), &runners).await;
    let took = pushed.elapsed();
    let logged = log.starts();

    let spans = spans(&file);
    let ran: std::collections::HashSet<&str> = spans.iter().map(|s| s.jid.as_str()).collect();
    assert!(jids.iter().all(|j| ran.contains(j.as_str())), "every job ran");
    assert!(
        took >= Duration::from_millis(14_000),
        "300 jobs at 20/s took only {took:?}"
    );
    let starts: Vec<u64> = spans.iter().map(|s| s.start).collect();
    let busiest = busiest_second(&logged);
    eprintln!(
        "300 jobs at 20/s over 3 processes: {took:?}; busiest second: {busiest} starts in the limiter's log, {} by the guests' clocks",
        busiest_second(&starts)
    );
    assert!(logged.len() >= 300, "the log showed {} of 300 starts", logged.len());
    assert!(busiest <= 20, "the limiter gave {busiest} starts within one second");
    assert!(
        starts[starts.len() - 1] - starts[0] >= 14_000,
        "the 300 starts spread over only {} ms",
        starts[starts.len() - 1] - starts[0]
    );

    // Refusals are rescheduled, not failures; Redis, /metrics and `stats` agree.
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    let overrated: u64 = conn.hget("wasmjobs:limit:chaos:overrated", "rate").await.expect("HGET");
    assert!(overrated > 0, "some jobs must have been over the limit");
    let mut counted = 0.0;
    let mut waited_long = 0.0;
    for addr in &addrs {
        let metrics = http_get(addr, "/metrics");
        counted += sample(
            &metrics,
            "wasmjobs_limit_rescheduled_total{plugin=\"chaos\",reason=\"rate\"}",
        );
        let series = |le: &str| {
            sample(
                &metrics,
                &format!(
                    "wasmjobs_job_queue_latency_seconds_bucket{{class=\"ChaosJob\",version=\"{}\",le=\"{le}\"}}",
                    version(&metrics)
                ),
            )
        };
        waited_long += series("+Inf") - series("5");
    }
    assert_eq!(counted as u64, overrated, "each refusal is counted once");
    assert!(
        waited_long >= 1.0,
        "the last jobs waited ≥ 9 s since their enqueue: the queue latency must show it"
    );
    let stats = wasmjobs_in(
        dir.path(),
        &["stats", "--redis", &redis.url(), "--json"],
        &[] as &[(&str, &str)],
        Duration::from_secs(30),
    );
    assert!(stats.status.success());
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    let chaos = &stats["limits"]["plugins"][0];
    assert_eq!(chaos["plugin"], "chaos", "{stats}");
    assert_eq!(chaos["overrated_rate"].as_u64(), Some(overrated), "{stats}");
    // `wasmjobs limits` shows the same table on its own.
    let limits = wasmjobs_in(
        dir.path(),
        &["limits", "--redis", &redis.url(), "--json"],
        &[] as &[(&str, &str)],
        Duration::from_secs(30),
    );
    assert!(limits.status.success());
    let limits: Value = serde_json::from_slice(&limits.stdout).expect("limits JSON");
    assert_eq!(limits["plugins"][0]["plugin"], "chaos", "{limits}");
    assert_eq!(
        limits["plugins"][0]["overrated_rate"].as_u64(),
        Some(overrated),
        "{limits}"
    );
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
}

/// The plugin version in a runner's metrics (one version loaded).
fn version(metrics: &str) -> String {
    let at = metrics
        .find("class=\"ChaosJob\",version=\"")
        .expect("ChaosJob in /metrics")
        + "class=\"ChaosJob\",version=\"".len();
    metrics[at..].split('"').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_concurrency_holds_across_three_processes_and_spares_other_keys() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = chaos_with("[limits.per_key]\nkey = \"args.2\"\nconcurrency = 2");
    let file = dir.path().join("chaos/data/conc.log");
    let (mut runners, _) = three_runners(&redis, dir.path(), &["--concurrency", "10"]);

    let mut jobs = Vec::new();
    for i in 0..12 {
        jobs.push(json!(["span", "conc.log", "a", 300]));
        if i % 2 == 0 {
            jobs.push(json!(["span", "conc.log", "b", 300]));
            jobs.push(json!(["span", "conc.log", "c", 300]));
        }
    }
    push(&mut conn, "ChaosJob", "default", jobs).await;
    wait_ended(&file, 24, Duration::from_secs(120), &runners).await;

    let spans = spans(&file);
    let by_key: BTreeMap<&str, Vec<&Span>> = spans.iter().fold(BTreeMap::new(), |mut map, s| {
        map.entry(s.key.as_str()).or_insert_with(Vec::new).push(s);
        map
    });
    for (key, spans) in &by_key {
        let most = max_overlap(spans.iter().copied());
        assert!(most <= 2, "{most} jobs of key {key} ran at once: {spans:?}");
    }
    assert_eq!(max_overlap(by_key["a"].iter().copied()), 2, "key a used its 2 slots");
    let together = max_overlap(spans.iter());
    assert!(
        together >= 4,
        "other keys ran beside key a (at most {together} at once)"
    );
    assert_eq!(int(&mut conn, "stat:failed").await, 0);

    // Every lease is released when its job ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = conn.keys("wasmjobs:limit:chaos:key:*:leases").await.expect("KEYS");
        let mut held = 0u64;
        for key in &keys {
            held += conn.zcard::<_, u64>(key).await.expect("ZCARD");
        }
        if held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{held} leases still held after every job ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_frees_its_leases_within_its_heartbeat_expiry() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = chaos_with("[limits.per_key]\nkey = \"args.2\"\nconcurrency = 2");
    let file = dir.path().join("chaos/data/kill.log");

    // A takes both slots of key k with jobs that would run for ten minutes
    // (and, with two slots of its own, no other job).
    let mut holder = Runner::start(
        &redis.url(),
        dir.path(),
        &["--concurrency", "2", "--poll-interval", "0.1"],
    );
    holder.wait_running();
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![json!(["span", "kill.log", "k", 600_000]); 2],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while spans(&file).len() < 2 {
        assert!(Instant::now() < deadline, "{}", holder.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leases: Vec<String> = conn.keys("wasmjobs:limit:chaos:key:*:leases").await.expect("KEYS");
    assert_eq!(leases.len(), 1);
    assert_eq!(conn.zcard::<_, u64>(&leases[0]).await.expect("ZCARD"), 2);

    // Two more processes; A's jobs, once recovered, are buried (so they
    // do not take the key again), and the short ones wait for key k.
    let mut others: Vec<Runner> = (0..2)
        .map(|_| {
            Runner::start(
                &redis.url(),
                dir.path(),
                &["--concurrency", "5", "--poll-interval", "0.1", "--max-recoveries", "0"],
            )
        })
        .collect();
    for runner in &mut others {
        runner.wait_running();
    }
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![json!(["span", "kill.log", "k", 50]); 3],
    )
    .await;
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![json!(["span", "kill.log", "other", 50]); 2],
    )
    .await;
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64
    };
    holder.signal("KILL");
    holder.wait(Duration::from_secs(10));
    let killed_at = now_ms();

    // Other keys are not held up.
    wait_ended(&file, 2, Duration::from_secs(10), &others).await;
    // Key k's jobs run once A's leases expire.
    wait_ended(&file, 5, Duration::from_secs(90), &others).await;
    let spans = spans(&file);
    let short_k: Vec<&Span> = spans.iter().filter(|s| s.key == "k" && s.end.is_some()).collect();
    assert_eq!(short_k.len(), 3, "{spans:?}");
    let first = short_k.iter().map(|s| s.start).min().unwrap_or(0);
    let heartbeat_expiry = 60_000;
    eprintln!(
        "key k ran again {} ms after its holder was killed",
        first as i64 - killed_at as i64
    );
    assert!(
        first <= killed_at + heartbeat_expiry + 10_000,
        "key k stayed locked {} ms after its holder died",
        first.saturating_sub(killed_at)
    );
    // Renewed every 10 s for 30 s: the leases outlive the kill by ≥ 20 s.
    assert!(
        first >= killed_at + 15_000,
        "key k ran {} ms after the kill, while its leases were still valid",
        first as i64 - killed_at as i64
    );
    assert!(max_overlap(spans.iter().filter(|s| s.key == "k" && s.end.is_some())) <= 2);
    for runner in &mut others {
        assert!(runner.stop().success(), "{}", runner.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_jobs_wait_for_their_turn_and_exit_when_empty_waits_for_them() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = chaos_with("[limits]\nrate = \"5/s\"");
    let file = dir.path().join("chaos/data/turns.log");
    let log = LimiterLog::watch(&redis.url(), "chaos");
    let jids = push_spans(&mut conn, "turns.log", 100).await;
    // The default poll interval; the processes hold every job at once, so
    // half are admitted for a start within the 10 s horizon and half are
    // sent back to `schedule` for their turn, to come back through the
    // poller.
    let mut runners: Vec<Runner> = (0..2)
        .map(|_| Runner::start(&redis.url(), dir.path(), &["--concurrency", "50", "--exit-when-empty"]))
        .collect();
    for runner in &mut runners {
        let status = runner.wait(Duration::from_secs(180));
        assert!(status.success(), "{}", runner.log());
    }
    let logged = log.starts();

    let spans = spans(&file);
    let ran: std::collections::HashSet<&str> = spans.iter().map(|s| s.jid.as_str()).collect();
    let missing = jids.iter().filter(|j| !ran.contains(j.as_str())).count();
    assert_eq!(
        missing,
        0,
        "--exit-when-empty stopped with {missing} of 100 limited jobs not run:\n{}",
        runners.iter().map(Runner::log).collect::<Vec<_>>().join("\n----\n")
    );
    assert_eq!(spans.len(), 100, "each job ran once");
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    let starts: Vec<u64> = spans.iter().map(|s| s.start).collect();
    let busiest = busiest_second(&logged);
    let overrated: u64 = conn
        .hget::<_, _, Option<u64>>("wasmjobs:limit:chaos:overrated", "rate")
        .await
        .expect("HGET")
        .unwrap_or(0);
    eprintln!(
        "100 jobs at 5/s, 2 processes: starts over {} ms, busiest second {busiest} in the limiter's log, {} by the guests' clocks, {overrated} refusals",
        starts[starts.len() - 1] - starts[0],
        busiest_second(&starts)
    );
    assert!(logged.len() >= 100, "the log showed {} of 100 starts", logged.len());
    assert!(busiest <= 5, "the limiter gave {busiest} starts within one second");
    assert!(
        overrated >= 40,
        "half the jobs must have waited in schedule, {overrated} did"
    );
    assert!(
        overrated <= 100,
        "{overrated} refusals for 100 jobs: a job sent back for its turn must run when it comes back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reserved_by_a_job_stopped_at_shutdown_is_given_back() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = chaos_with("[limits]\nrate = \"1/8s\"");
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--timeout", "0.5"]);
    runner.wait_running();
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![
            json!(["span", "given.log", "g", 0]),
            json!(["span", "given.log", "g", 0]),
        ],
    )
    .await;
    // The first job starts, the second is admitted for a start 8 s later
    // and waits for it in the process.
    let log = "wasmjobs:limit:chaos:rate";
    let deadline = Instant::now() + Duration::from_secs(30);
    while conn.zcard::<_, u64>(log).await.expect("ZCARD") < 2 {
        assert!(
            Instant::now() < deadline,
            "the second start was never reserved:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(runner.stop().success(), "{}", runner.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    while conn.zcard::<_, u64>(log).await.expect("ZCARD") != 1 {
        assert!(
            Instant::now() < deadline,
            "the stopped job's start was not given back: {:?}\n{}",
            conn.zrange_withscores::<_, Vec<(String, f64)>>(log, 0, -1).await,
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queued: u64 = conn.llen("queue:default").await.expect("LLEN");
    assert_eq!(queued, 1, "the waiting job goes back to its queue:\n{}", runner.log());
}
