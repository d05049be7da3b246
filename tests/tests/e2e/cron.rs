//! Cron schedules end to end: real `wasmjobs run` processes sharing a real
//! Redis, schedules declared in a plugin's manifest or written into Redis
//! the way sidekiq-cron writes them.
//!
//! The jobs go to queues no runner fetches, so every job a tick enqueued
//! stays in its queue to be counted; each carries `cron_tick`, the tick it
//! was enqueued for, so counts are by tick time, not by when a test looked.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::cron::{iso8601, parse_last_enqueue_time};
use wasmjobs::redis::now_f64;
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::cli::{printed, wasmjobs_in};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, plugins};
use wasmjobs_e2e::sidekiq::ruby_json;
use wasmjobs_e2e::{EVERY_SECOND_SCHEDULE, eventually};

/// A copy of the noop plugin whose manifest also holds `schedules`.
fn plugin_with(schedules: &str) -> tempfile::TempDir {
    let dir = plugins(&["noop"], &[]);
    set_schedules(dir.path(), schedules);
    dir
}

/// Rewrites the noop plugin's manifest in `dir` with `schedules` appended
/// (written beside, then renamed, as a deploy does).
fn set_schedules(dir: &Path, schedules: &str) {
    let manifest = dir.join("noop/wasmjobs.toml");
    let base = std::fs::read_to_string(wasmjobs_e2e::plugins_dir().join("noop/wasmjobs.toml")).expect("manifest");
    let staging = dir.join("noop/wasmjobs.toml.tmp");
    std::fs::write(&staging, format!("{base}\n{schedules}")).expect("write manifest");
    std::fs::rename(&staging, &manifest).expect("rename manifest");
}

/// The jobs waiting in `queue`, parsed.
async fn jobs(conn: &mut redis::aio::MultiplexedConnection, queue: &str) -> Vec<Payload> {
    let raw: Vec<String> = conn.lrange(format!("queue:{queue}"), 0, -1).await.expect("LRANGE");
    raw.iter().map(|j| Payload::parse(j).expect("a valid job")).collect()
}

/// How many jobs each tick (epoch seconds) of `queue` has.
async fn ticks(conn: &mut redis::aio::MultiplexedConnection, queue: &str) -> BTreeMap<i64, usize> {
    let mut ticks = BTreeMap::new();
    for job in jobs(conn, queue).await {
        let tick = job.str("cron_tick").expect("a cron job names its tick");
        let secs = parse_last_enqueue_time(tick).expect("an ISO 8601 tick") as i64;
        *ticks.entry(secs).or_insert(0) += 1;
    }
    ticks
}

