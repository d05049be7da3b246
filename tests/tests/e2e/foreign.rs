//! What other writers leave in Redis: Sidekiq processes (a real one, and
//! the records Sidekiq 7 and 8 or an older wasmjobs write), keys of the
//! wrong type written by any client, entries that are not JSON or not
//! UTF-8, and jobs of 100 MB. None of them may take a dashboard page,
//! `wasmjobs stats` or a runner loop down: each is shown as unreadable
//! and skipped, a loop that fails backs off and says so once, and a view
//! never transfers a whole huge job.
//!
//! Everything is real: a real redis-server, real `wasmjobs run`, `wasmjobs
//! web` and `wasmjobs stats` processes, Debian's `sidekiq` command, and
//! headless Chromium for the buttons.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::redis::now_f64;
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::browser::Browser;
use wasmjobs_e2e::cli::wasmjobs_in;
use wasmjobs_e2e::dashboard::{Web, request, wait_listening, wasmjobs_peak_rss};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, held_lists, identity_of, plugins, push, wait_processed};
use wasmjobs_e2e::sidekiq::SidekiqProcess;
use wasmjobs_e2e::{EVERY_SECOND_SCHEDULE, eventually};

type Conn = redis::aio::MultiplexedConnection;

/// Registers a process record `identity` with heartbeat `fields`, as a
/// heartbeat does (expiring in two minutes).
async fn write_process(conn: &mut Conn, identity: &[u8], fields: &[(&str, Vec<u8>)]) {
    let mut pipe = redis::pipe();
    pipe.sadd("processes", identity).ignore();
    for (name, value) in fields {
        pipe.hset(identity, *name, value.as_slice()).ignore();
    }
    pipe.expire(identity, 120).ignore();
    let _: () = pipe.query_async(conn).await.expect("write a process record");
}

fn text(value: &str) -> Vec<u8> {
    value.as_bytes().to_vec()
}

