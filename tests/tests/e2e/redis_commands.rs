//! `wasmjobs enqueue` and `wasmjobs stats`, run as a user would, against a
//! real `redis-server` (one per test), the embedded one, and Sidekiq's own
//! Ruby client and API on the other side of the same Redis.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use wasmjobs_e2e::cli::Killed;
use wasmjobs_e2e::output_text as text;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::sidekiq::ruby;

/// The `wasmjobs` binary under test.
///
/// Cargo builds a package's binaries (fresh, in the same profile) for its
/// own integration tests only, so this package has the `wasmjobs-under-test`
/// bin target: `runtime/src/main.rs` again. It sits next to this test's
/// executable (`target/<profile>/`, above `deps/`), and cargo hands us its
/// path.
const WASMJOBS: &str = env!("CARGO_BIN_EXE_wasmjobs-under-test");

/// `wasmjobs ARGS` with a private data dir and no Redis settings from the
/// environment.
fn wasmjobs(data_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(WASMJOBS);
    command
        .env_remove("REDIS_URL")
        .env_remove("WASMJOBS_DATA_DIR")
        .env_remove("RUST_LOG")
        .arg("--data-dir")
        .arg(data_dir)
        .args(args);
    command
}

/// Runs `command` and asserts success.
fn ok(mut command: Command) -> Output {
    let output = command.output().expect("run wasmjobs");
    assert!(output.status.success(), "{command:?} failed: {}", text(&output));
    output
}

