//! Trust tests, round two, all at once (issue 32's "Done when"): one real
//! `wasmjobs run --plugins ./plugins` process takes 2,000 jobs of which
//! 100 are hostile, five of each of 20 kinds — payloads that are huge,
//! not UTF-8, not JSON or of the wrong shape, classes that are unknown,
//! a megabyte long or served by a broken plugin, and guests that loop,
//! eat memory, overflow their stack, trap, panic, fail with a megabyte,
//! fill their disk, call private or ungranted addresses, write outside
//! their grant, use a database they were not granted, attach files to
//! SQLite and write another plugin's table in a shared PostgreSQL. Around
//! them, Redis holds what foreign writers leave (a Sidekiq process record
//! without plugins, a string in `processes`, a hash listed as a queue, a
//! string in the cron set), and a client holds a half-sent request to
//! the process's dashboard.
//!
//! Every good job must succeed, every bad one be in the dead set with a
//! message, the process stay in `processes` with a fresh beat throughout,
//! its pages and `wasmjobs stats` answer, and its peak RSS stay within
//! twice the largest payload. The huge payloads are queued before the
//! runner starts, among the others, so its batched fetch meets them (the
//! path a busy runner takes; `payloads.rs` covers the others).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::dashboard::request;
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, jobs_in_progress, lines, wasmjobs_bin};
use wasmjobs_e2e::{copy_plugin, plugins_dir};

use super::hostile::{chaos_plugin, status_kib, tail};

/// Jobs in the run, hostile ones included.
const JOBS: usize = 2_000;
/// Hostile jobs of each kind.
const EACH: usize = 5;
/// Healthy PostgreSQL inserts among the good jobs.
const LEDGER_INSERTS: usize = 50;
/// Double quotes in a huge payload's argument: a 64 MiB payload (each is
/// escaped), four times the default `--max-payload`.
const HUGE_QUOTES: usize = 32 << 20;
/// How long the run may take on a loaded 2-core machine.
const RUN: Duration = Duration::from_secs(600);

/// The SQL grant of both chaos plugins: the run's SQLite database and
/// PostgreSQL (each plugin there as its own role).
const SQL: &str = "[\"local\", \"pg\"]";

/// One hostile job as it goes into Redis: the bytes, and a tag that its
/// dead entry must still carry.
struct Hostile {
    kind: &'static str,
    tag: String,
    bytes: Vec<u8>,
}

/// A `HostileJob` (served by the chaos guest under tight limits) with
/// `args`, `retry: 0` so that its first failure is its last.
fn guest_job(tag: &str, args: Value) -> Vec<u8> {
    let mut job = Payload::new(
        "HostileJob",
        args.as_array().cloned().unwrap_or_default(),
        "default",
        wasmjobs::redis::now_f64(),
    );
    job.set("jid", json!(tag));
    job.set("retry", json!(0));
    job.to_json().into_bytes()
}

/// A job of `class` with `args` and `retry: 0`, its jid the tag.
fn job_of(class: &str, tag: &str, args: Vec<Value>) -> Vec<u8> {
    let mut job = Payload::new(class, args, "default", wasmjobs::redis::now_f64());
    job.set("jid", json!(tag));
    job.set("retry", json!(0));
    job.to_json().into_bytes()
}