/// The records other Sidekiq versions, an older wasmjobs and damaged or
/// hostile writers leave in `processes`; returns the identities (as the
/// page shows them) that must be listed.
async fn write_odd_processes(conn: &mut Conn) -> Vec<String> {
    let now = now_f64();
    let sidekiq7 = json!({
        "hostname": "sidekiq7.example", "started_at": now - 100.0, "pid": 7001, "tag": "shop",
        "concurrency": 5, "queues": ["critical", "default"],
        "weights": [{"critical": 0, "default": 0}], "labels": ["reliable"],
        "identity": "sidekiq7.example:7001:0a1b2c", "version": "7.3.9", "embedded": false,
    });
    write_process(
        conn,
        b"sidekiq7.example:7001:0a1b2c",
        &[
            ("info", text(&sidekiq7.to_string())),
            ("busy", text("1")),
            ("beat", text(&now.to_string())),
            ("quiet", text("false")),
            ("rss", text("204800")),
            ("rtt_us", text("250")),
        ],
    )
    .await;
    // Sidekiq 7 writes the job it runs as JSON text inside the work entry.
    let job = json!({"class": "ShopJob", "args": [1], "jid": "0a0b0c0d0e0f0a0b0c0d0e0f", "queue": "default"});
    let work = json!({"queue": "default", "payload": job.to_string(), "run_at": now - 5.0});
    let _: () = conn
        .hset("sidekiq7.example:7001:0a1b2c:work", "tid-1", work.to_string())
        .await
        .expect("HSET work");
    // Sidekiq 8: times in milliseconds, weights as a hash.
    let sidekiq8 = json!({
        "hostname": "sidekiq8.example", "started_at": ((now - 50.0) * 1000.0) as u64, "pid": 8001,
        "tag": "", "concurrency": 10, "queues": ["default"], "weights": {"default": 1},
        "labels": [], "identity": "sidekiq8.example:8001:3d4e5f", "version": "8.0.4", "embedded": true,
    });
    write_process(
        conn,
        b"sidekiq8.example:8001:3d4e5f",
        &[
            ("info", text(&sidekiq8.to_string())),
            ("busy", text("0")),
            ("beat", text(&((now * 1000.0) as u64).to_string())),
            ("quiet", text("false")),
            ("rss", text("1024")),
            ("rtt_us", text("99")),
        ],
    )
    .await;
    let old = json!({"hostname": "old", "pid": 9001, "concurrency": 4, "queues": ["default"], "plugins": {}, "version": "wasmjobs 0.1.0"});
    write_process(
        conn,
        b"old-wasmjobs:9001:aaaa",
        &[("info", text(&old.to_string())), ("beat", text(&now.to_string()))],
    )
    .await;
    write_process(
        conn,
        b"no-info:1:bbbb",
        &[("busy", text("2")), ("beat", text(&now.to_string()))],
    )
    .await;
    write_process(
        conn,
        b"not-json:1:cccc",
        &[("info", text("{oops")), ("beat", text(&now.to_string()))],
    )
    .await;
    write_process(conn, b"json-array:1:dddd", &[("info", text("[1,2,3]"))]).await;
    let odd = json!({
        "hostname": 5, "pid": "12", "concurrency": -3, "queues": "default", "started_at": "yesterday",
        "tag": null, "version": 7, "plugins": ["a"], "identity": 3,
    });
    write_process(
        conn,
        b"odd-types:1:eeee",
        &[
            ("info", text(&odd.to_string())),
            ("busy", text("lots")),
            ("beat", text("never")),
            ("quiet", text("yes")),
            ("rss", text("-5")),
            ("rtt_us", text("1e99")),
            ("cpu", text("NaN")),
        ],
    )
    .await;
    // Its work "hash" is a string.
    let _: () = conn.set("odd-types:1:eeee:work", "not a hash").await.expect("SET");
    write_process(
        conn,
        b"binary\xff:1:ffff",
        &[
            ("info", b"{\"hostname\":\"h\xff\",\"pid\":1}".to_vec()),
            ("beat", b"\xfe\xff".to_vec()),
        ],
    )
    .await;
    let plugins = json!({"hostname": "p", "plugins": {"p": 1, "q": "v1", "<b>r</b>": "v2"}});
    write_process(conn, b"plugins-odd:1:gggg", &[("info", text(&plugins.to_string()))]).await;
    let huge = json!({"hostname": "huge", "tag": "t".repeat(3 << 20)});
    write_process(conn, b"huge-info:1:hhhh", &[("info", text(&huge.to_string()))]).await;
    vec![
        "sidekiq7.example:7001:0a1b2c".into(),
        "sidekiq8.example:8001:3d4e5f".into(),
        "old-wasmjobs:9001:aaaa".into(),
        "no-info:1:bbbb".into(),
        "not-json:1:cccc".into(),
        "json-array:1:dddd".into(),
        "odd-types:1:eeee".into(),
        "binary\u{fffd}:1:ffff".into(),
        "plugins-odd:1:gggg".into(),
        "huge-info:1:hhhh".into(),
    ]
}

