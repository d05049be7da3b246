//! Runners serving queues spread over three Redis shards (real
//! `redis-server`s on loopback): nothing is lost while a runner is killed
//! and shards restart or go away, a shard that is down stops only its
//! queues; a Ruby app pushing with `Sidekiq::Client.via` reaches the
//! runner, and Sidekiq's Web UI on that shard lists it; cron ticks are
//! enqueued once, each on its schedule's shard.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use wasmjobs_client::Job;
use wasmjobs_client::shards::{Routes, Sharded};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{
    Runner, every_id_once_at_least, int, jobs_in_progress, lines, plugins, queued, wait_for_lines,
};
use wasmjobs_e2e::sidekiq::run_ruby;

/// Six queues over three shards: `q0`, `q1` on the default shard, `q2`,
/// `q3` on `b`, `q4`, `q5` on `c`.
const ROUTES: &str = "q2,q3=b q4,q5=c";
const QUEUES: &str = "q0,q1,q2,q3,q4,q5";

/// Three shards: the default (`a`), `b` and `c`.
struct Fleet {
    a: TestRedis,
    b: TestRedis,
    c: TestRedis,
}

impl Fleet {
    fn start() -> Self {
        Fleet {
            a: TestRedis::start(),
            b: TestRedis::start(),
            c: TestRedis::start(),
        }
    }

    /// The shard map as a deployment sets it for every process.
    fn env(&self, routes: &str) -> Vec<(String, String)> {
        vec![
            (
                "WASMJOBS_SHARDS".into(),
                format!("b={} c={}", self.b.url(), self.c.url()),
            ),
            ("WASMJOBS_ROUTES".into(), routes.into()),
        ]
    }

    /// `wasmjobs run` over the three shards.
    fn runner(&self, routes: &str, plugins: &Path, extra: &[&str]) -> Runner {
        let env = self.env(routes);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Runner::start_with_env(&env, &self.a.url(), plugins, extra)
    }