/// Runs `command` and asserts exit status 2 (usage or setup error).
fn fails(mut command: Command) -> String {
    let output = command.output().expect("run wasmjobs");
    assert_eq!(output.status.code(), Some(2), "{command:?}: {}", text(&output));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `wasmjobs enqueue --redis URL ARGS`.
fn enqueue(redis: &TestRedis, args: &[&str]) -> Command {
    let data = std::env::temp_dir();
    let mut command = wasmjobs(&data, &["enqueue", "--redis", &redis.url()]);
    command.args(args);
    command
}

/// `wasmjobs stats --json` against `url`, parsed.
fn stats_json(url: &str) -> Value {
    let output = ok(wasmjobs(&std::env::temp_dir(), &["stats", "--json", "--redis", url]));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stats --json is not JSON ({e}): {}", text(&output)))
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

async fn query<T: redis::FromRedisValue>(redis: &TestRedis, command: &mut redis::Cmd) -> T {
    let mut conn = redis.conn().await;
    command.query_async(&mut conn).await.expect("redis command")
}

#[tokio::test]
async fn enqueue_writes_sidekiqs_layout() {
    let redis = TestRedis::start();
    let before = now();
    let output = ok(enqueue(
        &redis,
        &["--queue", "critical", "EchoJob", r#"[1, "two", {"k": null}]"#],
    ));
    let line = stdout(&output);
    assert!(
        line.starts_with("enqueued job EchoJob on queue critical (jid "),
        "{line}"
    );

    let queues: Vec<String> = query(&redis, redis::cmd("SMEMBERS").arg("queues")).await;
    assert_eq!(queues, ["critical"]);
    let jobs: Vec<String> = query(&redis, redis::cmd("LRANGE").arg("queue:critical").arg(0).arg(-1)).await;
    assert_eq!(jobs.len(), 1);
    let job: Value = serde_json::from_str(&jobs[0]).expect("payload is JSON");
    assert_eq!(job["class"], "EchoJob");
    assert_eq!(job["args"], serde_json::json!([1, "two", {"k": null}]));
    assert_eq!(job["queue"], "critical");
    assert_eq!(job["retry"], true);
    let jid = job["jid"].as_str().expect("jid");
    assert_eq!(jid.len(), 24);
    assert!(line.contains(jid), "{line}");
    let created = job["created_at"].as_f64().expect("created_at in float seconds");
    let enqueued = job["enqueued_at"].as_f64().expect("enqueued_at in float seconds");
    assert!(
        created >= before - 1.0 && created <= enqueued && enqueued <= now() + 1.0,
        "{job}"
    );

    ok(enqueue(&redis, &["--retry", "3", "X"]));
    ok(enqueue(&redis, &["--retry", "false", "X"]));
    let jobs: Vec<String> = query(&redis, redis::cmd("LRANGE").arg("queue:default").arg(0).arg(-1)).await;
    let retries: Vec<Value> = jobs
        .iter()
        .map(|j| serde_json::from_str::<Value>(j).expect("JSON")["retry"].clone())
        .collect();
    assert_eq!(retries, [Value::Bool(false), Value::from(3)], "newest first");
}

#[tokio::test]
async fn enqueue_count_pushes_distinct_jids_fast() {
    let redis = TestRedis::start();
    let started = Instant::now();
    let output = ok(enqueue(&redis, &["--count", "10000", "NoopJob", "[7]"]));
    let took = started.elapsed();
    eprintln!("enqueue --count 10000 took {took:?} (process start included)");
    assert_eq!(stdout(&output).trim(), "enqueued 10000 jobs NoopJob on queue default");
    let jobs: Vec<String> = query(&redis, redis::cmd("LRANGE").arg("queue:default").arg(0).arg(-1)).await;
    assert_eq!(jobs.len(), 10_000);
    let jids: HashSet<String> = jobs
        .iter()
        .map(|j| {
            serde_json::from_str::<Value>(j).expect("JSON")["jid"]
                .as_str()
                .expect("jid")
                .to_owned()
        })
        .collect();
    assert_eq!(jids.len(), 10_000, "jids must be distinct");
}

#[tokio::test]
async fn enqueue_in_and_at_schedule_the_job() {
    let redis = TestRedis::start();
    let before = now();
    let line = stdout(&ok(enqueue(&redis, &["--in", "60", "LaterJob"])));
    assert!(
        line.starts_with("scheduled job LaterJob on queue default for "),
        "{line}"
    );
    let scheduled: Vec<(String, f64)> = query(
        &redis,
        redis::cmd("ZRANGE").arg("schedule").arg(0).arg(-1).arg("WITHSCORES"),
    )
    .await;
    assert_eq!(scheduled.len(), 1);
    let (payload, score) = &scheduled[0];
    assert!(
        (score - (before + 60.0)).abs() < 5.0,
        "score {score}, expected about {}",
        before + 60.0
    );
    let job: Value = serde_json::from_str(payload).expect("JSON");
    assert_eq!(job["class"], "LaterJob");
    assert!(
        job.get("enqueued_at").is_none(),
        "a scheduled job is not enqueued yet: {job}"
    );
    let queued: u64 = query(&redis, redis::cmd("LLEN").arg("queue:default")).await;
    assert_eq!(queued, 0);

    ok(enqueue(
        &redis,
        &["--at", "2099-01-01T00:00:00Z", "--count", "3", "AtJob"],
    ));
    ok(enqueue(&redis, &["--at", "4102444800.5", "EpochJob"]));
    let at: Vec<(String, f64)> = query(
        &redis,
        redis::cmd("ZRANGEBYSCORE")
            .arg("schedule")
            .arg(4_070_908_800u64)
            .arg("+inf")
            .arg("WITHSCORES"),
    )
    .await;
    let scores: Vec<f64> = at.iter().map(|(_, score)| *score).collect();
    assert_eq!(
        scores,
        [4_070_908_800.0, 4_070_908_800.0, 4_070_908_800.0, 4_102_444_800.5]
    );

    // A time in the past enqueues now, as Sidekiq's client does.
    ok(enqueue(&redis, &["--at", "2001-01-01T00:00:00Z", "PastJob"]));
    let queued: u64 = query(&redis, redis::cmd("LLEN").arg("queue:default")).await;
    assert_eq!(queued, 1);

    let err = fails(enqueue(&redis, &["--in", "5", "--at", "2099-01-01T00:00:00Z", "X"]));
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(enqueue(&redis, &["--at", "next tuesday", "X"]));
    assert!(err.contains("RFC 3339"), "{err}");
}

#[tokio::test]
async fn bad_args_json_is_a_clear_error() {
    let redis = TestRedis::start();
    let err = fails(enqueue(&redis, &["X", r#"{"a": 1}"#]));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("job args must be a JSON array"), "{err}");
    let err = fails(enqueue(&redis, &["X", "[1,"]));
    assert!(err.contains("job args are not valid JSON"), "{err}");
    let err = fails(enqueue(&redis, &["--count", "0", "X"]));
    assert!(err.contains("--count"), "{err}");
    let keys: Vec<String> = query(&redis, redis::cmd("KEYS").arg("*")).await;
    assert!(keys.is_empty(), "nothing may be pushed: {keys:?}");
}

#[tokio::test]
async fn stats_agree_with_redis_and_prune_dead_processes() {
    let mut redis = TestRedis::start();
    ok(enqueue(&redis, &["--count", "3", "A"]));
    ok(enqueue(&redis, &["--count", "2", "--queue", "critical", "B"]));
    ok(enqueue(&redis, &["--in", "100", "C"]));
    let now = now();
    // A Sidekiq 8 job (millisecond timestamps) waiting for 100 s.
    let old = format!(
        r#"{{"class":"D","args":[],"jid":"0123456789abcdef01234567","queue":"ms","created_at":{ms},"enqueued_at":{ms}}}"#,
        ms = ((now - 100.0) * 1000.0) as u64
    );
    let info = r#"{"hostname":"box","started_at":1764500000.5,"pid":4242,"tag":"app","concurrency":10,"queues":["default","critical"],"identity":"box:4242:abc","version":"6.4.1"}"#;
    let mut conn = redis.conn().await;
    let () = redis::pipe()
        .cmd("SADD")
        .arg("queues")
        .arg("ms")
        .ignore()
        .cmd("LPUSH")
        .arg("queue:ms")
        .arg(&old)
        .ignore()
        .cmd("ZADD")
        .arg("retry")
        .arg(now + 30.0)
        .arg(r#"{"class":"R","args":[],"jid":"r1"}"#)
        .ignore()
        .cmd("ZADD")
        .arg("retry")
        .arg(now + 60.0)
        .arg(r#"{"class":"R","args":[],"jid":"r2"}"#)
        .ignore()
        .cmd("ZADD")
        .arg("dead")
        .arg(now)
        .arg(r#"{"class":"Z","args":[],"jid":"d1"}"#)
        .ignore()
        .cmd("SET")
        .arg("stat:processed")
        .arg(100)
        .ignore()
        .cmd("SET")
        .arg("stat:failed")
        .arg(7)
        .ignore()
        .cmd("SET")
        .arg("wasmjobs:stat:discarded")
        .arg(3)
        .ignore()
        .cmd("SADD")
        .arg("processes")
        .arg("box:4242:abc")
        .arg("box:9:gone")
        .ignore()
        .cmd("HSET")
        .arg("box:4242:abc")
        .arg("info")
        .arg(info)
        .arg("busy")
        .arg(2)
        .arg("beat")
        .arg(now)
        .arg("quiet")
        .arg("false")
        .arg("rss")
        .arg(51_200)
        .arg("rtt_us")
        .arg(87)
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("seed redis");

    let stats = stats_json(&redis.url());
    assert_eq!(stats["processed"], 100);
    assert_eq!(stats["failed"], 7);
    assert_eq!(stats["discarded"], 3);
    assert_eq!(stats["scheduled"], 1);
    assert_eq!(stats["retries"], 2);
    assert_eq!(stats["dead"], 1);
    assert_eq!(stats["enqueued"], 6);
    let queues: Vec<(String, u64, f64)> = stats["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| {
            (
                q["name"].as_str().expect("name").to_owned(),
                q["size"].as_u64().expect("size"),
                q["latency_secs"].as_f64().expect("latency"),
            )
        })
        .collect();
    let names: Vec<&str> = queues.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names, ["critical", "default", "ms"]);
    assert_eq!((queues[0].1, queues[1].1, queues[2].1), (2, 3, 1));
    assert!(queues[1].2 < 30.0, "{queues:?}");
    assert!((queues[2].2 - 100.0).abs() < 30.0, "{queues:?}");

    let processes = stats["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{processes:?}");
    let p = &processes[0];
    assert_eq!(p["identity"], "box:4242:abc");
    assert_eq!(
        (p["pid"].as_u64(), p["busy"].as_u64(), p["concurrency"].as_u64()),
        (Some(4242), Some(2), Some(10))
    );
    assert_eq!(
        (p["tag"].as_str(), p["quiet"].as_bool(), p["rss_kb"].as_u64()),
        (Some("app"), Some(false), Some(51_200))
    );
    assert_eq!(p["queues"], serde_json::json!(["default", "critical"]));
    let members: Vec<String> = query(&redis, redis::cmd("SMEMBERS").arg("processes")).await;
    assert_eq!(members, ["box:4242:abc"], "a process without a heartbeat is pruned");

    let human = stdout(&ok(wasmjobs(
        &std::env::temp_dir(),
        &["stats", "--redis", &redis.url()],
    )));
    assert!(human.contains("processed 100   failed 7   discarded 3"), "{human}");
    assert!(human.contains("enqueued 6   scheduled 1   retry 2   dead 1"), "{human}");
    assert!(human.contains("box:4242:abc"), "{human}");

    // The AOF keeps it all across a clean restart.
    redis.restart();
    let again = stats_json(&redis.url());
    assert_eq!(
        (again["enqueued"].as_u64(), again["retries"].as_u64()),
        (Some(6), Some(2))
    );
}

/// Whether any process's command line mentions `path`.
fn process_mentions(path: &Path) -> bool {
    let needle = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .any(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(&needle))
}

/// `wasmjobs stats --json` on the embedded server of `data_dir`, parsed.
fn embedded_stats(data_dir: &Path) -> Value {
    let output = ok(wasmjobs(data_dir, &["stats", "--json"]));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stats --json is not JSON ({e}): {}", text(&output)))
}

#[test]
fn the_embedded_server_keeps_jobs_between_commands_and_stops() {
    let data = tempfile::tempdir().expect("tempdir");
    let data_dir = data.path().join("data");
    let socket = data_dir.join("redis/redis.sock");
    for class in ["First", "Second"] {
        let line = stdout(&ok(wasmjobs(&data_dir, &["enqueue", class])));
        assert!(
            line.starts_with(&format!("enqueued job {class} on queue default")),
            "{line}"
        );
        assert!(!socket.exists(), "the server must stop after the last command");
        assert!(
            !process_mentions(&data_dir),
            "a redis-server for {} still runs",
            data_dir.display()
        );
    }
    let stats = embedded_stats(&data_dir);
    assert_eq!(stats["enqueued"], 2, "{stats}");
    assert!(!socket.exists());
    assert!(!process_mentions(&data_dir));
    assert!(data_dir.join("redis/appendonlydir").is_dir());
}

/// `wasmjobs run` on the embedded server stops it on the way out, even
/// when another process holds the server's start lock just then (starting
/// or stopping it): the runner waits its turn instead of leaving the server
/// running with nobody to stop it.
#[test]
fn run_on_the_embedded_server_stops_it_when_done() {
    let data = tempfile::tempdir().expect("tempdir");
    let data_dir = data.path().join("data");
    let socket = data_dir.join("redis/redis.sock");
    ok(wasmjobs(&data_dir, &["enqueue", "--count", "50", "NoopJob"]));
    let plugins = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let mut command = wasmjobs(&data_dir, &["run", "--plugins"]);
    command
        .arg(plugins.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(data.path().join("run.log")).expect("log file"));
    let mut runner = command.spawn().expect("start wasmjobs run");
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stats = embedded_stats(&data_dir);
        if stats["processed"] == 50 {
            break;
        }
        assert!(Instant::now() < deadline, "the jobs did not run: {stats}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let start_lock = std::fs::File::options()
        .write(true)
        .open(data_dir.join("redis/start.lock"))
        .expect("open start.lock");
    start_lock.lock().expect("lock start.lock");
    let pid = i32::try_from(runner.id()).expect("pid");
    // SAFETY: signalling the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(socket.exists(), "nobody could stop the server while the lock was held");
    drop(start_lock);

    let status = runner.wait().expect("wait for wasmjobs run");
    let log = std::fs::read_to_string(data.path().join("run.log")).unwrap_or_default();
    assert!(status.success(), "{status}: {log}");
    assert!(!socket.exists(), "{log}");
    assert!(
        !process_mentions(&data_dir),
        "a redis-server for {} still runs",
        data_dir.display()
    );
    let stats = embedded_stats(&data_dir);
    assert_eq!(stats["processed"], 50, "{stats}");
    assert_eq!(stats["enqueued"], 0, "{stats}");
}

#[test]
fn a_missing_redis_server_gives_the_install_hint() {
    let data = tempfile::tempdir().expect("tempdir");
    let empty_path = data.path().join("bin");
    std::fs::create_dir(&empty_path).expect("empty PATH dir");
    let mut command = wasmjobs(&data.path().join("data"), &["stats"]);
    command.env("PATH", &empty_path);
    let err = fails(command);
    assert_eq!(
        err.trim(),
        "error: redis-server is not installed: install it (apt-get install redis-server) or pass --redis URL"
    );
}

#[tokio::test]
async fn stats_see_a_job_pushed_by_sidekiqs_ruby_client() {
    let redis = TestRedis::start();
    let jid = ruby(
        &redis.url(),
        r#"puts Sidekiq::Client.push("class" => "NoopJob", "args" => [1])"#,
    );
    assert_eq!(jid.lines().last().map(str::len), Some(24), "{jid}");
    let stats = stats_json(&redis.url());
    assert_eq!(stats["enqueued"], 1, "{stats}");
    assert_eq!(stats["queues"][0]["name"], "default");
    assert!(
        stats["queues"][0]["latency_secs"]
            .as_f64()
            .is_some_and(|l| (0.0..30.0).contains(&l)),
        "{stats}"
    );
}

#[tokio::test]
async fn sidekiqs_ruby_api_sees_what_wasmjobs_enqueued() {
    let redis = TestRedis::start();
    ok(enqueue(&redis, &["EchoJob", r#"["hi", 2]"#]));
    ok(enqueue(&redis, &["--in", "600", "LaterJob"]));
    let seen = ruby(
        &redis.url(),
        r#"q = Sidekiq::Queue.new("default"); j = q.first; puts [q.size, j.klass, j.args.inspect, q.latency < 30, Sidekiq::ScheduledSet.new.size, Sidekiq::Stats.new.enqueued].join("|")"#,
    );
    assert_eq!(seen.lines().last(), Some(r#"1|EchoJob|["hi", 2]|true|1|1"#), "{seen}");
}

/// `--help` shows the environment's values of the flags it documents,
/// unless told not to: no password from the environment may show up
/// there (a terminal, a CI log, a support ticket).
#[test]
fn help_never_shows_a_password_from_the_environment() {
    let data = tempfile::tempdir().expect("tempdir");
    for command in [
        "run", "enqueue", "stats", "cancel", "pause", "resume", "schedule", "limits", "web", "env", "migrate",
    ] {
        let mut help = wasmjobs(data.path(), &[command, "--help"]);
        help.env("REDIS_URL", "redis://:hunter2@cache:6379")
            .env("WASMJOBS_SOURCE", "postgres://app:hunter2@db/app")
            .env("WASMJOBS_SHARDS", "b=redis://:hunter2@cache2:6379")
            .env("WASMJOBS_DB", "main=postgres://app:hunter2@db/app");
        let output = help.output().expect("run wasmjobs --help");
        assert!(output.status.success(), "{command} --help: {}", text(&output));
        assert!(
            !text(&output).contains("hunter2"),
            "{command} --help shows a password: {}",
            text(&output)
        );
    }
}

/// The pid in `path`, once the file holds one.
fn pid_in(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether process `pid` is alive (not reaped, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// A runner killed with -9 leaves its embedded redis-server with nobody to
/// stop it; with its data directory deleted too (a removed project, a
/// test's temporary directory), it ran forever — one run of the test suite
/// left seven. Its watchdog now stops it, and itself, once no wasmjobs
/// process holds the server's locks.
#[test]
fn an_embedded_server_whose_users_died_stops_even_with_its_directory_gone() {
    let data = tempfile::tempdir().expect("tempdir");
    let data_dir = data.path().join("data");
    let plugins = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let mut command = wasmjobs(&data_dir, &["run", "--plugins"]);
    command
        .arg(plugins.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut runner = Killed(command.spawn().expect("start wasmjobs run"));
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let (server, watchdog) = loop {
        let server = pid_in(&data_dir.join("redis/redis.pid"));
        let watchdog = pid_in(&data_dir.join("redis/watchdog.pid"));
        if let (Some(server), Some(watchdog)) = (server, watchdog) {
            break (server, watchdog);
        }
        assert!(Instant::now() < deadline, "the embedded redis-server did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(alive(server) && alive(watchdog));
    runner.0.kill().expect("kill -9 the runner");
    runner.0.wait().expect("reap the runner");
    drop(data);
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while alive(server) || alive(watchdog) {
        assert!(
            Instant::now() < deadline,
            "the orphaned redis-server ({server}) or its watchdog ({watchdog}) still runs"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A runner's embedded redis-server that dies under it (killed, OOM)
/// was never started again: every command then failed with "connection
/// refused" until someone restarted the runner. The runner now starts it
/// again, from its append-only file, and goes on.
#[test]
fn a_runner_starts_its_embedded_server_again_when_it_dies() {
    let data = tempfile::tempdir().expect("tempdir");
    let data_dir = data.path().join("data");
    ok(wasmjobs(&data_dir, &["enqueue", "--count", "5", "NoopJob"]));
    let plugins = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let log_path = data.path().join("run.log");
    let mut command = wasmjobs(&data_dir, &["run", "--plugins"]);
    command
        .arg(plugins.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log file"));
    let mut runner = Killed(command.spawn().expect("start wasmjobs run"));
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let wait_processed = |count: u64| {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let stats = embedded_stats(&data_dir);
            if stats["processed"] == count {
                break;
            }
            assert!(Instant::now() < deadline, "the jobs did not run: {stats}\n{}", log());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_processed(5);
    let pid_file = data_dir.join("redis/redis.pid");
    let first = pid_in(&pid_file).expect("the server's pid");
    // SAFETY: signalling the redis-server this test's runner started.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    let second = loop {
        if let Some(pid) = pid_in(&pid_file).filter(|pid| *pid != first && alive(*pid)) {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "nobody started the embedded redis-server again:\n{}",
            log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // Said once the new server answers (its pid file comes first).
    while !log().contains("started it again") {
        assert!(Instant::now() < deadline, "the runner did not say so:\n{}", log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The runner works on the new server: its connections came back.
    ok(wasmjobs(&data_dir, &["enqueue", "--count", "5", "NoopJob"]));
    wait_processed(10);
    let pid = i32::try_from(runner.0.id()).expect("pid");
    // SAFETY: signalling the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = runner.0.wait().expect("wait for wasmjobs run");
    assert!(status.success(), "{status}: {}", log());
    assert!(!alive(second), "the runner stopped the server it started again");
}