/// Waits until `queue` holds a job for a tick at or after `tick`.
async fn wait_for_tick(conn: &mut redis::aio::MultiplexedConnection, queue: &str, tick: i64, logs: &[&Runner]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if ticks(conn, queue).await.keys().next_back().is_some_and(|&t| t >= tick) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no job for tick {} in queue {queue}; logs:\n{}",
            iso8601(tick),
            logs.iter().map(|r| r.log()).collect::<Vec<_>>().join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the wall clock passes `at` (epoch seconds).
async fn wait_until(at: f64) {
    while now_f64() < at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A counter of a runner's `/metrics`, by its `outcome` label.
fn cron_ticks(addr: &str, outcome: &str) -> u64 {
    let body = http_get(addr, "/metrics");
    let needle = format!("wasmjobs_cron_ticks_total{{outcome=\"{outcome}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&needle))
        .unwrap_or_else(|| panic!("no {needle} in /metrics:\n{body}"))
        .trim()
        .parse()
        .expect("a count")
}

/// The issue's test: three processes and an every-second schedule for
/// 10 s enqueue exactly one job per tick, not three; after every process
/// restarts, no tick is enqueued twice and none while all were down.
#[tokio::test(flavor = "multi_thread")]
async fn three_processes_enqueue_each_tick_exactly_once() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugin_with(EVERY_SECOND_SCHEDULE);
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let mut runners: Vec<Runner> = addrs
        .iter()
        .map(|addr| Runner::start(&redis.url(), dir.path(), &["--metrics-addr", addr]))
        .collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    // A 10 s window of ticks, all three processes running throughout.
    let first = now_f64().ceil() as i64 + 1;
    let last = first + 9;
    wait_for_tick(&mut conn, "cron", last + 1, &runners.iter().collect::<Vec<_>>()).await;
    let counted = ticks(&mut conn, "cron").await;
    let window: Vec<(i64, usize)> = counted.range(first..=last).map(|(t, n)| (*t, *n)).collect();
    assert_eq!(
        window,
        (first..=last).map(|t| (t, 1)).collect::<Vec<_>>(),
        "every tick of the window once"
    );
    assert!(counted.values().all(|&n| n == 1), "a tick enqueued twice: {counted:?}");
    // Each process tried the ticks: the others lost them to the winner.
    let enqueued: u64 = addrs.iter().map(|a| cron_ticks(a, "enqueued")).sum();
    let lost: u64 = addrs.iter().map(|a| cron_ticks(a, "lost")).sum();
    assert!(enqueued >= 10, "{enqueued} ticks enqueued by the three processes");
    assert!(
        lost >= 10,
        "only {lost} claims lost: were the three processes competing?"
    );
    // The job is a Sidekiq job.
    let job = &jobs(&mut conn, "cron").await[0];
    assert_eq!((job.class(), job.queue()), ("NoopJob", "cron"));
    assert_eq!(job.get("args"), Some(&json!([])));
    assert_eq!(job.get("retry"), Some(&json!(true)));
    assert!(job.time("created_at").is_some() && job.time("enqueued_at").is_some());
    assert_eq!(job.str("cron_name"), Some("every-second"));

    // Everyone stops; nothing is enqueued until a process is back.
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
    let down_at = now_f64();
    let before = ticks(&mut conn, "cron").await;
    wait_until(down_at + 2.0).await;
    let up_at = now_f64();
    let mut runners: Vec<Runner> = (0..3).map(|_| Runner::start(&redis.url(), dir.path(), &[])).collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    let again = now_f64().ceil() as i64 + 3;
    wait_for_tick(&mut conn, "cron", again, &runners.iter().collect::<Vec<_>>()).await;
    let after = ticks(&mut conn, "cron").await;
    assert!(
        after.values().all(|&n| n == 1),
        "a tick enqueued twice after the restart: {after:?}"
    );
    assert!(
        before.iter().all(|(t, n)| after.get(t) == Some(n)),
        "ticks enqueued before the restart changed"
    );
    let while_down: Vec<&i64> = after
        .keys()
        .filter(|&&t| t as f64 > down_at && t as f64 <= up_at)
        .collect();
    assert!(
        while_down.is_empty(),
        "ticks enqueued while no process ran: {while_down:?}"
    );
    let since: Vec<i64> = after.range(again - 2..=again).map(|(t, _)| *t).collect();
    assert_eq!(since, [again - 2, again - 1, again], "ticks after the restart run");
}

/// After every process was down, a `catch_up = true` schedule enqueues the
/// latest missed tick once; one without enqueues none of them.
#[tokio::test(flavor = "multi_thread")]
async fn catch_up_enqueues_the_latest_missed_tick_once() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugin_with(
        r#"
[[schedule]]
name = "catching-up"
cron = "* * * * * *"
class = "NoopJob"
queue = "caught"
catch_up = true

[[schedule]]
name = "plain"
cron = "* * * * * *"
class = "NoopJob"
queue = "plain"
"#,
    );
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    let soon = now_f64().ceil() as i64 + 1;
    wait_for_tick(&mut conn, "caught", soon, &[&runner]).await;
    wait_for_tick(&mut conn, "plain", soon, &[&runner]).await;
    // A first start catches up on nothing: the schedules were new.
    assert!(!runner.log().contains("caught up"), "{}", runner.log());
    assert!(runner.stop().success());
    let down_at = now_f64();
    wait_until(down_at + 3.0).await;
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_for_log("cron: caught up on a missed tick", Duration::from_secs(60));
    let log = runner.log();
    let line = log
        .lines()
        .find(|l| l.contains("caught up on a missed tick"))
        .expect("the catch-up line");
    assert!(line.contains("catching-up"), "{line}");
    let caught_tick = line
        .split("tick=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(parse_last_enqueue_time)
        .expect("the tick in the log line") as i64;
    assert!(caught_tick as f64 > down_at + 2.0, "{line}");
    let after = caught_tick + 2;
    wait_for_tick(&mut conn, "caught", after, &[&runner]).await;
    wait_for_tick(&mut conn, "plain", after, &[&runner]).await;
    let in_gap = |ticks: &BTreeMap<i64, usize>| -> Vec<(i64, usize)> {
        ticks
            .iter()
            .filter(|&(&t, _)| t as f64 > down_at && t <= caught_tick)
            .map(|(t, n)| (*t, *n))
            .collect()
    };
    assert_eq!(
        in_gap(&ticks(&mut conn, "caught").await),
        [(caught_tick, 1)],
        "catch_up: the latest missed tick, once"
    );
    assert_eq!(
        in_gap(&ticks(&mut conn, "plain").await),
        [],
        "no catch_up: no missed tick"
    );
    assert_eq!(
        log.matches("caught up on a missed tick").count(),
        1,
        "one catch-up, for one schedule:\n{log}"
    );
}

/// `wasmjobs schedule` lists what plugins declared, with the next run; a
/// reload that drops the schedule removes it; `wasmjobs stats` counts them.
#[tokio::test(flavor = "multi_thread")]
async fn the_schedule_command_lists_schedules_and_follows_reloads() {
    let redis = TestRedis::start();
    let cwd = tempfile::tempdir().expect("tempdir");
    let url = redis.url();
    let schedule = |extra: &[&str]| {
        let mut args = vec!["schedule", "--redis", url.as_str()];
        args.extend_from_slice(extra);
        wasmjobs_in(cwd.path(), &args, &[("NO_COLOR", "1")], Duration::from_secs(30))
    };
    let none = schedule(&[]);
    assert!(none.status.success(), "{}", printed(&none));
    assert!(printed(&none).starts_with("no schedules"), "{}", printed(&none));

    let dir = plugin_with(
        r#"
[[schedule]]
name = "morning-report"
cron = "0 9 * * 1-5"
timezone = "Europe/Berlin"
class = "NoopJob"
args = [1, "two"]
queue = "reports"
"#,
    );
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let out = schedule(&[]);
        assert!(out.status.success(), "{}", printed(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("morning-report") {
            break text;
        }
        assert!(Instant::now() < deadline, "never listed:\n{text}\n{}", runner.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for part in [
        "NAME",
        "NEXT RUN",
        "0 9 * * 1-5",
        "Europe/Berlin",
        "NoopJob → reports",
        "enabled",
        "noop",
    ] {
        assert!(listed.contains(part), "{part:?} missing:\n{listed}");
    }
    let json = schedule(&["--json"]);
    let rows: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let row = &rows[0];
    assert_eq!(row["name"], "morning-report");
    assert_eq!(row["timezone"], "Europe/Berlin");
    assert_eq!(row["args"], json!([1, "two"]));
    assert_eq!(row["plugin"], "noop");
    let next = row["next_run"].as_i64().expect("a next run");
    assert!(
        next as f64 > now_f64() && (next as f64) < now_f64() + 4.0 * 86_400.0,
        "{row}"
    );

    let stats = wasmjobs_in(
        cwd.path(),
        &["stats", "--redis", url.as_str()],
        &[("NO_COLOR", "1")],
        Duration::from_secs(30),
    );
    assert!(
        printed(&stats).contains("cron schedules 1   enabled 1   from plugins 1"),
        "{}",
        printed(&stats)
    );

    // The new version of the plugin declares no schedule: it is removed.
    set_schedules(dir.path(), "");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = schedule(&[]);
        if printed(&out).starts_with("no schedules") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still listed:\n{}\n{}",
            printed(&out),
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(runner.stop().success());
}

/// A bad cron expression refuses the plugin, naming the manifest line.
#[test]
fn a_bad_cron_refuses_the_plugin() {
    let dir = plugin_with("[[schedule]]\ncron = \"*/5 * * *\"\nclass = \"NoopJob\"\n");
    let data = tempfile::tempdir().expect("tempdir");
    let plugins_dir = dir.path().to_str().expect("utf-8 path");
    let data_dir = data.path().to_str().expect("utf-8 path");
    let out = wasmjobs_in(
        dir.path(),
        &["--data-dir", data_dir, "plugins", "--plugins", plugins_dir],
        &[("NO_COLOR", "1")],
        Duration::from_secs(120),
    );
    let text = printed(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("wasmjobs.toml:") && text.contains("schedule"), "{text}");
    assert!(text.contains("has 4 fields"), "{text}");
}

/// A schedule a Ruby app registered with sidekiq-cron runs under wasmjobs:
/// the job is Sidekiq's, the hash's `last_enqueue_time` and `jid_history`
/// are kept, ticks sidekiq-cron already claimed are not enqueued again,
/// and a cron wasmjobs cannot parse is skipped with a warning.
#[tokio::test(flavor = "multi_thread")]
async fn a_sidekiq_cron_schedule_runs() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let key = "cron_job:default:ruby-report";
    let fields: Vec<(&str, &str)> = vec![
        ("name", "ruby-report"),
        ("namespace", "default"),
        ("klass", "RubyReportJob"),
        ("cron", "*/1 * * * * * UTC"),
        ("description", ""),
        ("source", "dynamic"),
        ("args", "[42]"),
        ("date_as_argument", "0"),
        (
            "message",
            r#"{"retry":5,"queue":"ruby","class":"RubyReportJob","args":[42]}"#,
        ),
        ("status", "enabled"),
        ("active_job", "0"),
        ("queue_name_prefix", ""),
        ("queue_name_delimiter", ""),
        ("retry", "5"),
        ("last_enqueue_time", ""),
        ("symbolize_args", "0"),
    ];
    let _: () = conn.hset_multiple(key, &fields).await.expect("HSET");
    let _: () = conn
        .hset_multiple(
            "cron_job:default:natural",
            &[
                ("name", "natural"),
                ("klass", "X"),
                ("cron", "every day at noon"),
                ("status", "enabled"),
            ],
        )
        .await
        .expect("HSET");
    let _: () = conn
        .sadd("cron_jobs:default", &[key, "cron_job:default:natural"])
        .await
        .expect("SADD");
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    // Ticks sidekiq-cron has already claimed: wasmjobs must not enqueue them.
    let start = now_f64().ceil() as i64;
    let claimed: Vec<i64> = (start + 2..start + 6).collect();
    for tick in &claimed {
        let _: () = conn
            .zadd(format!("{key}:enqueued"), iso8601(*tick), *tick as f64)
            .await
            .expect("ZADD");
    }
    wait_for_tick(&mut conn, "ruby", start + 7, &[&runner]).await;
    let counted = ticks(&mut conn, "ruby").await;
    assert!(counted.values().all(|&n| n == 1), "{counted:?}");
    for tick in &claimed {
        assert!(
            !counted.contains_key(tick),
            "tick {} was claimed by sidekiq-cron",
            iso8601(*tick)
        );
    }
    assert!(
        counted.contains_key(&(start + 1)) && counted.contains_key(&(start + 6)),
        "{counted:?}"
    );
    let job = jobs(&mut conn, "ruby").await.pop().expect("a job");
    assert_eq!(job.class(), "RubyReportJob");
    assert_eq!(job.get("args"), Some(&json!([42])));
    assert_eq!(job.get("retry"), Some(&json!(5)));
    assert_eq!(job.jid().len(), 24);
    let hash: HashMap<String, String> = conn.hgetall(key).await.expect("HGETALL");
    let last = parse_last_enqueue_time(&hash["last_enqueue_time"]).expect("last_enqueue_time in Ruby's format");
    assert!((last - now_f64()).abs() < 60.0, "{hash:?}");
    let history: Vec<String> = conn.lrange(format!("{key}:jid_history"), 0, -1).await.expect("LRANGE");
    assert!(history.len() <= 10 && !history.is_empty(), "{history:?}");
    let entry: Value = serde_json::from_str(&history[0]).expect("JSON");
    assert!(entry["jid"].is_string() && entry["enqueued"].is_string(), "{entry}");
    let log = runner.log();
    assert_eq!(
        log.matches("schedule skipped").count(),
        1,
        "the unparsable schedule is reported once:\n{log}"
    );
    assert!(runner.try_status().is_none(), "the runner is still running");
    assert!(runner.stop().success());
}

/// sidekiq-cron 1.x (Debian 12's ruby-sidekiq-cron 1.8, what Sidekiq 6
/// apps run) keeps schedules in `cron_jobs` and `cron_job:<name>`: its
/// schedules run under wasmjobs, ours move there once a Ruby schedule
/// shows the cluster uses it (its API lists them and their runs), and
/// `wasmjobs schedule` shows both.
#[tokio::test(flavor = "multi_thread")]
async fn sidekiq_cron_1_schedules_run_and_ours_are_written_where_it_reads_them() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut conn = redis.conn().await;
    // Before any Ruby schedule, ours go where sidekiq-cron 2.x reads them.
    let dir = plugin_with(EVERY_SECOND_SCHEDULE);
    let mut first = Runner::start(&url, dir.path(), &["-q", "default"]);
    first.wait_running();
    eventually(
        Duration::from_secs(30),
        || first.log(),
        || {
            let mut conn = conn.clone();
            async move {
                conn.exists::<_, bool>("cron_job:default:every-second")
                    .await
                    .expect("EXISTS")
            }
        },
    )
    .await;
    first.stop();
    // A Ruby app on sidekiq-cron 1.x registers one: the next runner
    // moves ours to 1.x's layout, claims and all.
    let registered = ruby_json(
        &url,
        r#"require "sidekiq/cron/job"
Sidekiq.logger = Logger.new(nil)
Sidekiq::Cron::Job.create(name: "ruby-1x", cron: "* * * * * *", class: "RubyCronJob", queue: "cron", args: ["ruby"])
puts JSON.generate(Sidekiq::Cron::Job.all.map(&:name))"#,
    );
    assert_eq!(registered, json!(["ruby-1x"]));
    let mut runner = Runner::start(&url, dir.path(), &["-q", "default"]);
    runner.wait_running();
    let start = now_f64().ceil() as i64;
    eventually(
        Duration::from_secs(30),
        || runner.log(),
        || {
            let mut conn = conn.clone();
            async move {
                let jobs = jobs(&mut conn, "cron").await;
                let after = |job: &Payload| {
                    job.str("cron_tick")
                        .and_then(parse_last_enqueue_time)
                        .is_some_and(|t| t as i64 > start)
                };
                jobs.iter().any(|j| j.class() == "RubyCronJob" && after(j))
                    && jobs.iter().any(|j| j.class() == "NoopJob" && after(j))
            }
        },
    )
    .await;
    // Ours is in 1.x's layout only, and Ruby reads it and its runs.
    let exists: (bool, bool) = redis::pipe()
        .exists("cron_job:every-second")
        .exists("cron_job:default:every-second")
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, (true, false), "moved to 1.x's layout");
    let in_v2: bool = conn
        .sismember("cron_jobs:default", "cron_job:default:every-second")
        .await
        .expect("SISMEMBER");
    assert!(!in_v2, "the 2.x copy is gone from its set");
    let seen = ruby_json(
        &url,
        r#"require "sidekiq/cron/job"
ours = Sidekiq::Cron::Job.find("every-second")
puts JSON.generate({ names: Sidekiq::Cron::Job.all.map(&:name).sort, klass: ours.klass,
  last: ours.last_enqueue_time.to_s, history: ours.jid_history_from_redis.size })"#,
    );
    assert_eq!(seen["names"], json!(["every-second", "ruby-1x"]), "{seen}");
    assert_eq!(seen["klass"], "NoopJob", "{seen}");
    assert!(!seen["last"].as_str().unwrap_or_default().is_empty(), "{seen}");
    assert!(seen["history"].as_u64() > Some(0), "{seen}");
    let cwd = tempfile::tempdir().expect("tempdir");
    let out = wasmjobs_in(
        cwd.path(),
        &["schedule", "--redis", &url, "--json"],
        &[("NO_COLOR", "1")],
        Duration::from_secs(30),
    );
    let listed: Value = serde_json::from_str(&printed(&out)).unwrap_or_else(|e| panic!("{e}: {}", printed(&out)));
    let layouts: BTreeMap<String, String> = listed
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["layout"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        layouts.get("ruby-1x").map(String::as_str),
        Some("sidekiq-cron 1"),
        "{listed}"
    );
    assert_eq!(
        layouts.get("every-second").map(String::as_str),
        Some("sidekiq-cron 1"),
        "{listed}"
    );
    runner.stop();
}