/// The 20 kinds: what `n`-th job of each looks like. `http` is the test
/// server's `host:port`, `port` its port.
fn hostile_job(kind: &'static str, n: usize, http: &str, port: u16) -> Hostile {
    let tag = format!("hostile-{kind}-{n}");
    let bytes = match kind {
        // The runner's side: never reaches a guest.
        "huge-payload" => job_of("NoopJob", &tag, vec![json!("\"".repeat(HUGE_QUOTES))]),
        "not-utf8" => [
            b"\xff\xfe{\"class\":\"NoopJob\",\"jid\":\"".as_slice(),
            tag.as_bytes(),
            b"\"}",
        ]
        .concat(),
        "not-json" => format!("{{\"class\":\"NoopJob\",\"jid\":\"{tag}\",\"args\":[").into_bytes(),
        "args-not-a-list" => {
            format!("{{\"class\":\"NoopJob\",\"jid\":\"{tag}\",\"args\":\"ok\",\"queue\":\"default\",\"retry\":0}}")
                .into_bytes()
        }
        "unknown-class" => job_of("NoSuchJob", &tag, vec![]),
        "huge-class" => job_of(&"H".repeat(1 << 20), &tag, vec![]),
        "broken-plugin" => job_of("BrokenJob", &tag, vec![]),
        // The guest's side, under `limits` (16 MiB, 2 s, 1 MiB of disk).
        "loop" => guest_job(&tag, json!(["loop"])),
        "memory" => guest_job(&tag, json!(["alloc", 64 << 20])),
        "stack" => guest_job(&tag, json!(["recurse", 100_000_000u64])),
        "trap" => guest_job(&tag, json!(["trap"])),
        "panic" => guest_job(&tag, json!(["panic", "hostile panic"])),
        "huge-error" => guest_job(&tag, json!(["big-error", 1_000_000])),
        "disk" => guest_job(&tag, json!(["fill", format!("/data/fill-{n}"), 10 << 20])),
        "private-address" => guest_job(&tag, json!(["http", format!("http://127.1:{port}/ok")])),
        "ungranted-host" => guest_job(&tag, json!(["http", format!("http://{http}/ok")])),
        "file-escape" => guest_job(&tag, json!(["write", "/data/../wasmjobs.toml", "classes = []"])),
        "ungranted-db" => guest_job(&tag, json!(["sql", "secret", "SELECT 1"])),
        "sqlite-attach" => guest_job(
            &tag,
            json!(["sql-exec", "local", "ATTACH DATABASE '/tmp/hostile.db' AS h"]),
        ),
        "other-plugins-rows" => guest_job(&tag, json!(["sql-exec", "pg", "DELETE FROM ledger"])),
        other => panic!("no hostile kind {other}"),
    };
    Hostile { kind, tag, bytes }
}

const KINDS: [&str; 20] = [
    "huge-payload",
    "not-utf8",
    "not-json",
    "args-not-a-list",
    "unknown-class",
    "huge-class",
    "broken-plugin",
    "loop",
    "memory",
    "stack",
    "trap",
    "panic",
    "huge-error",
    "disk",
    "private-address",
    "ungranted-host",
    "file-escape",
    "ungranted-db",
    "sqlite-attach",
    "other-plugins-rows",
];

/// The `i`-th good job: a no-op, an append to a file, or an insert into
/// the healthy plugin's own PostgreSQL table.
fn good_job(i: usize, good: usize) -> Payload {
    let now = wasmjobs::redis::now_f64();
    if i % 5 == 4 {
        return Payload::new("NoopJob", vec![json!(i)], "default", now);
    }
    let args = if i.is_multiple_of(good / LEDGER_INSERTS) {
        vec![
            json!("sql-exec"),
            json!("pg"),
            json!(format!("INSERT INTO ledger VALUES ({i})")),
        ]
    } else {
        vec![json!("slow-append"), json!("good.txt"), json!(i), json!(0)]
    };
    Payload::new("HealthyJob", args, "default", now)
}

/// What foreign writers leave in Redis: a Sidekiq process record with no
/// plugins (on another queue: one sharing `default` would get the
/// unknown-class jobs handed back, `beside_sidekiq.rs`), a string where a
/// process hash should be, a hash listed as a queue, a string in the cron
/// set.
async fn foreign_entries(conn: &mut MultiplexedConnection) {
    let now = wasmjobs::redis::now_f64();
    let info = json!({
        "hostname": "ruby.example", "started_at": now, "pid": 4242, "tag": "shop",
        "concurrency": 5, "queues": ["mailers"], "labels": [], "identity": "ruby.example:4242:abcd",
        "version": "7.3.9",
    });
    let _: () = redis::pipe()
        .sadd("processes", &["ruby.example:4242:abcd", "a-string:1:x"])
        .ignore()
        .hset("ruby.example:4242:abcd", "info", info.to_string())
        .ignore()
        .hset("ruby.example:4242:abcd", "beat", now.to_string())
        .ignore()
        .set("a-string:1:x", "not a heartbeat")
        .ignore()
        .sadd("queues", "junk")
        .ignore()
        .hset("queue:junk", "a", "a hash, not a list")
        .ignore()
        .sadd("cron_jobs:default", "junk")
        .ignore()
        .set("cron_job:default:junk", "a string, not a cron job")
        .ignore()
        .query_async(conn)
        .await
        .expect("write the foreign entries");
}