/// Item 3 of issue 32: `/processes` renders every process record Sidekiq
/// (a real Sidekiq 6 process; 7 and 8 as they write) or another wasmjobs
/// writes, and Quiet, Stop and Cancel still work on the good ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_record_renders_and_the_good_ones_obey() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let sidekiq = SidekiqProcess::start(&redis.url(), "ruby-only");
    // A runner with an empty plugin directory, and one running chaos.
    let empty = tempfile::tempdir().expect("tempdir");
    let mut bare = Runner::start(&redis.url(), empty.path(), &["-q", "bare-only"]);
    bare.wait_running();
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--web", "127.0.0.1:0", "-c", "2"]);
    runner.wait_running();
    let addr = wait_listening(|| runner.log(), || None);
    let base = format!("http://{addr}");
    let ruby = identity_of(&mut conn, sidekiq.pid(), || sidekiq.log()).await;
    let bare_id = identity_of(&mut conn, bare.pid(), || bare.log()).await;
    let runner_id = identity_of(&mut conn, runner.pid(), || runner.log()).await;
    // The real processes alone: a Sidekiq process and a runner without
    // plugins have no plugin versions to show.
    let page = request(&addr, "GET", "/processes", &[], "");
    assert_eq!(page.status, 200, "/processes: {}\n{}", page.body, runner.log());
    for identity in [&ruby, &bare_id, &runner_id] {
        assert!(
            page.body.contains(&format!("data-identity=\"{identity}\"")),
            "{identity} not listed"
        );
    }
    let odd = write_odd_processes(&mut conn).await;
    // A member of `processes` that is a string, not a heartbeat hash.
    let _: () = conn.sadd("processes", "a-string:1:iiii").await.expect("SADD");
    let _: () = conn.set("a-string:1:iiii", "not a hash").await.expect("SET");

    let page = request(&addr, "GET", "/processes", &[], "");
    assert_eq!(page.status, 200, "/processes: {}\n{}", page.body, runner.log());
    for identity in odd.iter().chain([&ruby, &bare_id, &runner_id]) {
        assert!(
            page.body.contains(&format!("data-identity=\"{identity}\"")),
            "{identity} not listed:\n{}",
            page.body
        );
    }
    assert!(
        page.body.contains("a-string:1:iiii"),
        "the string record is named as unreadable"
    );
    assert!(
        page.body.contains("0a0b0c0d0e0f0a0b0c0d0e0f"),
        "Sidekiq 7's running job is listed"
    );
    for other in ["/", "/api/overview", "/plugins", "/queues"] {
        let page = request(&addr, "GET", other, &[], "");
        assert_eq!(page.status, 200, "{other}: {}", page.body);
    }
    let cwd = tempfile::tempdir().expect("tempdir");
    let none: [(&str, &str); 0] = [];
    let stats = wasmjobs_in(
        cwd.path(),
        &["stats", "--json", "--redis", &redis.url()],
        &none,
        Duration::from_secs(60),
    );
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));

    // Cancel a job running in the chaos runner, from the page.
    let jid = push(&mut conn, "ChaosJob", "default", vec![json!(["loop"])])
        .await
        .remove(0);
    let browser = Browser::start("every_process_record_renders_and_the_good_ones_obey").await;
    let running = format!("tr.running[data-jid=\"{jid}\"]");
    browser
        .wait_for(
            Duration::from_secs(30),
            || format!("{jid} to show as running on /processes"),
            async |browser: &Browser| {
                browser.goto(&format!("{base}/processes")).await;
                browser.try_find(&running).await.is_some()
            },
        )
        .await;
    browser.click_to_navigate(&format!("{running} button.cancel")).await;
    eventually(
        Duration::from_secs(15),
        || format!("{jid} to be recorded as cancelled:\n{}", runner.log()),
        || {
            let mut conn = conn.clone();
            let jid = jid.clone();
            async move {
                let cancelled: Vec<String> = conn.zrange("wasmjobs:cancelled", 0, -1).await.expect("ZRANGE");
                cancelled.iter().any(|c| c.contains(&jid))
            }
        },
    )
    .await;

    // Quiet the Ruby process: Sidekiq pops the signal with its heartbeat.
    browser.goto(&format!("{base}/processes")).await;
    browser
        .click_to_navigate(&format!("tr.process[data-identity=\"{ruby}\"] button.quiet"))
        .await;
    eventually(
        Duration::from_secs(30),
        || format!("Sidekiq to go quiet:\n{}", sidekiq.log()),
        || {
            let mut conn = conn.clone();
            let ruby = ruby.clone();
            async move {
                conn.hget::<_, _, Option<String>>(&ruby, "quiet")
                    .await
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some("true")
            }
        },
    )
    .await;

    // Stop the runner without plugins.
    browser.goto(&format!("{base}/processes")).await;
    browser
        .click_to_navigate(&format!("tr.process[data-identity=\"{bare_id}\"] button.stop"))
        .await;
    let status = bare.wait(Duration::from_secs(60));
    assert!(status.success(), "{status}:\n{}", bare.log());
    drop(browser);
    assert!(runner.stop().success());
}