    fn shards(&self) -> [(&'static str, &TestRedis); 3] {
        [("default", &self.a), ("b", &self.b), ("c", &self.c)]
    }
}

/// The number of `chaos` jobs; `WASMJOBS_SHARD_CHAOS_JOBS` overrides.
fn chaos_jobs() -> usize {
    std::env::var("WASMJOBS_SHARD_CHAOS_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(60_000)
}

/// Job `i` goes to queue `q{i % 6}`: its shard is `i % 6 / 2` (0 the
/// default, 1 `b`, 2 `c`).
fn shard_of_job(i: usize) -> usize {
    i % 6 / 2
}

/// The issue's test: 60,000 `FileAppendJob`s pushed through the router
/// over three shards and six queues, two runners. One runner is
/// `kill -9`ed (another takes its place), shard `b` restarts (AOF on),
/// shard `c` stops for 10 s and comes back: every id is in the file,
/// nothing is left in any queue or in-progress list of any shard, and the
/// healthy shards' jobs kept running while `c` was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_over_three_shards_loses_nothing_and_a_down_shard_stops_only_its_queues() {
    let n = chaos_jobs();
    let mut fleet = Fleet::start();
    let dir = plugins(&["file-append"], &[]);
    let file = dir.path().join("file-append/data/chaos.txt");

    // Pushed through the Rust client's router, as an app would.
    let routes = Routes::new(
        ["default", "b", "c"].map(String::from).to_vec(),
        [("q2", "b"), ("q3", "b"), ("q4", "c"), ("q5", "c")].map(|(q, s)| (q.to_owned(), s.to_owned())),
    )
    .expect("routes");
    let urls = [fleet.a.url(), fleet.b.url(), fleet.c.url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut client = Sharded::connect(&urls, routes).await.expect("connect the client");
    for chunk in (0..n).collect::<Vec<_>>().chunks(6_000) {
        let mut payloads: Vec<_> = chunk
            .iter()
            .map(|i| {
                Job::new("FileAppendJob")
                    .queue(format!("q{}", i % 6))
                    .args(json!(["chaos.txt", i]))
                    .to_payload(wasmjobs::redis::now_f64())
                    .expect("payload")
                    .0
            })
            .collect();
        client.push_bulk(&mut payloads).await.expect("push_bulk");
    }
    for (name, redis) in fleet.shards() {
        let waiting: u64 = queued(&mut redis.conn().await).await.iter().map(|(_, n)| n).sum();
        assert_eq!(waiting as usize, n / 3, "shard {name} holds a third of the jobs");
    }

    let started = Instant::now();
    let flags = ["--concurrency", "20", "--queues", QUEUES];
    let mut live: Vec<Runner> = (0..2).map(|_| fleet.runner(ROUTES, dir.path(), &flags)).collect();
    for runner in &mut live {
        runner.wait_running();
    }
    let timeout = Duration::from_secs(180).max(Duration::from_millis(n as u64 * 3));
    let deadline = started + timeout;
    let progress = |live: &mut Vec<Runner>, at: usize| wait_for_lines(live, &file, at, n, deadline, timeout);

    let done = progress(&mut live, n / 5);
    let mut killed = live.remove(0);
    killed.signal("KILL");
    killed.wait(Duration::from_secs(10));
    eprintln!("killed a runner at {done} lines ({:?})", started.elapsed());
    let mut replacement = fleet.runner(ROUTES, dir.path(), &flags);
    replacement.wait_running();
    live.push(replacement);

    let done = progress(&mut live, 2 * n / 5);
    fleet.b.restart();
    eprintln!("restarted shard b at {done} lines ({:?})", started.elapsed());

    let done = progress(&mut live, 3 * n / 5);
    fleet.c.stop();
    eprintln!("stopped shard c at {done} lines ({:?})", started.elapsed());
    // For 10 s, in four windows: the healthy shards' jobs keep running
    // (or are all done).
    let healthy_done = || {
        lines(&file)
            .iter()
            .filter(|line| line.parse::<usize>().is_ok_and(|i| shard_of_job(i) < 2))
            .count()
    };
    let healthy_total = (0..n).filter(|&i| shard_of_job(i) < 2).count();
    let mut before = healthy_done();
    for window in 0..4 {
        let end = Instant::now() + Duration::from_millis(2_500);
        let mut now_done = before;
        while Instant::now() < end {
            for runner in live.iter_mut() {
                if let Some(status) = runner.try_status() {
                    panic!("a runner exited while shard c was down ({status}):\n{}", runner.log());
                }
            }
            now_done = healthy_done();
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            now_done > before || now_done >= healthy_total,
            "window {window} of shard c's outage: the healthy shards' jobs stopped at {now_done} of {healthy_total}\n{}",
            live.iter().map(Runner::log).collect::<String>()
        );
        before = now_done;
    }
    fleet.c.start_again();
    eprintln!(
        "started shard c again at {} lines ({:?})",
        lines(&file).len(),
        started.elapsed()
    );

    // Every id in the file; nothing queued or held on any shard.
    let mut conns = Vec::new();
    for (name, redis) in fleet.shards() {
        conns.push((name, redis.conn().await));
    }
    loop {
        for runner in live.iter_mut() {
            if let Some(status) = runner.try_status() {
                panic!("a runner exited ({status}):\n{}", runner.log());
            }
        }
        let ids: HashSet<String> = lines(&file).into_iter().collect();
        let mut left = Vec::new();
        for (name, conn) in &mut conns {
            let waiting = queued(conn).await;
            let held = jobs_in_progress(conn).await;
            if !waiting.is_empty() || held > 0 {
                left.push(format!("shard {name}: queued {waiting:?}, {held} in progress"));
            }
        }
        if ids.len() >= n && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {timeout:?}: {} of {n} ids; {left:?}\n{}",
            ids.len(),
            live.iter().map(Runner::log).collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (all, duplicates) = every_id_once_at_least(&file, n);
    let mut processed = 0;
    for (name, conn) in &mut conns {
        for set in ["retry", "dead"] {
            let members: Vec<String> = conn.zrange(set, 0, -1).await.expect("ZRANGE");
            assert!(members.is_empty(), "shard {name}: jobs went to {set}: {members:?}");
        }
        assert_eq!(int(conn, "stat:failed").await, 0, "shard {name}");
        // Each shard counts its own jobs (re-runs included), less what
        // the runner killed with SIGKILL still owed: the counts of its last
        // 10 ms at most (runner/owed.rs), far below a twentieth.
        let on_shard = int(conn, "stat:processed").await;
        assert!(
            on_shard as usize >= n / 3 - n / 60,
            "shard {name} counted {on_shard} processed, not its third"
        );
        processed += on_shard;
    }
    eprintln!(
        "sharded chaos: {n} jobs in {:?}: {all} lines, {duplicates} duplicates, processed {processed}",
        started.elapsed()
    );
    for runner in &mut live {
        assert!(runner.stop().success(), "{}", runner.log());
    }
    assert!(
        live.iter()
            .any(|runner| runner.log().contains("shard c does not answer")),
        "no runner said that shard c was down"
    );
}

/// A Ruby app pushes to shard `b` with `Sidekiq::Client.via`; the runner
/// serving every shard runs the job there, and Sidekiq's Web UI mounted
/// on `b` lists the runner as a process of that shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ruby_client_via_a_shard_reaches_the_runner_and_that_shards_web_ui_lists_it() {
    let fleet = Fleet::start();
    let dir = plugins(&["file-append"], &[]);
    let file = dir.path().join("file-append/data/via.txt");
    let mut runner = fleet.runner("mail=b video=c", dir.path(), &["--queues", "default,mail,video"]);
    runner.wait_running();

    let pushed = run_ruby(
        r#"require "sidekiq"
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("DEFAULT_URL") } }
shard_b = Sidekiq::RedisConnection.create(url: ENV.fetch("SHARD_URL"))
jid = Sidekiq::Client.via(shard_b) do
  Sidekiq::Client.push("class" => "FileAppendJob", "queue" => "mail", "args" => ["via.txt", "from ruby"])
end
puts jid"#,
        &[("DEFAULT_URL", &fleet.a.url()), ("SHARD_URL", &fleet.b.url())],
    );
    assert_eq!(pushed.len(), 24, "a jid: {pushed}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lines(&file).contains(&"from ruby".to_owned()) {
        assert!(Instant::now() < deadline, "the job never ran:\n{}", runner.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut a, mut b) = (fleet.a.conn().await, fleet.b.conn().await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while int(&mut b, "stat:processed").await < 1 {
        assert!(
            Instant::now() < deadline,
            "shard b never counted the job:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        int(&mut a, "stat:processed").await,
        0,
        "the job was counted on the default shard"
    );

    // Sidekiq's Web UI on shard b: its Busy page and its API list the
    // runner, serving b's queue.
    let page = run_ruby(
        r#"require "sidekiq"; require "sidekiq/api"; require "sidekiq/web"; require "rack/mock"; require "json"
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("SHARD_URL") } }
require "rack/session/cookie"
app = Rack::Builder.new do
  use Rack::Session::Cookie, secret: "s" * 64, same_site: true
  run Sidekiq::Web
end
busy = Rack::MockRequest.new(app).get("/busy")
raise "Busy page: HTTP #{busy.status}" unless busy.status == 200
processes = Sidekiq::ProcessSet.new.map { |p| { "identity" => p["identity"], "queues" => p["queues"] } }
puts JSON.generate({ "processes" => processes, "busy" => busy.body })"#,
        &[("SHARD_URL", &fleet.b.url())],
    );
    let page: serde_json::Value = serde_json::from_str(&page).expect("JSON from ruby");
    let processes = page["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "one process on shard b: {processes:?}");
    let identity = processes[0]["identity"].as_str().expect("identity");
    assert_eq!(processes[0]["queues"], json!(["mail"]), "b's queues only");
    let pid = identity.split(':').nth(1).expect("hostname:pid:nonce");
    assert_eq!(pid, runner.pid().to_string(), "the runner's process");
    let busy = page["busy"].as_str().expect("the Busy page");
    assert!(busy.contains(pid), "the Busy page does not list pid {pid}:\n{busy}");
    assert!(busy.contains("mail"), "the Busy page does not show queue mail");
    assert!(runner.stop().success(), "{}", runner.log());
}

/// Three every-second schedules, one per shard's queue, two runners: each
/// tick of each schedule is enqueued once, on the shard of its queue; each
/// schedule is registered only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_over_three_shards_and_two_runners_enqueues_each_tick_once() {
    let fleet = Fleet::start();
    let dir = plugins(&["noop"], &[]);
    let manifest = dir.path().join("noop/wasmjobs.toml");
    let mut text = std::fs::read_to_string(&manifest).expect("manifest");
    for shard in ["a", "b", "c"] {
        text.push_str(&format!(
            "\n[[schedule]]\nname = \"tick-{shard}\"\ncron = \"*/1 * * * * *\"\nclass = \"NoopJob\"\nqueue = \"cron-{shard}\"\n"
        ));
    }
    std::fs::write(&manifest, text).expect("write manifest");
    // The runners serve a queue on every shard, not the cron queues: the
    // ticks stay there to be counted.
    let routes = "cron-b,work-b=b cron-c,work-c=c";
    let flags = ["--queues", "default,work-b,work-c"];
    let mut runners: Vec<Runner> = (0..2).map(|_| fleet.runner(routes, dir.path(), &flags)).collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    let first = wasmjobs::redis::now_f64().ceil() as i64 + 2;
    let last = first + 5;
    for ((name, redis), queue) in fleet.shards().into_iter().zip(["cron-a", "cron-b", "cron-c"]) {
        let mut conn = redis.conn().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ticks = ticks(&mut conn, queue).await;
            if ticks.keys().next_back().is_some_and(|&t| t > last) {
                let window: Vec<(i64, usize)> = ticks.range(first..=last).map(|(t, n)| (*t, *n)).collect();
                assert_eq!(
                    window,
                    (first..=last).map(|t| (t, 1)).collect::<Vec<_>>(),
                    "shard {name}: every tick of {queue} once"
                );
                assert!(ticks.values().all(|&n| n == 1), "shard {name}: a tick twice: {ticks:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "shard {name}: no tick after {last} in {queue}:\n{}",
                runners.iter().map(Runner::log).collect::<String>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Each schedule lives on its queue's shard only; no cron queue
    // appears on another shard.
    for (name, redis) in fleet.shards() {
        let mut conn = redis.conn().await;
        let own = format!("tick-{}", if name == "default" { "a" } else { name });
        let schedules: Vec<String> = conn.smembers("cron_jobs:default").await.expect("SMEMBERS");
        assert_eq!(
            schedules,
            [format!("cron_job:default:{own}")],
            "shard {name} holds its own schedule only"
        );
        let queues: Vec<String> = queued(&mut conn).await.into_iter().map(|(q, _)| q).collect();
        let own_queue = format!("queue:cron-{}", &own[5..]);
        assert_eq!(queues, [own_queue], "shard {name}'s queues");
    }
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
}

/// How many jobs each tick (epoch seconds) of `queue` has.
async fn ticks(conn: &mut MultiplexedConnection, queue: &str) -> BTreeMap<i64, usize> {
    let raw: Vec<String> = conn.lrange(format!("queue:{queue}"), 0, -1).await.expect("LRANGE");
    let mut ticks = BTreeMap::new();
    for job in raw {
        let job: serde_json::Value = serde_json::from_str(&job).expect("a job");
        let tick = job["cron_tick"].as_str().expect("a cron job names its tick");
        let secs = wasmjobs::cron::parse_last_enqueue_time(tick).expect("an ISO 8601 tick") as i64;
        *ticks.entry(secs).or_insert(0) += 1;
    }
    ticks
}

/// `wasmjobs run --web` over three shards, as a visitor uses it in a real
/// browser: `/shards` shows every shard's health and counts; each shard's
/// pages are its own (a queue of shard `b` is listed, browsed and paused
/// under `/shard/b`, and the pause lands on `b`); a shard that stops is
/// shown down while the others are still shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_and_each_shards_own_pages() {
    use wasmjobs_e2e::browser::Browser;
    use wasmjobs_e2e::dashboard::wait_listening;

    let mut fleet = Fleet::start();
    let dir = plugins(&["noop"], &[]);
    let mut runner = fleet.runner(
        "mail,reports=b video=c",
        dir.path(),
        &[
            "--queues",
            "default,mail,video",
            "--concurrency",
            "10",
            "--web",
            "127.0.0.1:0",
        ],
    );
    runner.wait_running();
    let base = format!("http://{}", wait_listening(|| runner.log(), || None));
    // Three jobs wait on b, in a queue no process serves.
    let mut b = fleet.b.conn().await;
    let payloads: Vec<String> = (0..3)
        .map(|_| {
            Job::new("NoopJob")
                .queue("reports")
                .to_payload(wasmjobs::redis::now_f64())
                .expect("payload")
                .0
                .to_json()
        })
        .collect();
    for payload in &payloads {
        let _: () = b.lpush("queue:reports", payload).await.expect("LPUSH");
    }
    let _: () = b.sadd("queues", "reports").await.expect("SADD");

    let browser = Browser::start("the_dashboard_shows_the_fleet_and_each_shards_own_pages").await;
    browser.goto(&format!("{base}/shards")).await;
    assert_eq!(browser.text("#shards-up").await.trim(), "3");
    for name in ["default", "b", "c"] {
        let health = browser.text(&format!("tr.shard[data-shard=\"{name}\"] .health")).await;
        assert_eq!(health.trim(), "up", "shard {name}");
    }
    assert_eq!(browser.text("tr.shard[data-shard=\"b\"] .enqueued").await.trim(), "3");
    assert_eq!(browser.text("#fleet-enqueued").await.trim(), "3");
    // One runner registered on three shards: its 10 slots count once.
    assert_eq!(browser.text("#fleet-capacity").await.trim(), "10");

    // Shard b's own pages.
    browser.click_to_navigate("tr.shard[data-shard=\"b\"] a").await;
    assert_eq!(browser.path().await, "/shard/b");
    assert_eq!(browser.text("#shard").await.trim(), "Shard: b");
    browser
        .click_to_navigate("header nav a[href=\"/shard/b/queues\"]")
        .await;
    browser.click_to_navigate("tr.queue[data-queue=\"reports\"] a").await;
    assert_eq!(browser.path().await, "/shard/b/queues/reports");
    assert_eq!(browser.find_all("tr.job").await.len(), 3);
    browser.click_to_navigate("button#pause").await;
    assert_eq!(browser.path().await, "/shard/b/queues/reports");
    assert_eq!(browser.text("#queue-state").await.trim(), "paused");
    let paused_on_b: bool = b.sismember("paused", "reports").await.expect("SISMEMBER");
    let paused_on_a: bool = fleet
        .a
        .conn()
        .await
        .sismember("paused", "reports")
        .await
        .expect("SISMEMBER");
    assert!(paused_on_b && !paused_on_a, "the pause landed on b only");
    // Its processes page lists the runner, serving b's queue.
    browser.goto(&format!("{base}/shard/b/processes")).await;
    let pid = runner.pid().to_string();
    let listed = browser.text("main").await;
    assert!(
        listed.contains(&pid) && listed.contains("mail"),
        "b's processes:\n{listed}"
    );

    // A shard that stops is shown down; the others still are.
    fleet.c.stop();
    browser.goto(&format!("{base}/shards")).await;
    assert_eq!(browser.text("#shards-up").await.trim(), "2");
    assert_eq!(browser.text("tr.shard[data-shard=\"c\"] .health").await.trim(), "DOWN");
    assert_eq!(browser.text("tr.shard[data-shard=\"b\"] .health").await.trim(), "up");
    drop(browser);
    assert!(runner.stop().success(), "{}", runner.log());
}

/// A runner waiting on two shards whose wait one shard's job ends does
/// not keep blocking on the other: with its one slot busy, a job pushed
/// to the other shard stays in its queue, for any runner to take, instead
/// of being moved into this runner's in-progress list (until `392aee5`
/// the other shard's `BLMOVE` stayed blocked up to 15 s and took it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_won_on_one_shard_stops_waiting_on_the_others() {
    let fleet = Fleet::start();
    let dir = plugins(&[], &["chaos"]);
    let mut runner = fleet.runner(
        "mail=b",
        dir.path(),
        &["--queues", "default,mail", "--concurrency", "1"],
    );
    runner.wait_running();
    let (mut a, mut b) = (fleet.a.conn().await, fleet.b.conn().await);
    // Idle: the runner blocks on both shards.
    let blocked_on = |conn: MultiplexedConnection| async move {
        let mut conn = conn;
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .expect("CLIENT LIST");
        // Blocked now: flag `b` (`cmd` is only the last command run).
        clients
            .lines()
            .filter(|line| {
                line.contains("cmd=blmove")
                    && line
                        .split(' ')
                        .any(|field| field.strip_prefix("flags=").is_some_and(|flags| flags.contains('b')))
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while blocked_on(b.clone()).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the runner never blocked on shard b:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A long job on the default shard takes the one slot...
    let busy = Job::new("ChaosJob")
        .args(json!(["sleep", 8_000]))
        .to_payload(wasmjobs::redis::now_f64())
        .expect("payload")
        .0;
    wasmjobs_client::push::push_bulk(&mut a, &mut [busy])
        .await
        .expect("push");
    let deadline = Instant::now() + Duration::from_secs(20);
    while jobs_in_progress(&mut a).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the long job never started:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and the wait on b ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    while blocked_on(b.clone()).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the runner still blocks on shard b with no free slot:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mail = Job::new("ChaosJob")
        .queue("mail")
        .args(json!(["ok"]))
        .to_payload(wasmjobs::redis::now_f64())
        .expect("payload")
        .0;
    wasmjobs_client::push::push_bulk(&mut b, &mut [mail])
        .await
        .expect("push");
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(2) {
        assert_eq!(jobs_in_progress(&mut b).await, 0, "a busy runner took b's job");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(runner.stop().success(), "{}", runner.log());
}

/// A schedule whose queue is on a shard that is down when the runner
/// starts is registered there once the shard answers, and its ticks run
/// (until `392aee5` the registration was tried once, at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_reaches_its_shard_when_the_shard_comes_back() {
    let mut fleet = Fleet::start();
    let dir = plugins(&["noop"], &[]);
    let manifest = dir.path().join("noop/wasmjobs.toml");
    let mut text = std::fs::read_to_string(&manifest).expect("manifest");
    text.push_str(
        "\n[[schedule]]\nname = \"tick-c\"\ncron = \"*/1 * * * * *\"\nclass = \"NoopJob\"\nqueue = \"cron-c\"\n",
    );
    std::fs::write(&manifest, text).expect("write manifest");
    fleet.c.stop();
    let mut runner = fleet.runner("cron-c,work-c=c", dir.path(), &["--queues", "default,work-c"]);
    runner.wait_running();
    runner.wait_for_log("schedules not registered", Duration::from_secs(60));
    fleet.c.start_again();
    let mut c = fleet.c.conn().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let schedules: Vec<String> = c.smembers("cron_jobs:default").await.expect("SMEMBERS");
        let ticks = ticks(&mut c, "cron-c").await;
        if schedules == ["cron_job:default:tick-c"] && !ticks.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shard c has schedules {schedules:?} and ticks {ticks:?}:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(runner.stop().success(), "{}", runner.log());
}