/// Samples every 200 ms, until `stop`, whether `identity` is in
/// `processes` with a beat at most 30 s old; counts samples and misses.
fn watch_membership(
    mut conn: MultiplexedConnection,
    identity: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    tokio::spawn(async move {
        let mut samples = 0;
        let mut misses = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let read: redis::RedisResult<(bool, Option<f64>)> = redis::pipe()
                .sismember("processes", &identity)
                .hget(&identity, "beat")
                .query_async(&mut conn)
                .await;
            let now = wasmjobs::redis::now_f64();
            match read {
                Ok((true, Some(beat))) if now - beat <= 30.0 => {}
                Ok((member, beat)) => misses.push(format!("at {now:.1}: member {member}, beat {beat:?}")),
                Err(error) => misses.push(format!("at {now:.1}: {error}")),
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (samples, misses)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_jobs_with_a_hundred_hostile_ones_of_twenty_kinds() {
    let redis = TestRedis::start();
    let mut conn = redis.patient_conn().await;
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.psql(
        "postgres",
        "CREATE ROLE healthy_role LOGIN; CREATE ROLE hostile_role LOGIN",
    );
    pg.psql(
        "app",
        "CREATE TABLE ledger (x integer); ALTER TABLE ledger OWNER TO healthy_role; \
         GRANT SELECT ON ledger TO hostile_role",
    );
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let http = server.addr.to_string();
    let port = server.addr.port();

    // The user's layout: a directory with `plugins/` in it, the runner
    // started there with `--plugins ./plugins`.
    let home = tempfile::tempdir().expect("tempdir");
    let plugins = home.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    copy_plugin(&plugins_dir().join("noop"), &plugins);
    let healthy = chaos_plugin(&plugins, "healthy", "HealthyJob", SQL, "");
    let evil = chaos_plugin(
        &plugins,
        "hostile",
        "HostileJob",
        SQL,
        "[http]\nallow = [\"127.1:*\"]\n\
         [limits]\nmemory = \"16MiB\"\ntimeout = \"2s\"\ndisk = \"1MiB\"\n",
    );
    let manifest = std::fs::read_to_string(evil.join("wasmjobs.toml")).expect("manifest");
    let broken = plugins.join("broken");
    std::fs::create_dir_all(&broken).expect("broken plugin dir");
    std::fs::write(broken.join("broken.wasm"), b"\0asm\x0d\0\x01\0 not a component").expect("write");
    std::fs::write(
        broken.join("wasmjobs.toml"),
        "component = \"broken.wasm\"\nclasses = [\"BrokenJob\"]\n",
    )
    .expect("write");

    // Everything queued before the runner starts: 1,900 good jobs with
    // the 100 hostile ones spread evenly among them.
    let good = JOBS - KINDS.len() * EACH;
    let mut hostile = Vec::new();
    for n in 0..EACH {
        for kind in KINDS {
            hostile.push(hostile_job(kind, n, &http, port));
        }
    }
    let largest = hostile.iter().map(|h| h.bytes.len()).max().unwrap_or(0);
    let every = good / hostile.len();
    let mut good_jids = Vec::new();
    let mut queued = 0;
    let mut good_jobs = (0..good).map(|i| good_job(i, good));
    for h in &hostile {
        let mut pipe = redis::pipe();
        for job in good_jobs.by_ref().take(every) {
            good_jids.push(job.jid().to_owned());
            pipe.lpush("queue:default", job.to_json()).ignore();
            queued += 1;
        }
        pipe.lpush("queue:default", h.bytes.as_slice()).ignore();
        let _: () = pipe.query_async(&mut conn).await.expect("queue jobs");
        queued += 1;
    }
    let mut pipe = redis::pipe();
    for job in good_jobs {
        good_jids.push(job.jid().to_owned());
        pipe.lpush("queue:default", job.to_json()).ignore();
        queued += 1;
    }
    pipe.sadd("queues", "default").ignore();
    let _: () = pipe.query_async(&mut conn).await.expect("queue jobs");
    assert_eq!(queued, JOBS);
    for h in &mut hostile {
        h.bytes = Vec::new();
    }
    foreign_entries(&mut conn).await;

    let dir = home.path().display();
    let web = free_addr();
    let dbs = [
        format!("local=sqlite://{dir}/local.db?pool=1"),
        format!("secret=sqlite://{dir}/secret.db?pool=1"),
        format!("pg={}?pool=2", pg.url_as("hostile_role", "app")),
        format!("pg@healthy={}?pool=4", pg.url_as("healthy_role", "app")),
    ];
    let mut args = vec!["--concurrency", "16", "--poll-interval", "0.2", "--web", &web];
    for db in &dbs {
        args.extend(["--db", db.as_str()]);
    }
    // Opened before the runner starts: while it buries the huge payloads
    // (inside Redis's Lua), a new connection's handshake can time out.
    let watch_conn = redis.patient_conn().await;
    let mut runner = Runner::start_in(home.path(), &redis.url(), "./plugins", &args);
    runner.wait_running();
    let pid = runner.pid();
    let identity = {
        let needle = format!(":{pid}:");
        let members: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
        members
            .into_iter()
            .find(|m| m.contains(&needle))
            .unwrap_or_else(|| panic!("the runner is not in `processes`:\n{}", runner.log()))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_membership(watch_conn, identity, stop.clone());

    // A client sends half a request to the dashboard and holds it.
    let mut half_sent = std::net::TcpStream::connect(&web).expect("connect to the dashboard");
    half_sent
        .write_all(format!("GET /dead HTTP/1.1\r\nHost: {web}\r\nX-Slow:").as_bytes())
        .expect("send half a request");

    // The run: until nothing is queued or in flight; the dashboard's pages
    // and `wasmjobs stats` answer meanwhile.
    let mut polls = 0u64;
    let deadline = Instant::now() + RUN;
    loop {
        let left: u64 = conn.llen("queue:default").await.expect("LLEN");
        if left == 0 && jobs_in_progress(&mut conn).await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} jobs still queued after {RUN:?}:\n{}",
            tail(&runner.log())
        );
        polls += 1;
        if polls % 20 == 1 {
            for path in ["/", "/queues", "/processes", "/dead", "/cron"] {
                let page = request(&web, "GET", path, &[], "");
                assert_eq!(page.status, 200, "{path} during the run: {:.500}", page.body);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = std::process::Command::new(wasmjobs_bin())
        .args(["stats", "--redis", &redis.url()])
        .output()
        .expect("wasmjobs stats");
    assert!(
        stats.status.success(),
        "wasmjobs stats: {}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let peak = status_kib(pid, "VmHWM") * 1024;
    stop.store(true, Ordering::Relaxed);
    let (samples, misses) = watcher.await.expect("the watcher");
    let log = runner.log();

    // Every bad one is dead, with a message: each tag is in exactly one
    // dead entry, and nothing else is.
    let dead: Vec<Vec<u8>> = conn.zrange("dead", 0, -1).await.expect("ZRANGE dead");
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in &dead {
        // Its head or its tail says whose it is (the jid of a huge
        // payload comes after its argument).
        let head = String::from_utf8_lossy(&entry[..entry.len().min(4096)]);
        let end = String::from_utf8_lossy(&entry[entry.len().saturating_sub(4096)..]);
        let tag = hostile
            .iter()
            .find(|h| head.contains(&h.tag) || end.contains(&h.tag))
            .map(|h| h.tag.clone())
            .unwrap_or_else(|| panic!("a dead entry that is no hostile job: {head:.500}"));
        let parsed: Value = serde_json::from_slice(entry)
            .unwrap_or_else(|e| panic!("the dead entry of {tag} is not JSON ({e}): {head:.300}"));
        let message = parsed["error_message"].as_str().unwrap_or_default().to_owned();
        found.entry(tag).or_default().push(message);
    }
    let mut missing = Vec::new();
    for h in &hostile {
        match found.get(&h.tag).map(Vec::as_slice) {
            Some([message]) => {
                assert!(!message.trim().is_empty(), "{}: dead without a message", h.tag);
                assert!(message.len() <= 10_100, "{}: a {} byte message", h.tag, message.len());
            }
            Some(more) => panic!("{} is dead {} times: {more:?}", h.tag, more.len()),
            None => missing.push(h.kind),
        }
    }
    assert!(
        missing.is_empty(),
        "hostile jobs not in the dead set: {missing:?}\n{}",
        tail(&log)
    );
    let messages: BTreeMap<&str, &str> = hostile
        .iter()
        .filter_map(|h| Some((h.kind, found.get(&h.tag)?.first()?.as_str())))
        .collect();
    for (kind, needle) in [
        ("huge-payload", "--max-payload"),
        ("panic", "hostile panic"),
        ("disk", "limits.disk"),
        ("private-address", "prohibited"),
        ("sqlite-attach", "ATTACH statements are not allowed"),
        ("other-plugins-rows", "42501"),
    ] {
        assert!(messages[kind].contains(needle), "{kind}: {:.300}", messages[kind]);
    }

    // Every good job succeeded: none waits for a retry, the appends are
    // all there once, the ledger holds every insert and nothing else.
    let retries: u64 = conn.zcard("retry").await.expect("ZCARD retry");
    assert_eq!(retries, 0, "jobs wait for a retry:\n{}", tail(&log));
    let mut appended: Vec<usize> = lines(&healthy.join("data/good.txt"))
        .iter()
        .map(|l| l.parse().expect("appended id"))
        .collect();
    appended.sort_unstable();
    let want: Vec<usize> = (0..good)
        .filter(|i| i % 5 != 4 && !i.is_multiple_of(good / LEDGER_INSERTS))
        .collect();
    assert_eq!(appended, want, "every good append ran exactly once");
    let ledger = pg.psql("app", "SELECT count(*), count(DISTINCT x) FROM ledger");
    let inserts = (0..good)
        .filter(|i| i % 5 != 4 && i.is_multiple_of(good / LEDGER_INSERTS))
        .count();
    assert_eq!(ledger, format!("{inserts}|{inserts}"), "the ledger");
    assert_eq!(good_jids.len(), good);

    // Nothing escaped: the manifest is the one written, no file attached.
    assert_eq!(
        std::fs::read_to_string(evil.join("wasmjobs.toml")).expect("manifest"),
        manifest
    );
    assert!(!Path::new("/tmp/hostile.db").exists(), "ATTACH created a file");

    // The process was in `processes` with a fresh beat all along, and its
    // memory stayed within twice the largest payload.
    let mib = |bytes: u64| bytes as f64 / 1048576.0;
    eprintln!(
        "hostile run: {JOBS} jobs, {} dead, largest payload {:.1} MiB, peak RSS {:.1} MiB ({:.2}x); \
         {samples} membership samples, {} misses",
        dead.len(),
        mib(largest as u64),
        mib(peak),
        peak as f64 / largest as f64,
        misses.len()
    );
    assert!(samples > 10, "only {samples} membership samples");
    assert!(misses.is_empty(), "out of `processes`: {misses:?}");
    assert!(
        peak <= 2 * largest as u64,
        "peak RSS {:.1} MiB, over twice the largest payload ({:.1} MiB)",
        mib(peak),
        mib(largest as u64)
    );

    // The half-sent request holds nothing up: the process stops cleanly.
    assert!(runner.stop().success(), "{}", tail(&runner.log()));
    drop(half_sent);
}