/// A hash map of field → value, as `HSET` takes it.
fn fields<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    pairs.to_vec()
}

/// Fills Redis with keys of the wrong type and entries that are not jobs,
/// beside good ones: three jobs in `default`, one plain schedule, one
/// limit log of two starts.
async fn write_foreign_keys(conn: &mut Conn) {
    push(conn, "NoopJob", "default", vec![json!([1]), json!([2]), json!([3])]).await;
    let _: () = conn.sadd("queues", &["junk", "bin"]).await.expect("SADD");
    let _: () = conn.hset("queue:junk", "a", "hash, not a list").await.expect("HSET");
    let _: () = conn
        .rpush("queue:bin", &[b"\xff\xfe not utf-8".to_vec(), b"not json".to_vec()])
        .await
        .expect("RPUSH");
    let _: () = conn.hset("stat:failed", "a", "1").await.expect("HSET");
    let _: () = conn.set("retry", "a string, not a set").await.expect("SET");
    let _: () = conn.zadd("dead", "not json", now_f64()).await.expect("ZADD");
    let _: () = conn.rpush("paused", "a list").await.expect("RPUSH");
    let _: () = conn.set("wasmjobs:cancelled", "x").await.expect("SET");
    let _: () = conn.hset("wasmjobs:stat:cancelled", "a", "1").await.expect("HSET");
    // The open cancels as a list: the fetch looks requests up, and runs on.
    let _: () = conn.rpush("wasmjobs:cancels:open", "x").await.expect("RPUSH");
    // Processes: one whose key is a string, one whose work is a string.
    let _: () = conn.sadd("processes", "ghost:1:x").await.expect("SADD");
    let _: () = conn.set("ghost:1:x", "x").await.expect("SET");
    let info = json!({"hostname": "fake", "pid": 1, "concurrency": 2, "queues": ["default"]});
    write_process(
        conn,
        b"fake:1:y",
        &[
            ("info", text(&info.to_string())),
            ("beat", text(&now_f64().to_string())),
        ],
    )
    .await;
    let _: () = conn.set("fake:1:y:work", "x").await.expect("SET");
    // Latency: this minute's hash is a string, the last one's is good.
    let minute = (now_f64() / 60.0) as u64;
    let _: () = conn.set(format!("wasmjobs:latency:{minute}"), "x").await.expect("SET");
    let _: () = conn
        .hset(format!("wasmjobs:latency:{}", minute - 1), "e:10:GoodJob", "3")
        .await
        .expect("HSET");
    // Limits: two keys of the wrong type, one good log.
    let _: () = conn.hset("wasmjobs:limit:p:rate", "a", "1").await.expect("HSET");
    let _: () = conn.set("wasmjobs:limit:p:overrated", "x").await.expect("SET");
    let _: () = conn.zadd("wasmjobs:limit:q:rate", "a", 1).await.expect("ZADD");
    let _: () = conn.zadd("wasmjobs:limit:q:rate", "b", 2).await.expect("ZADD");
    // Cron: a good schedule, a string, and a hash with a 100 KB field.
    let good = fields(&[
        ("name", "good"),
        ("klass", "GoodJob"),
        ("cron", "0 3 * * *"),
        ("status", "enabled"),
    ]);
    let _: () = conn.hset_multiple("cron_job:default:good", &good).await.expect("HSET");
    let _: () = conn.set("cron_job:default:str", "x").await.expect("SET");
    let big = "a".repeat(100_000);
    let oversized = fields(&[
        ("name", "big"),
        ("klass", "BigJob"),
        ("cron", "* * * * *"),
        ("description", big.as_str()),
    ]);
    let _: () = conn
        .hset_multiple("cron_job:default:big", &oversized)
        .await
        .expect("HSET");
    let _: () = conn
        .sadd(
            "cron_jobs:default",
            &["cron_job:default:good", "cron_job:default:str", "cron_job:default:big"],
        )
        .await
        .expect("SADD");
}

