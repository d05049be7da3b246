//! Trust tests: the whole of issue 13 at once. One real `wasmjobs run`
//! process serves 1,000 healthy jobs with hostile ones interleaved — the
//! chaos guest looping, trapping, overflowing its stack and memory,
//! flooding and forging logs, escaping its grant, calling loopback through
//! granted names, holding responses, filling its disk budget and leaving
//! SQLite session state behind. The healthy jobs must all succeed, no
//! hostile job may escape, and the process's RSS must come back within 10%
//! of where it was after a warm-up.
//!
//! The warm-up is healthy jobs, then one round of the hostile jobs and
//! healthy ones again: the first run of each hostile path costs for good
//! (code pages of the binary faulted in, thread stacks touched, mimalloc's
//! retained segments, ~6 MiB on a ~23 MiB process), which is not a leak;
//! the baseline is taken after it, and the 10% bound is on what two more
//! hostile rounds and 1,300 more healthy jobs add. The RSS after the
//! healthy-only warm-up is printed too.
//!
//! RSS is read from `/proc/<pid>/status` (`VmRSS`, and `VmHWM` for the
//! peak), so the test is Linux-only like the runner's own RSS gauge.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, jobs_in_progress, lines, zset};
use wasmjobs_e2e::{copy_plugin, plugins_dir, test_guests_dir};

/// Healthy jobs pushed among the hostile ones.
const HEALTHY: usize = 1_000;
/// Healthy jobs in one round of the warm-up workload.
const WARM_UP: usize = 300;
/// Healthy SQL inserts among the [`HEALTHY`] jobs.
const SQL_INSERTS: usize = 50;
/// How long any phase may take on a loaded 2-core machine.
const PHASE: Duration = Duration::from_secs(300);
/// What a hostile job writes where a manifest could be.
const EVIL_MANIFEST: &str = "component = \"chaos_job.wasm\"\nclasses = [\"HealthyJob\"]\n\
                             [[files]]\nhost = \"/\"\nguest = \"/host\"\nmode = \"rw\"\noutside = true\n";
/// A line a hostile job tries to slip into the runner's log.
const FORGED: &str = "FORGED 2026-01-01T00:00:00Z INFO wasmjobs: job done class=HealthyJob";

/// The SQL grant of the chaos copies here: the run's SQLite database.
const LOCAL: &str = "[\"local\"]";

/// A copy of the chaos guest at `plugins/<name>` serving `class`, with the
/// databases `sql` (a TOML array), an rw `data` grant and `extra`
/// appended to its manifest.
pub(super) fn chaos_plugin(plugins: &Path, name: &str, class: &str, sql: &str, extra: &str) -> PathBuf {
    let dir = plugins.join(name);
    std::fs::create_dir_all(dir.join("data")).expect("plugin and data dirs");
    std::fs::copy(
        test_guests_dir().join("chaos/chaos_job.wasm"),
        dir.join("chaos_job.wasm"),
    )
    .expect("copy component");
    std::fs::write(
        dir.join("wasmjobs.toml"),
        format!(
            "component = \"chaos_job.wasm\"\nclasses = [{class:?}]\nsql = {sql}\n\
             [[files]]\nhost = \"data\"\nguest = \"/data\"\nmode = \"rw\"\n{extra}"
        ),
    )
    .expect("write manifest");
    dir
}