/// Item 4 of issue 32: one key of the wrong type (or one entry that is not
/// a job) must not take a page or `wasmjobs stats` down; each is shown as
/// unreadable and the rest is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_leave_every_page_and_stats_working() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    write_foreign_keys(&mut conn).await;
    let (_web, web_addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let pages = [
        "/",
        "/api/overview",
        "/queues",
        "/queues/default",
        "/queues/junk",
        "/queues/bin",
        "/processes",
        "/plugins",
        "/cron",
        "/scheduled",
        "/retries",
        "/dead",
    ];
    let mut bodies = HashMap::new();
    let failed: Vec<String> = pages
        .iter()
        .filter_map(|path| {
            let page = request(&web_addr, "GET", path, &[], "");
            let failed = (page.status != 200).then(|| format!("{path}: {} {}", page.status, page.body));
            bodies.insert(*path, page.body);
            failed
        })
        .collect();
    assert!(failed.is_empty(), "pages failed:\n{}", failed.join("\n"));

    let overview: Value = serde_json::from_str(&bodies["/api/overview"]).expect("JSON");
    assert_eq!(overview["enqueued"], json!(5), "default's 3 and bin's 2: {overview}");
    assert_eq!(overview["processes"], json!(1), "the fake process: {overview}");
    for (path, needle) in [
        ("/", "queue:junk"),
        ("/queues", "queue:junk"),
        ("/queues/junk", "not a list"),
        ("/retries", "not a sorted set"),
        ("/processes", "ghost:1:x"),
        ("/cron", "cron_job:default:str"),
        ("/cron", "cron_job:default:big"),
        ("/cron", "GoodJob"),
        ("/", "GoodJob"),
    ] {
        assert!(
            bodies[path].contains(needle),
            "{path} does not show {needle}:\n{}",
            bodies[path]
        );
    }
    assert_eq!(bodies["/queues/bin"].matches("<tr class=\"job\"").count(), 2);

    let cwd = tempfile::tempdir().expect("tempdir");
    let none: [(&str, &str); 0] = [];
    let json_out = wasmjobs_in(
        cwd.path(),
        &["stats", "--json", "--redis", &redis.url()],
        &none,
        Duration::from_secs(60),
    );
    assert!(
        json_out.status.success(),
        "{}",
        String::from_utf8_lossy(&json_out.stderr)
    );
    let stats: Value = serde_json::from_slice(&json_out.stdout).expect("stats JSON");
    let size = |name: &str| {
        stats["queues"]
            .as_array()
            .and_then(|queues| queues.iter().find(|q| q["name"] == json!(name)))
            .map(|q| q["size"].clone())
    };
    assert_eq!(size("default"), Some(json!(3)), "{stats}");
    assert_eq!(size("bin"), Some(json!(2)), "{stats}");
    assert_eq!(
        (stats["failed"].clone(), stats["retries"].clone()),
        (json!(0), json!(0)),
        "{stats}"
    );
    assert_eq!(stats["schedules"]["total"], json!(1), "{stats}");
    assert_eq!(stats["latency"]["GoodJob"]["execution"]["count"], json!(3), "{stats}");
    let limits = stats["limits"]["plugins"].as_array().expect("limits");
    assert!(
        limits
            .iter()
            .any(|p| p["plugin"] == json!("q") && p["starts"] == json!(2)),
        "{stats}"
    );
    let unreadable = stats["unreadable"].to_string();
    for key in [
        "queue:junk",
        "stat:failed",
        "retry",
        "paused",
        "ghost:1:x",
        "wasmjobs:cancelled",
    ] {
        assert!(unreadable.contains(key), "{key} not reported unreadable: {unreadable}");
    }
    let text_out = wasmjobs_in(
        cwd.path(),
        &["stats", "--redis", &redis.url()],
        &none,
        Duration::from_secs(60),
    );
    assert!(
        text_out.status.success(),
        "{}",
        String::from_utf8_lossy(&text_out.stderr)
    );
    let printed = String::from_utf8_lossy(&text_out.stdout);
    assert!(
        printed.contains("unreadable") && printed.contains("queue:junk"),
        "{printed}"
    );
}

/// The jobs of `queue` enqueued for a tick, by tick (epoch seconds).
async fn cron_ticks(conn: &mut Conn, queue: &str) -> Vec<i64> {
    let raw: Vec<String> = conn.lrange(format!("queue:{queue}"), 0, -1).await.expect("LRANGE");
    let mut ticks: Vec<i64> = raw
        .iter()
        .filter_map(|job| Payload::parse(job).ok())
        .filter_map(|job| job.str("cron_tick").and_then(wasmjobs::cron::parse_last_enqueue_time))
        .map(|t| t as i64)
        .collect();
    ticks.sort_unstable();
    ticks
}

/// Item 4: a string member of `cron_jobs:default` (and a schedule whose
/// claim set is a string) stops no other schedule, `/cron` renders, and
/// the cron loop says so a few times, not thousands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_cron_entry_stops_no_schedule_and_no_loop_spins() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = conn.set("cron_job:default:str", "x").await.expect("SET");
    let claims_are_a_string = fields(&[
        ("name", "broken-claims"),
        ("klass", "NoopJob"),
        ("cron", "* * * * * *"),
        ("message", r#"{"queue":"broken"}"#),
        ("status", "enabled"),
    ]);
    let _: () = conn
        .hset_multiple("cron_job:default:broken-claims", &claims_are_a_string)
        .await
        .expect("HSET");
    let _: () = conn
        .set("cron_job:default:broken-claims:enqueued", "x")
        .await
        .expect("SET");
    let _: () = conn
        .sadd(
            "cron_jobs:default",
            &["cron_job:default:str", "cron_job:default:broken-claims"],
        )
        .await
        .expect("SADD");
    let dir = plugins(&["noop"], &[]);
    let manifest = dir.path().join("noop/wasmjobs.toml");
    let base = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("{base}\n{EVERY_SECOND_SCHEDULE}")).expect("manifest");
    let mut runner = Runner::start(&redis.url(), dir.path(), &["-q", "elsewhere"]);
    runner.wait_running();
    let started = now_f64();
    let first = started.ceil() as i64 + 1;
    let deadline = Instant::now() + Duration::from_secs(30);
    while cron_ticks(&mut conn, "cron")
        .await
        .iter()
        .filter(|&&t| t >= first)
        .count()
        < 5
    {
        assert!(
            Instant::now() < deadline,
            "the every-second schedule stopped: {:?}\n{}",
            cron_ticks(&mut conn, "cron").await,
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = runner.log();
    let warnings = log.lines().filter(|l| l.contains("cron") && l.contains("WARN")).count();
    assert!(
        (1..=6).contains(&warnings),
        "{warnings} cron warnings in {:.1} s:\n{}",
        now_f64() - started,
        log.lines().take(40).collect::<Vec<_>>().join("\n")
    );
    assert!(
        log.contains("cron_job:default:str"),
        "the string member is named:\n{log}"
    );
    assert!(log.contains("broken-claims"), "the broken schedule is named:\n{log}");

    let (_web, web_addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let page = request(&web_addr, "GET", "/cron", &[], "");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("every-second") && page.body.contains("cron_job:default:str"),
        "{}",
        page.body
    );
    assert!(runner.stop().success());
}

/// Item 4: a `schedule` key of the wrong type does not stop the retries
/// (one poll read both sets in one pipeline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_schedule_key_does_not_stop_retries() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = conn.set("schedule", "a string, not a set").await.expect("SET");
    let job = Payload::new("NoopJob", vec![json!("retried")], "default", now_f64());
    let _: () = conn.zadd("retry", job.to_json(), 0).await.expect("ZADD");
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--poll-interval", "0.2"]);
    runner.wait_running();
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    // Fifteen more polls (one per 0.2 s): still said once.
    let said = || {
        let log = runner.log();
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains("schedule"))
            .count()
    };
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(said() <= 1, "{} warnings about `schedule`:\n{}", said(), runner.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(said(), 1, "the unreadable `schedule` is said once:\n{}", runner.log());
    assert!(runner.stop().success());
}