/// A `/proc/<pid>/status` field in KiB.
pub(super) fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The healthy workload used to warm the runner up (and to reuse its
/// buffers at the end): appends to `file` and no-ops.
fn warm_up(file: &str) -> Vec<Payload> {
    let now = wasmjobs::redis::now_f64();
    (0..WARM_UP)
        .map(|i| {
            if i % 3 == 0 {
                Payload::new("NoopJob", vec![json!(i)], "default", now)
            } else {
                Payload::new(
                    "HealthyJob",
                    vec![json!("slow-append"), json!(file), json!(i), json!(0)],
                    "default",
                    now,
                )
            }
        })
        .collect()
}

/// Pushes `payloads` in order, then waits until `stat:processed` reaches
/// `processed` and nothing is queued or in progress.
async fn push_and_drain(conn: &mut MultiplexedConnection, runner: &Runner, payloads: &mut [Payload], processed: u64) {
    client::push_bulk(conn, payloads).await.expect("push jobs");
    let deadline = Instant::now() + PHASE;
    loop {
        let done = int(conn, "stat:processed").await;
        let queued: u64 = conn.llen("queue:default").await.expect("LLEN");
        if done >= processed && queued == 0 && jobs_in_progress(conn).await == 0 {
            assert_eq!(done, processed, "more jobs processed than pushed");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {processed} jobs processed ({queued} queued) in {PHASE:?}:\n{}",
            tail(&runner.log())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last 20,000 bytes of a log, for failure messages.
pub(super) fn tail(log: &str) -> &str {
    let mut start = log.len().saturating_sub(20_000);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}

/// What a hostile job must come to.
enum Expect {
    /// Fails, lands in the dead set (`retry: 0`) with a message containing this.
    Dead(&'static str),
    /// Fails, whatever the message.
    Fails,
    /// May succeed (its damage is checked separately), never retried.
    Contained,
}

/// The hostile jobs: args and what each must come to. `http` is the test
/// server's address, `redis_port` a loopback service no plugin may reach.
fn hostile(http: &str, http_port: u16, redis_port: u16) -> Vec<(Value, Expect)> {
    use Expect::{Contained, Dead, Fails};
    vec![
        // Runaway CPU, memory, stack; traps and panics.
        (json!(["loop"]), Dead("")),
        (json!(["alloc", 64 << 20]), Dead("")),
        (json!(["alloc", 8 << 20]), Contained),
        (json!(["recurse", 100_000_000u64]), Dead("")),
        (json!(["trap"]), Dead("")),
        (json!(["panic", "hostile panic"]), Dead("hostile panic")),
        // Item 5: log floods and forged lines.
        (json!(["log-lines", 20_000, "flood"]), Contained),
        (json!(["big-log", 4_000_000]), Contained),
        (json!(["big-error", 1_000_000]), Dead("eeee")),
        (
            json!(["stdout", format!("out\n{FORGED}\r\n{FORGED}\x1b[2J")]),
            Contained,
        ),
        (json!(["log", "info", format!("hostile-marker\n{FORGED}")]), Contained),
        // Item 1: the manifest through the rw grant, and around it.
        (json!(["write", "/data/../wasmjobs.toml", EVIL_MANIFEST]), Fails),
        (json!(["write", "/wasmjobs.toml", EVIL_MANIFEST]), Fails),
        (json!(["write", "/data/wasmjobs.toml", EVIL_MANIFEST]), Contained),
        (json!(["mkdir", "/data/../../escaped"]), Fails),
        // Item 2: symlinks and renames on the grant.
        (json!(["symlink", "/", "/data/root"]), Contained),
        (json!(["read", "/data/root/etc/hostname"]), Fails),
        (json!(["symlink", "..", "/data/up"]), Contained),
        (json!(["write", "/data/up/wasmjobs.toml", EVIL_MANIFEST]), Fails),
        (json!(["rename", "/data", "/data-gone"]), Fails),
        // Item 3: names and wildcards resolving to loopback.
        (
            json!(["http", format!("http://2130706433:{http_port}/ok")]),
            Dead("prohibited"),
        ),
        (
            json!(["http", format!("http://127.1:{http_port}/ok")]),
            Dead("prohibited"),
        ),
        (
            json!(["http", format!("http://127.0.0.1:{redis_port}/")]),
            Dead("prohibited"),
        ),
        // Item 8: responses held unread, and a flood.
        (json!(["http-hold", 101, http, "/ok"]), Contained),
        (json!(["http-flood", 200, http, "/ok"]), Contained),
        // Item 7: past the disk budget.
        (json!(["fill", "/data/big", 10 << 20]), Dead("limits.disk")),
        (json!(["remove", "/data/big"]), Contained),
        // Item 6: SQLite session state for the next job.
        (json!(["sql-exec", "local", "PRAGMA query_only = 1"]), Contained),
        (
            json!(["sql", "local", "CREATE TEMP TABLE t AS SELECT 666 AS x"]),
            Contained,
        ),
        (
            json!([
                "sql",
                "local",
                "CREATE TEMP TRIGGER spy AFTER INSERT ON main.t BEGIN UPDATE t SET x = 666; END"
            ]),
            Contained,
        ),
        (json!(["env", "REDIS_URL"]), Contained),
    ]
}

/// `healthy` with the hostile `cases` (`retry: 0`) spread evenly among
/// them; also returns each hostile job's jid, args and expectation.
fn interleave(
    healthy: Vec<Payload>,
    cases: Vec<(Value, Expect)>,
    now: f64,
) -> (Vec<Payload>, Vec<(String, Value, Expect)>) {
    let every = healthy.len() / cases.len().max(1);
    let mut healthy = healthy.into_iter();
    let mut payloads = Vec::new();
    let mut expected = Vec::new();
    for (args, expect) in cases {
        payloads.extend(healthy.by_ref().take(every));
        let mut payload = Payload::new(
            "HostileJob",
            args.as_array().cloned().unwrap_or_default(),
            "default",
            now,
        );
        payload.set("retry", json!(0));
        expected.push((payload.jid().to_owned(), args, expect));
        payloads.push(payload);
    }
    payloads.extend(healthy);
    (payloads, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_among_a_thousand_healthy_jobs_leave_them_all_succeeded_and_rss_back() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let http = server.addr.to_string();
    let port = server.addr.port();

    let temp = tempfile::tempdir().expect("tempdir");
    let plugins = temp.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    copy_plugin(&plugins_dir().join("noop"), &plugins);
    let healthy = chaos_plugin(&plugins, "healthy", "HealthyJob", LOCAL, "");
    let evil = chaos_plugin(
        &plugins,
        "hostile",
        "HostileJob",
        LOCAL,
        &format!(
            "[http]\nallow = [\"127.0.0.1:{port}\", \"2130706433:*\", \"127.1:*\", \"*.0.0.1:*\"]\n\
             [limits]\nmemory = \"16MiB\"\ntimeout = \"2s\"\ndisk = \"1MiB\"\nlog = {{ lines = 1000 }}\n"
        ),
    );
    let manifest = std::fs::read_to_string(evil.join("wasmjobs.toml")).expect("manifest");
    let db = format!("local=sqlite://{}?pool=1", temp.path().join("local.db").display());
    let mut runner = Runner::start(
        &redis.url(),
        &plugins,
        &["--concurrency", "16", "--poll-interval", "0.05", "--db", &db],
    );
    runner.wait_running();
    let pid = runner.pid();
    let now = wasmjobs::redis::now_f64();

    // Phase 0: the table, then two rounds of the warm-up workload.
    let mut processed = 1;
    let create = json!(["sql-exec", "local", "CREATE TABLE t (x INTEGER)"]);
    let mut table = vec![Payload::new(
        "HealthyJob",
        create.as_array().cloned().unwrap_or_default(),
        "default",
        now,
    )];
    push_and_drain(&mut conn, &runner, &mut table, processed).await;
    for round in 0..2 {
        processed += WARM_UP as u64;
        push_and_drain(&mut conn, &runner, &mut warm_up(&format!("warm{round}.txt")), processed).await;
    }
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", tail(&runner.log()));
    let cold = status_kib(pid, "VmRSS");
    // One round of hostile jobs, and healthy ones after it, so that what
    // any first run of these paths costs for good (code pages faulted in,
    // thread stacks touched, the allocator's high-water mark) is in the
    // baseline; what is measured against it is what more hostile jobs add.
    let (mut first, _) = interleave(Vec::new(), hostile(&http, port, redis.port()), now);
    first.extend(warm_up("warm-hostile.txt"));
    processed += first.len() as u64;
    push_and_drain(&mut conn, &runner, &mut first, processed).await;
    let baseline = status_kib(pid, "VmRSS");

    // Phase 1: 1,000 healthy jobs with two rounds of hostile ones spread among them.
    let mut cases = hostile(&http, port, redis.port());
    cases.extend(hostile(&http, port, redis.port()));
    let healthy_jobs: Vec<Payload> = (0..HEALTHY)
        .map(|i| {
            let args = if i % 5 == 4 {
                return Payload::new("NoopJob", vec![json!(i)], "default", now);
            } else if i % (HEALTHY / SQL_INSERTS) == 0 {
                vec![
                    json!("sql-exec"),
                    json!("local"),
                    json!(format!("INSERT INTO t VALUES ({i})")),
                ]
            } else {
                vec![json!("slow-append"), json!("healthy.txt"), json!(i), json!(0)]
            };
            Payload::new("HealthyJob", args, "default", now)
        })
        .collect();
    let (mut payloads, expected) = interleave(healthy_jobs, cases, now);

    processed += payloads.len() as u64;
    push_and_drain(&mut conn, &runner, &mut payloads, processed).await;
    let peak = status_kib(pid, "VmHWM");
    let after_hostile = status_kib(pid, "VmRSS");
    let log = runner.log();

    // Every healthy job succeeded: none failed, none waits for a retry,
    // every append is there once, and the SQL inserts all went in.
    let dead = zset(&mut conn, "dead").await;
    let retries = zset(&mut conn, "retry").await;
    assert!(
        retries.is_empty(),
        "retried: {:?}",
        retries.iter().map(Payload::to_json).collect::<Vec<_>>()
    );
    assert!(
        dead.iter().all(|d| d.class() == "HostileJob"),
        "a healthy job died: {:?}",
        dead.iter()
            .filter(|d| d.class() != "HostileJob")
            .map(Payload::to_json)
            .collect::<Vec<_>>()
    );
    let failed = int(&mut conn, "stat:failed").await;
    assert_eq!(
        failed,
        dead.len() as u64,
        "every failure is a hostile job in the dead set"
    );
    let mut appended: Vec<usize> = lines(&healthy.join("data/healthy.txt"))
        .iter()
        .map(|l| l.parse().expect("appended id"))
        .collect();
    appended.sort_unstable();
    let want: Vec<usize> = (0..HEALTHY)
        .filter(|i| i % 5 != 4 && i % (HEALTHY / SQL_INSERTS) != 0)
        .collect();
    assert_eq!(appended, want, "every healthy append ran exactly once");

    // Each hostile job came to what it must.
    for (jid, args, expect) in &expected {
        let died = dead.iter().find(|d| d.jid() == jid);
        match (expect, died) {
            (Expect::Dead(needle), Some(d)) => {
                let message = d.str("error_message").unwrap_or_default();
                assert!(message.contains(needle), "{args}: {:.300}", message);
                assert!(message.len() <= 10_100, "{args}: a {} byte error kept", message.len());
            }
            (Expect::Fails, Some(_)) | (Expect::Contained, _) => {}
            (_, None) => panic!("hostile job {args} succeeded"),
        }
    }

    // Nothing escaped: the manifest is the one we wrote, nothing was
    // created outside the grant, the fill was cut at the budget.
    assert_eq!(
        std::fs::read_to_string(evil.join("wasmjobs.toml")).expect("manifest"),
        manifest
    );
    assert!(!evil.join("data-gone").exists() && evil.join("data").is_dir());
    assert!(!plugins.join("escaped").exists() && !plugins.join("hostile/escaped").exists());
    for line in log.lines() {
        assert!(
            !line.starts_with("FORGED"),
            "a forged line made it into the log: {line:?}"
        );
        assert!(
            !line.contains('\x1b') && !line.contains('\r'),
            "raw control character in {line:?}"
        );
    }
    assert!(log.contains("hostile-marker"), "the hostile log line is shown escaped");
    assert!(log.len() < 10 << 20, "the runner's log is {} bytes", log.len());

    // The temp table, trigger and query_only reached no later job: the
    // inserts all went into main.t unchanged, and one more reads them.
    processed += 1;
    let tally = ["sql", "local", "SELECT 'tally', count(*), sum(x = 666) FROM main.t"];
    let mut check = vec![Payload::new(
        "HealthyJob",
        tally.iter().map(|s| json!(s)).collect(),
        "default",
        now,
    )];
    push_and_drain(&mut conn, &runner, &mut check, processed).await;
    assert_eq!(
        int(&mut conn, "stat:failed").await,
        failed,
        "the tally failed:\n{}",
        tail(&runner.log())
    );
    let row = format!("row: [\"tally\",{},0]", SQL_INSERTS);
    assert!(runner.log().contains(&row), "no {row} in:\n{}", tail(&runner.log()));

    // Phase 2: the warm-up workload again; RSS comes back within 10%.
    processed += WARM_UP as u64;
    push_and_drain(&mut conn, &runner, &mut warm_up("warm2.txt"), processed).await;
    let limit = baseline + baseline / 10;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut end = status_kib(pid, "VmRSS");
    while end > limit && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        end = status_kib(pid, "VmRSS");
    }
    eprintln!(
        "hostile run RSS: after healthy warm-up {:.1} MiB (end/that {:.3}), baseline after a hostile warm-up \
         {:.1} MiB, peak {:.1} MiB, after hostile {:.1} MiB, end {:.1} MiB, \
         end/baseline {:.3}; {} hostile jobs, {} dead",
        mib(cold),
        end as f64 / cold as f64,
        mib(baseline),
        mib(peak),
        mib(after_hostile),
        mib(end),
        end as f64 / baseline as f64,
        expected.len(),
        dead.len()
    );
    assert!(
        end <= limit,
        "RSS {:.1} MiB did not come back within 10% of {:.1} MiB",
        mib(end),
        mib(baseline)
    );
    assert!(runner.stop().success(), "{}", tail(&runner.log()));
}