/// Item 4: an in-progress owner whose list is a string does not stop the
/// recovery of the jobs of a process that died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_in_progress_owner_does_not_stop_recovery() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    for n in 0..8 {
        let owner = format!("foreign-{n}:1:x");
        let _: () = conn.sadd("wasmjobs:inprogress", &owner).await.expect("SADD");
        let _: () = conn
            .set(format!("wasmjobs:inprogress:{owner}"), "x")
            .await
            .expect("SET");
    }
    let job = Payload::new("NoopJob", vec![json!("orphan")], "default", now_f64());
    let _: () = conn.sadd("wasmjobs:inprogress", "dead-host:1:zz").await.expect("SADD");
    let _: () = conn
        .lpush("wasmjobs:inprogress:dead-host:1:zz", job.to_json())
        .await
        .expect("LPUSH");
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success());
}

/// The set older processes registered in (`wasmjobs:inprogress`), made a
/// string by another client, does not stop the recovery of an owner in
/// `wasmjobs:holders`, whose job waits in one of its batch lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_old_owner_set_does_not_stop_recovery() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = conn.set("wasmjobs:inprogress", "junk").await.expect("SET");
    let job = Payload::new("NoopJob", vec![json!("orphan")], "default", now_f64());
    let _: () = conn.sadd("wasmjobs:holders", "dead-host:1:zz").await.expect("SADD");
    let _: () = conn
        .lpush(&held_lists("dead-host:1:zz")[3], job.to_json())
        .await
        .expect("LPUSH");
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success());
    assert!(
        runner.log().contains("skips the owners in wasmjobs:inprogress"),
        "{}",
        runner.log()
    );
    let junk: String = conn.get("wasmjobs:inprogress").await.expect("GET");
    assert_eq!(junk, "junk", "another client's key is left alone");
}

/// Bytes of the huge jobs.
const HUGE: usize = 100 << 20;

/// The first 4,000 characters of a page, for a failure message.
fn start_of(text: &str) -> String {
    text.chars().take(4_000).collect()
}

/// Item 5, its last sentence: a queue's 100 MB tail job (and a 100 MB dead
/// job) are never transferred whole by a view: the pages and `wasmjobs
/// stats` answer, show them as a preview with their size, the dashboard's
/// memory does not grow by the job's size, and the jobs can be deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_job_is_shown_as_a_preview_and_never_read_whole() {
    let redis = TestRedis::start();
    // A connection that waits for 100 MB to be written.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let mut conn = redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    let now = now_f64();
    // Only the jid is kept: a child forked from this process would count
    // the jobs' pages in its own peak RSS.
    let jid = {
        let mut queued = Payload::new("BigJob", vec![json!("q".repeat(HUGE))], "big", now - 30.0);
        // As a push writes it: last, after the args.
        queued.set_time("enqueued_at", now - 30.0);
        let _: () = conn.sadd("queues", "big").await.expect("SADD");
        let _: () = conn.lpush("queue:big", queued.to_json()).await.expect("LPUSH");
        let mut dead = Payload::new("BigJob", vec![json!("d".repeat(HUGE))], "big", now - 60.0);
        dead.set("error_message", json!("too big"));
        let _: () = conn.zadd("dead", dead.to_json(), now).await.expect("ZADD");
        queued.jid().to_owned()
    };
    let (web, web_addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let baseline = {
        assert_eq!(request(&web_addr, "GET", "/processes", &[], "").status, 200);
        web.peak_rss_kb()
    };
    let dead_page = request(&web_addr, "GET", "/dead", &[], "");
    assert_eq!(dead_page.status, 200, "{}", dead_page.body);
    let job_link = dead_page
        .body
        .split("href=\"/dead/job?key=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a link to the dead job")
        .to_owned();
    let started = Instant::now();
    for _ in 0..3 {
        for path in [
            "/",
            "/api/overview",
            "/queues",
            "/queues/big",
            "/dead",
            &format!("/dead/job?key={job_link}"),
        ] {
            let page = request(&web_addr, "GET", path, &[], "");
            assert_eq!(page.status, 200, "{path}: {}", start_of(&page.body));
            assert!(page.body.len() < 1 << 20, "{path} is {} bytes", page.body.len());
        }
    }
    let views = started.elapsed();
    let grown = web.peak_rss_kb().saturating_sub(baseline);
    eprintln!("18 views with two 100 MB jobs: {views:?}; dashboard peak RSS grew {grown} KiB over {baseline} KiB");
    assert!(grown < 40 << 10, "the dashboard's peak RSS grew by {grown} KiB");
    let queue_page = request(&web_addr, "GET", "/queues/big", &[], "").body;
    assert!(queue_page.contains(&jid), "the preview shows the jid");
    assert!(
        queue_page.contains("104857"),
        "the size is shown: {}",
        start_of(&queue_page)
    );

    // Five refreshes of `wasmjobs stats --watch`.
    let url = redis.url();
    let args = ["stats", "--json", "--watch", "0.2", "--redis", &url];
    let (printed, peak) = wasmjobs_peak_rss(&args, 5, Duration::from_secs(60));
    eprintln!("wasmjobs stats --watch, 5 refreshes with a 100 MB tail job: peak RSS {peak} KiB");
    assert!(peak < 60 << 10, "wasmjobs stats peaked at {peak} KiB");
    let last = printed.lines().last().expect("a line of stats");
    let stats: Value = serde_json::from_str(last).expect("stats JSON");
    let big = stats["queues"]
        .as_array()
        .and_then(|queues| queues.iter().find(|q| q["name"] == json!("big")).cloned())
        .expect("queue big");
    assert_eq!(big["size"], json!(1));
    let latency = big["latency_secs"].as_f64().unwrap_or(0.0);
    assert!(
        (25.0..600.0).contains(&latency),
        "the latency is read from the preview: {big}"
    );

    // Deleted from their pages.
    let browser = Browser::start("a_100_mb_job_is_shown_as_a_preview_and_never_read_whole").await;
    browser.goto(&format!("http://{web_addr}/queues/big")).await;
    browser
        .click_to_navigate(&format!("tr.job[data-jid=\"{jid}\"] button.delete"))
        .await;
    assert_eq!(
        conn.llen::<_, u64>("queue:big").await.expect("LLEN"),
        0,
        "{}",
        web.log()
    );
    browser
        .goto(&format!("http://{web_addr}/dead/job?key={job_link}"))
        .await;
    browser.click_to_navigate("button#delete").await;
    assert_eq!(conn.zcard::<_, u64>("dead").await.expect("ZCARD"), 0, "{}", web.log());
    let grown = web.peak_rss_kb().saturating_sub(baseline);
    assert!(
        grown < 40 << 10,
        "after the deletes the dashboard's peak RSS grew by {grown} KiB"
    );
}
