//! The web dashboard in a real browser: Debian's headless Chromium, driven
//! over WebDriver (`wasmjobs_e2e::browser`), against a real redis-server and
//! real `wasmjobs run --web` / `wasmjobs web` processes. Plus what a browser
//! cannot show: a POST without the CSRF token, and a bind beyond loopback
//! without credentials.
//!
//! The pages are read through the selectors the dashboard promises
//! (`#processed`, `tr.job[data-jid=…]`, `button#retry-now`, …). On a
//! failure each test leaves screenshots and the HTML of the pages it acted
//! on in `target/web-screenshots/`.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::browser::Browser;
use wasmjobs_e2e::dashboard::{Web, post_form, request, wait_listening};
use wasmjobs_e2e::eventually;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, int, plugins, push, wait_processed, zset};

/// A job's args that would run script if the dashboard rendered them as HTML.
const SCRIPT: &str = "<script>alert(1)</script>";
const IMG: &str = "<img src=x onerror=alert(2)>";

/// `wasmjobs run --web 127.0.0.1:0` plus `extra`, running; returns it and
/// the dashboard's base URL.
fn runner_with_web(redis: &TestRedis, plugins: &Path, extra: &[&str]) -> (Runner, String) {
    let mut args = vec!["--web", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut runner = Runner::start(&redis.url(), plugins, &args);
    runner.wait_running();
    let addr = wait_listening(|| runner.log(), || None);
    (runner, format!("http://{addr}"))
}

/// A number the page shows as plain digits.
fn digits(text: &str) -> u64 {
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a plain number: {text:?}"))
}

/// The CSS selector of a job's row.
fn row(jid: &str) -> String {
    format!("tr.job[data-jid=\"{jid}\"]")
}

/// Whether the sorted set `key` holds the job `jid`.
async fn in_set(conn: &mut redis::aio::MultiplexedConnection, key: &str, jid: &str) -> bool {
    zset(conn, key).await.iter().any(|p| p.jid() == jid)
}

/// A job as it lies in the dead set after its last failure.
fn dead_job(class: &str, args: Vec<Value>, error: &str) -> Payload {
    let now = wasmjobs::redis::now_f64();
    let mut job = Payload::new(class, args, "default", now - 3_600.0);
    job.set("retry_count", json!(25));
    job.set("error_class", json!("RuntimeError"));
    job.set("error_message", json!(error));
    job.set("failed_at", json!(now - 600.0));
    job.set("retried_at", json!(now - 600.0));
    job
}

/// Puts `job` into the sorted set `key` (scored now).
async fn zadd(conn: &mut redis::aio::MultiplexedConnection, key: &str, job: &Payload, score: f64) {
    let _: () = conn.zadd(key, job.to_json(), score).await.expect("ZADD");
}

/// Whether the queue `name` is in the paused set.
async fn paused(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    conn.sismember("paused", name).await.expect("SISMEMBER")
}

/// The number of paused queues a runner's `/metrics` shows.
fn paused_gauge(addr: &str) -> Option<u64> {
    http_get(addr, "/metrics")
        .lines()
        .find_map(|line| line.strip_prefix("wasmjobs_queues_paused "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
}

/// Waits until the runner with metrics at `addr` reports `n` paused queues.
async fn wait_paused_gauge(addr: &str, n: u64) {
    eventually(
        Duration::from_secs(5),
        || format!("the runner to report {n} paused queues"),
        || {
            let addr = addr.to_owned();
            async move {
                tokio::task::spawn_blocking(move || paused_gauge(&addr))
                    .await
                    .ok()
                    .flatten()
                    == Some(n)
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_count_goes_up_live() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &[]);
    let browser = Browser::start("overview_count_goes_up_live").await;

    browser.goto(&format!("{base}/")).await;
    browser.find("#chart").await;
    assert_eq!(digits(&browser.text("#failed").await), 0);
    let mut seen = vec![digits(&browser.text("#processed").await)];
    assert_eq!(seen[0], 0, "nothing has run yet");
    // From here on the page is only read: a reload would lose this mark.
    browser.mark_page().await;
    for round in 1..=3 {
        push(&mut conn, "NoopJob", "default", (0..5).map(|_| json!([])).collect()).await;
        let total = round * 5;
        wait_processed(&mut conn, total, Duration::from_secs(30), || runner.log()).await;
        let shown = browser
            .wait_text("#processed", Duration::from_secs(10), |text| {
                text.trim().parse::<u64>().is_ok_and(|n| n >= total)
            })
            .await;
        seen.push(digits(&shown));
    }
    assert!(
        browser.page_is_marked().await,
        "the overview was reloaded: its count must update in place"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "the count went {seen:?}");
    assert_eq!(seen.last(), Some(&15), "the count went {seen:?}");
    assert_eq!(digits(&browser.text("#failed").await), 0);

    // What the page polls.
    let api = request(&base["http://".len()..], "GET", "/api/overview", &[], "");
    assert_eq!(api.status, 200, "{api:?}");
    let overview: Value = serde_json::from_str(&api.body).expect("JSON from /api/overview");
    assert_eq!(overview["processed"], json!(15), "{overview}");
    assert_eq!(overview["failed"], json!(0), "{overview}");

    // A queue no live process fetches is flagged; the served one is not.
    push(&mut conn, "NoopJob", "nobody", vec![json!([])]).await;
    browser.goto(&format!("{base}/")).await;
    let flagged = browser.text("tr.queue[data-queue=\"nobody\"] .state.unserved").await;
    assert!(flagged.contains("no live process serves it"), "{flagged}");
    assert!(
        browser
            .try_find("tr.queue[data-queue=\"default\"] .state.unserved")
            .await
            .is_none(),
        "the runner serves default"
    );

    // A job of a class no plugin serves never executes: its row counts it
    // by its queue latency, not as 0 jobs.
    push(&mut conn, "NobodysJob", "default", vec![json!([])]).await;
    let unserved = "tr.latency[data-class=\"(unserved)\"] td.jobs";
    browser
        .wait_for(
            Duration::from_secs(30),
            || format!("the (unserved) row after the next heartbeat:\n{}", runner.log()),
            async |browser: &Browser| {
                browser.goto(&format!("{base}/")).await;
                browser.try_find(unserved).await.is_some()
            },
        )
        .await;
    assert_eq!(digits(&browser.text(unserved).await), 1);
    assert_eq!(
        digits(&browser.text("tr.latency[data-class=\"NoopJob\"] td.jobs").await),
        15
    );
    drop(browser);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_open_with_the_last_hour_and_the_days_before() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let now = wasmjobs::redis::now_f64();
    let minute = (now / 60.0) as u64;
    let date = |days_ago: f64| {
        let secs = now - days_ago * 86_400.0;
        let (y, m, d) = wasmjobs::time::civil_from_days((secs / 86_400.0).floor() as i64);
        format!("{y:04}-{m:02}-{d:02}")
    };
    // What Sidekiq (or an earlier run) left: a busy day three days ago, a
    // minute ten minutes ago; and a key some client wrote with another type.
    let _: () = conn
        .set(format!("stat:processed:{}", date(3.0)), 500)
        .await
        .expect("SET");
    let _: () = conn.set(format!("stat:failed:{}", date(3.0)), 20).await.expect("SET");
    let _: () = conn
        .hset_multiple(
            format!("wasmjobs:stat:minute:{}", minute - 10),
            &[("processed", 120), ("failed", 6)],
        )
        .await
        .expect("HSET");
    let _: () = conn
        .hset(format!("stat:processed:{}", date(5.0)), "x", 1)
        .await
        .expect("HSET");

    let dir = plugins(&["noop"], &[]);
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &[]);
    push(&mut conn, "NoopJob", "default", (0..7).map(|_| json!([])).collect()).await;
    wait_processed(&mut conn, 7, Duration::from_secs(30), || runner.log()).await;

    let history = || {
        let api = request(&base["http://".len()..], "GET", "/api/history?days=7", &[], "");
        assert_eq!(api.status, 200, "{api:?}");
        serde_json::from_str::<Value>(&api.body).expect("JSON from /api/history")
    };
    // Each runner adds its jobs to the minute's counters with its next
    // heartbeat (every 10 s).
    let counted = |history: &Value| -> u64 {
        history["minutes"].as_array().map_or(0, |m| {
            m[m.len().saturating_sub(3)..]
                .iter()
                .map(|m| m["processed"].as_u64().unwrap_or(0))
                .sum()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let history = loop {
        let history = history();
        if counted(&history) >= 7 || Instant::now() > deadline {
            break history;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(counted(&history), 7, "the runner counts its jobs per minute: {history}");
    let days = history["days"].as_array().expect("days");
    assert_eq!(days.len(), 7, "{history}");
    // Found by their date and time, not their place: the window ends at the
    // minute (and the day) the request was served in, which may be a later
    // one than the test's start.
    let day = |date: &str| days.iter().find(|d| d["date"] == json!(date)).cloned();
    assert_eq!(
        day(&date(3.0)),
        Some(json!({"date": date(3.0), "processed": 500, "failed": 20})),
        "{history}"
    );
    let processed: u64 = days.iter().filter_map(|d| d["processed"].as_u64()).sum();
    assert_eq!(processed, 500 + 7, "that day's and today's runs: {history}");
    assert_eq!(
        day(&date(5.0)).map(|d| d["processed"].clone()),
        Some(json!(0)),
        "the hash read as zero: {history}"
    );
    assert!(history["unreadable"].to_string().contains(&date(5.0)), "{history}");
    let minutes = history["minutes"].as_array().expect("minutes");
    assert_eq!(minutes.len(), 60, "{history}");
    let earlier = (minute - 10) * 60;
    assert_eq!(
        minutes.iter().find(|m| m["t"] == json!(earlier)),
        Some(&json!({"t": earlier, "processed": 120, "failed": 6})),
        "{history}"
    );

    let browser = Browser::start("the_charts_open_with_the_last_hour").await;
    browser.goto(&format!("{base}/?days=7")).await;
    // Drawn on open: the 59 minutes before this one (then a point a
    // second) and 7 days.
    let points = |id: &str| format!("return Number(document.getElementById('{id}').getAttribute('data-points'))");
    browser
        .wait_for(
            Duration::from_secs(10),
            || "the charts to be drawn".to_owned(),
            async |browser: &Browser| {
                browser
                    .execute(&points("chart"))
                    .await
                    .as_u64()
                    .is_some_and(|n| n >= 59)
                    && browser.execute(&points("history")).await.as_u64() == Some(7)
            },
        )
        .await;
    assert!(
        !browser.find_all("#history canvas").await.is_empty(),
        "the history is drawn"
    );
    assert!(
        !browser.find_all("#chart canvas").await.is_empty(),
        "the last hour is drawn"
    );
    drop(browser);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_job_is_retried_from_its_page_and_runs() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    // A job of a class that succeeds, dead after (say) a bug since fixed.
    let job = dead_job("NoopJob", vec![json!("again")], "it broke before the fix");
    let jid = job.jid().to_owned();
    zadd(&mut conn, "dead", &job, wasmjobs::redis::now_f64()).await;
    let dir = plugins(&["noop"], &[]);
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &[]);
    let browser = Browser::start("dead_job_is_retried_from_its_page_and_runs").await;

    browser.goto(&format!("{base}/dead")).await;
    assert_eq!(browser.text(&format!("{} td.class", row(&jid))).await.trim(), "NoopJob");
    // Its retry count, as Sidekiq Web's "Retry Count" column shows it.
    assert_eq!(browser.text(&format!("{} td.retries", row(&jid))).await.trim(), "25");
    browser.click_to_navigate(&format!("{} a.job-link", row(&jid))).await;
    let payload = browser.text("pre#payload").await;
    assert!(payload.contains(&jid), "{payload}");
    let error = browser.text("pre#error").await;
    assert!(error.contains("it broke before the fix"), "{error}");
    assert_eq!(int(&mut conn, "stat:processed").await, 0);

    browser.click_to_navigate("button#retry-now").await;
    eventually(
        Duration::from_secs(30),
        || format!("{jid} to leave the dead set and run:\n{}", runner.log()),
        || {
            let mut conn = conn.clone();
            let jid = jid.clone();
            async move { !in_set(&mut conn, "dead", &jid).await && int(&mut conn, "stat:processed").await >= 1 }
        },
    )
    .await;
    assert_eq!(int(&mut conn, "stat:processed").await, 1);
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    browser.goto(&format!("{base}/dead")).await;
    assert!(browser.try_find(&row(&jid)).await.is_none(), "still listed as dead");
    drop(browser);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_is_paused_and_resumed_from_the_page() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let metrics = free_addr();
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &["--metrics-addr", &metrics]);
    // The queue exists (it has had a job), as users find it.
    push(&mut conn, "ChaosJob", "default", vec![json!(["ok"])]).await;
    wait_processed(&mut conn, 1, Duration::from_secs(30), || runner.log()).await;
    let browser = Browser::start("queue_is_paused_and_resumed_from_the_page").await;
    let page = format!("{base}/queues/default");

    browser.goto(&format!("{base}/queues")).await;
    browser.click_to_navigate("tr.queue[data-queue=\"default\"] a").await;
    assert_eq!(browser.path().await, "/queues/default");
    assert_eq!(browser.text("#queue-state").await.trim(), "active");
    assert!(
        browser.try_find("button#resume").await.is_none(),
        "an active queue offers resume"
    );

    browser.click_to_navigate("button#pause").await;
    eventually(
        Duration::from_secs(5),
        || "default in the paused set".into(),
        || {
            let mut conn = conn.clone();
            async move { paused(&mut conn, "default").await }
        },
    )
    .await;
    browser.goto(&page).await;
    assert_eq!(browser.text("#queue-state").await.trim(), "paused");
    assert!(
        browser.try_find("button#pause").await.is_none(),
        "a paused queue offers pause"
    );

    // The runner honours it: jobs pushed now stay queued.
    wait_paused_gauge(&metrics, 1).await;
    let jids = push(
        &mut conn,
        "ChaosJob",
        "default",
        (0..5).map(|_| json!(["ok"])).collect(),
    )
    .await;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(2) {
        assert_eq!(
            conn.llen::<_, u64>("queue:default").await.expect("LLEN"),
            5,
            "a job of the paused queue was fetched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(int(&mut conn, "stat:processed").await, 1);
    browser.goto(&page).await;
    for jid in &jids {
        browser.find(&row(jid)).await;
    }

    browser.click_to_navigate("button#resume").await;
    eventually(
        Duration::from_secs(5),
        || "default out of the paused set".into(),
        || {
            let mut conn = conn.clone();
            async move { !paused(&mut conn, "default").await }
        },
    )
    .await;
    wait_processed(&mut conn, 6, Duration::from_secs(30), || runner.log()).await;
    browser.goto(&page).await;
    assert_eq!(browser.text("#queue-state").await.trim(), "active");
    assert!(browser.find_all("tr.job").await.is_empty(), "the queue ran dry");
    drop(browser);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_job_is_cancelled_from_the_page() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &["-c", "2"]);
    let browser = Browser::start("running_job_is_cancelled_from_the_page").await;
    // Spins until stopped.
    let jid = push(&mut conn, "ChaosJob", "default", vec![json!(["loop"])])
        .await
        .remove(0);
    let running = format!("tr.running[data-jid=\"{jid}\"]");
    let page = format!("{base}/processes");

    browser
        .wait_for(
            Duration::from_secs(30),
            || format!("{jid} to show as running on /processes"),
            async |browser: &Browser| {
                browser.goto(&page).await;
                browser.try_find(&running).await.is_some()
            },
        )
        .await;
    assert!(!browser.find_all("tr.process").await.is_empty());
    browser.click_to_navigate(&format!("{running} button.cancel")).await;

    eventually(
        Duration::from_secs(10),
        || format!("{jid} to be recorded as cancelled:\n{}", runner.log()),
        || {
            let mut conn = conn.clone();
            let jid = jid.clone();
            async move { in_set(&mut conn, "wasmjobs:cancelled", &jid).await }
        },
    )
    .await;
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    assert_eq!(conn.zcard::<_, u64>("retry").await.expect("ZCARD"), 0, "not retried");
    browser
        .wait_for(
            Duration::from_secs(10),
            || format!("{jid} to leave /processes"),
            async |browser: &Browser| {
                browser.goto(&page).await;
                browser.try_find(&running).await.is_none()
            },
        )
        .await;
    drop(browser);
    // Its process closed the request as it recorded the job.
    eventually(
        Duration::from_secs(10),
        || "the cancel request to be closed".into(),
        || {
            let mut conn = conn.clone();
            async move { conn.zcard::<_, u64>("wasmjobs:cancels:open").await.expect("ZCARD") == 0 }
        },
    )
    .await;
    // A second click (a page left open, a form sent twice) says it was
    // done, and leaves no request open for the fetches to look up all day.
    let token = "0123456789abcdef0123456789abcdef";
    let again = request(
        base.trim_start_matches("http://"),
        "POST",
        "/cancel",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Cookie", &format!("wasmjobs_csrf={token}")),
        ],
        &format!("csrf={token}&jid={jid}"),
    );
    assert!(matches!(again.status, 302 | 303), "{again:?}");
    assert!(again.head.contains("already+cancelled"), "{again:?}");
    let open: u64 = conn.zcard("wasmjobs:cancels:open").await.expect("ZCARD");
    assert_eq!(open, 0, "a second cancel left its request open");
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_shows_as_running_within_seconds_of_its_start_not_at_the_next_beat() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &["-c", "4", "--timeout", "0.5"]);
    let browser = Browser::start("a_job_shows_as_running_within_seconds").await;
    browser.goto(&format!("{base}/")).await;
    browser.find("#chart").await;
    browser.mark_page().await;
    let first = push(&mut conn, "ChaosJob", "default", vec![json!(["sleep", 60_000])])
        .await
        .remove(0);
    browser
        .wait_text("#busy", Duration::from_secs(15), |text| text.trim() == "1")
        .await;
    // The heartbeat that showed the first job was at most a second ago,
    // the next is ten seconds away: the second job must not wait for it.
    let second = push(&mut conn, "ChaosJob", "default", vec![json!(["sleep", 60_000])])
        .await
        .remove(0);
    let pushed = Instant::now();
    browser
        .wait_text("#busy", Duration::from_secs(4), |text| text.trim() == "2")
        .await;
    assert!(browser.page_is_marked().await, "the overview must update Busy in place");
    browser.goto(&format!("{base}/processes")).await;
    for jid in [&first, &second] {
        browser.find(&format!("tr.running[data-jid=\"{jid}\"]")).await;
    }
    eprintln!("the second job showed as running {:?} after its push", pushed.elapsed());
    drop(browser);
    // Stopped with the jobs running: both go back to their queue.
    assert!(runner.stop().success(), "{}", runner.log());
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 2);
}

/// Asserts that the page shows `SCRIPT` and `IMG` as text in `css` and
/// ran neither.
async fn assert_shown_as_text(browser: &Browser, css: &str) {
    browser.assert_no_alert().await;
    let text = browser.text(css).await;
    assert!(text.contains(SCRIPT) && text.contains(IMG), "{css}: {text:?}");
    let injected = browser
        .execute(
            "return document.querySelectorAll(\
               'td.args *, td.class *, pre#payload *, pre#error *').length \
             + Array.from(document.scripts).filter(s => s.text.includes('alert(')).length;",
        )
        .await;
    assert_eq!(injected, json!(0), "markup from the job made it into the page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_in_args_renders_as_text() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let args = vec![json!(SCRIPT), json!(IMG)];
    // No runner serves these: they stay where they are put.
    let queued = push(&mut conn, "EchoJob", "default", vec![Value::Array(args.clone())])
        .await
        .remove(0);
    let dead = dead_job("EchoJob", args.clone(), &format!("failed on {SCRIPT}"));
    let now = wasmjobs::redis::now_f64();
    zadd(&mut conn, "dead", &dead, now).await;
    let retrying = dead_job("EchoJob", args.clone(), IMG);
    zadd(&mut conn, "retry", &retrying, now + 3_600.0).await;
    let scheduled = Payload::new("EchoJob", args, "default", now);
    zadd(&mut conn, "schedule", &scheduled, now + 3_600.0).await;
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let base = format!("http://{addr}");
    let browser = Browser::start("script_in_args_renders_as_text").await;

    browser.goto(&format!("{base}/queues/default")).await;
    assert_shown_as_text(&browser, &format!("{} td.args", row(&queued))).await;
    browser.goto(&format!("{base}/retries")).await;
    assert_shown_as_text(&browser, &format!("{} td.args", row(retrying.jid()))).await;
    browser.goto(&format!("{base}/scheduled")).await;
    assert_shown_as_text(&browser, &format!("{} td.args", row(scheduled.jid()))).await;
    browser.goto(&format!("{base}/dead")).await;
    assert_shown_as_text(&browser, &format!("{} td.args", row(dead.jid()))).await;
    browser
        .click_to_navigate(&format!("{} a.job-link", row(dead.jid())))
        .await;
    assert_shown_as_text(&browser, "pre#payload").await;
    let error = browser.text("pre#error").await;
    assert!(error.contains(&format!("failed on {SCRIPT}")), "{error}");
    browser.assert_no_alert().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_found_by_jid_or_by_text_in_its_args_within_the_bound() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    // No runner: the jobs stay where they are put.
    let queued = push(&mut conn, "MailJob", "default", vec![json!(["Ada@Example.com", 7])])
        .await
        .remove(0);
    push(&mut conn, "MailJob", "low", vec![json!(["bob@example.com", 8])]).await;
    let dead = dead_job("MailJob", vec![json!("ada@example.com")], "smtp refused <b>ada</b>");
    zadd(&mut conn, "dead", &dead, wasmjobs::redis::now_f64()).await;
    // One more beyond the first 1,000 of a queue: not looked at, and said.
    let deep = push(&mut conn, "DeepJob", "big", vec![json!(["ada@example.com"])])
        .await
        .remove(0);
    push(&mut conn, "FillerJob", "big", (0..1_000).map(|i| json!([i])).collect()).await;
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let base = format!("http://{addr}");
    let browser = Browser::start("a_job_is_found_by_jid_or_by_text").await;

    // From any page, by jid.
    browser.goto(&format!("{base}/queues")).await;
    browser.type_into("#nav-search", &format!("{queued}\u{E007}")).await;
    browser
        .wait_for(
            Duration::from_secs(10),
            || "the search results".to_owned(),
            async |browser: &Browser| browser.path().await == "/search",
        )
        .await;
    let matches = browser.find_all("tr.match").await;
    assert_eq!(matches.len(), 1, "one job has that jid");
    let place = browser
        .find(&format!("tr.match[data-jid=\"{queued}\"]"))
        .await
        .attr("data-where")
        .await
        .expect("attribute");
    assert_eq!(place.as_deref(), Some("queue:default"));

    // By text in the args, whatever its case: in queues and sets.
    browser.goto(&format!("{base}/search")).await;
    browser.type_into("#search-q", "ADA@example").await;
    browser.click_to_navigate("#search-go").await;
    let mut found: Vec<String> = Vec::new();
    for row in browser.find_all("tr.match").await {
        found.push(row.attr("data-where").await.expect("attribute").unwrap_or_default());
    }
    found.sort();
    assert_eq!(found, ["queue:default", "set:dead"], "bob's job does not match");
    assert!(
        browser
            .try_find(&format!("tr.match[data-jid=\"{deep}\"]"))
            .await
            .is_none(),
        "the oldest job of a queue of 1,001 is beyond the bound"
    );
    let looked = browser.text("#looked").await;
    assert!(
        looked.contains("queue big (1001 jobs)"),
        "the page says what it did not look at: {looked}"
    );
    // The error text is shown as text, the way every page shows it.
    let error = browser
        .text(&format!("tr.match[data-jid=\"{}\"] td.error", dead.jid()))
        .await;
    assert!(error.contains("<b>ada</b>"), "{error}");

    // Bob's job, by its args in another case.
    browser.goto(&format!("{base}/search?q=BOB%40")).await;
    assert_eq!(browser.find_all("tr.match").await.len(), 1);
    browser.assert_no_alert().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_disabled_and_enabled_from_the_cron_page() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    let manifest = dir.path().join("noop/wasmjobs.toml");
    let base_manifest = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(
        &manifest,
        format!("{base_manifest}\n{}", wasmjobs_e2e::EVERY_SECOND_SCHEDULE),
    )
    .expect("write");
    // The runner serves `default`: the ticks wait in `cron`, to be counted.
    let (mut runner, base) = runner_with_web(&redis, dir.path(), &[]);
    let counter = conn.clone();
    let ticked = || {
        let mut conn = counter.clone();
        async move { conn.llen::<_, u64>("queue:cron").await.expect("LLEN") }
    };
    eventually(
        Duration::from_secs(10),
        || "a first tick".to_owned(),
        || async { ticked().await > 0 },
    )
    .await;
    let browser = Browser::start("a_schedule_is_disabled_and_enabled").await;
    browser.goto(&format!("{base}/cron")).await;
    let row = "tr.schedule[data-name=\"every-second\"]";
    browser.click_to_navigate(&format!("{row} button.disable")).await;
    let notice = browser.text("#notice").await;
    assert!(notice.contains("every-second disabled"), "{notice}");
    assert!(browser.text(row).await.contains("disabled"));
    browser.find(&format!("{row} button.enable")).await;
    let status: String = conn
        .hget("cron_job:default:every-second", "status")
        .await
        .expect("HGET");
    assert_eq!(status, "disabled", "sidekiq-cron's field, so its Web UI shows it too");

    // A tick claimed as the click landed may still be pushed; after that,
    // none for three seconds (three ticks of an every-second schedule).
    let settled = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = ticked().await;
    let quiet_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet_until {
        assert_eq!(ticked().await, held, "a disabled schedule enqueued a tick");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    browser.click_to_navigate(&format!("{row} button.enable")).await;
    assert!(!browser.text(row).await.contains("disabled"));
    eventually(
        Duration::from_secs(10),
        || format!("ticks again after enable:\n{}", runner.log()),
        || async { ticked().await > held },
    )
    .await;
    drop(browser);
    assert!(runner.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_without_csrf_is_refused() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    // A queue with a job (no runner: it stays).
    push(&mut conn, "ChaosJob", "default", vec![json!(["ok"])]).await;
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);

    for form in ["", "csrf=", "csrf=not-the-token"] {
        let response = post_form(&addr, "/queues/default/pause", form);
        assert_eq!(response.status, 403, "POST with {form:?}: {response:?}");
        assert!(response.body.contains("CSRF"), "POST with {form:?}: {response:?}");
    }
    assert!(!paused(&mut conn, "default").await, "paused without a token");
    let response = post_form(&addr, "/cancel", &format!("jid={}", "f".repeat(24)));
    assert_eq!(response.status, 403, "{response:?}");

    // The page's own form carries a token that is accepted.
    let browser = Browser::start("post_without_csrf_is_refused").await;
    browser.goto(&format!("http://{addr}/queues/default")).await;
    let token = browser
        .find("form input[type=hidden][name=csrf]")
        .await
        .attr("value")
        .await
        .expect("value")
        .unwrap_or_default();
    assert!(!token.is_empty(), "the form's CSRF token is empty");
    browser.click_to_navigate("button#pause").await;
    eventually(
        Duration::from_secs(5),
        || "default in the paused set".into(),
        || {
            let mut conn = conn.clone();
            async move { paused(&mut conn, "default").await }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_bind_without_credentials_refuses_to_start() {
    let redis = TestRedis::start();

    let mut open = Web::spawn(&redis, "0.0.0.0:0", &[]);
    let status = open.wait_exit(Duration::from_secs(10));
    let log = open.log();
    assert_eq!(status.code(), Some(2), "{status}:\n{log}");
    assert!(log.contains("refusing"), "{log}");

    // With a user and password: Basic auth.
    let (_basic, addr) = Web::start(
        &redis,
        "0.0.0.0:0",
        &[("WASMJOBS_WEB_USER", "ops"), ("WASMJOBS_WEB_PASSWORD", "s3cret pass")],
    );
    let basic = |credentials: &str| {
        let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
        request(&addr, "GET", "/", &[("Authorization", &format!("Basic {encoded}"))], "")
    };
    let anonymous = request(&addr, "GET", "/", &[], "");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert!(
        anonymous.head.to_ascii_lowercase().contains("www-authenticate: basic"),
        "{anonymous:?}"
    );
    assert_eq!(basic("ops:s3cret pass").status, 200);
    assert_eq!(basic("ops:wrong").status, 401);
    assert_eq!(basic("other:s3cret pass").status, 401);

    // With a token: Bearer.
    let (_bearer, addr) = Web::start(&redis, "0.0.0.0:0", &[("WASMJOBS_WEB_TOKEN", "t0ken-for-tests")]);
    let bearer = |token: &str| request(&addr, "GET", "/", &[("Authorization", &format!("Bearer {token}"))], "");
    assert_eq!(bearer("t0ken-for-tests").status, 200);
    assert_eq!(bearer("t0ken-for-test").status, 401);
    assert_eq!(request(&addr, "GET", "/", &[], "").status, 401);
}

/// A plugin directory name that would inject markup if rendered as HTML.
const EVIL_PLUGIN: &str = "<img src=x onerror=alert(3)>";

/// The text of the Plugins page's row for `version` of `plugin`, once it
/// shows (or `None`).
async fn version_row(browser: &Browser, plugin: &str, version_css: &str) -> Option<String> {
    let css = format!("section.plugin[data-name=\"{plugin}\"] {version_css}");
    browser.try_find(&css).await?;
    Some(browser.text(&css).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_page_shows_versions_grants_load_errors_and_reloads() {
    let redis = TestRedis::start();
    // Process A: echo, http-get, chaos and a plugin that cannot load, in a
    // directory whose name is markup.
    let dir_a = plugins(&["echo", "http-get"], &["chaos"]);
    let evil = dir_a.path().join(EVIL_PLUGIN);
    std::fs::create_dir(&evil).expect("evil plugin dir");
    std::fs::write(
        evil.join("wasmjobs.toml"),
        format!("component = \"missing.wasm\"\nclasses = [\"EvilJob\"]\n# {SCRIPT}\n"),
    )
    .expect("evil manifest");
    // Process B: a later echo, with a timeout of its own.
    let dir_b = plugins(&["echo"], &[]);
    let echo_b = dir_b.path().join("echo/wasmjobs.toml");
    let limited = format!(
        "{}\n[limits]\ntimeout = \"5s\"\n",
        std::fs::read_to_string(&echo_b).expect("echo manifest")
    );
    std::fs::write(&echo_b, &limited).expect("echo v2 manifest");
    let (mut runner_a, base) = runner_with_web(&redis, dir_a.path(), &[]);
    let mut runner_b = Runner::start(&redis.url(), dir_b.path(), &[]);
    runner_b.wait_running();
    let browser = Browser::start("plugins_page_shows_versions_grants_load_errors_and_reloads").await;
    let page = format!("{base}/plugins");

    // A rolling deploy: two versions of echo, one process each.
    browser
        .wait_for(
            Duration::from_secs(30),
            || "two versions of echo on /plugins".to_owned(),
            async |browser: &Browser| {
                browser.goto(&page).await;
                browser
                    .find_all("section.plugin[data-name=\"echo\"] tr.version")
                    .await
                    .len()
                    == 2
            },
        )
        .await;
    let echo = browser.text("section.plugin[data-name=\"echo\"]").await;
    assert!(echo.contains("2 versions running"), "{echo}");
    assert!(echo.contains("EchoJob"), "{echo}");
    assert!(echo.contains("timeout 5s"), "B's limit: {echo}");
    assert!(echo.contains("the runner's defaults"), "A's limits: {echo}");
    assert!(echo.contains("nothing: no network"), "echo is granted nothing: {echo}");

    let http = version_row(&browser, "http-get", "tr.version")
        .await
        .expect("http-get shown");
    assert!(
        http.contains("HttpGetJob") && http.contains("http 127.0.0.1:*"),
        "{http}"
    );
    let chaos = version_row(&browser, "chaos", "tr.version").await.expect("chaos shown");
    for grant in ["files /data → data (rw)", "sql main (rw)", "http 127.0.0.1:*"] {
        assert!(chaos.contains(grant), "chaos grants {grant}: {chaos}");
    }
    assert!(chaos.contains("wasmjobs:job/plugin@"), "the world: {chaos}");

    // The refused plugin, named and explained, as text.
    let broken = browser.text("tr.broken").await;
    assert!(broken.contains(EVIL_PLUGIN), "{broken}");
    assert!(broken.contains("missing.wasm"), "the reason: {broken}");
    let markup = browser
        .execute("return document.querySelectorAll('main img, main script').length;")
        .await;
    assert_eq!(
        markup,
        json!(0),
        "markup from a plugin's name or files made it into the page"
    );
    browser.assert_no_alert().await;
    let loaded = browser.find_all("tr.reload[data-event=\"loaded\"]").await.len();
    assert_eq!(loaded, 4, "three plugins in A, one in B");
    assert_eq!(browser.find_all("tr.reload[data-event=\"rejected\"]").await.len(), 1);

    // A catches up with B: one version of echo, on both processes, and A's
    // history shows the replacement.
    let echo_a = dir_a.path().join("echo/wasmjobs.toml");
    let staging = echo_a.with_extension("toml.tmp");
    std::fs::write(&staging, &limited).expect("staging manifest");
    std::fs::rename(&staging, &echo_a).expect("deploy manifest");
    browser
        .wait_for(
            Duration::from_secs(30),
            || format!("A to report echo replaced:\n{}", runner_a.log()),
            async |browser: &Browser| {
                browser.goto(&page).await;
                browser
                    .try_find("tr.reload[data-plugin=\"echo\"][data-event=\"replaced\"]")
                    .await
                    .is_some()
            },
        )
        .await;
    let versions = browser.find_all("section.plugin[data-name=\"echo\"] tr.version").await;
    assert_eq!(versions.len(), 1, "one version of echo left");
    let echo = browser.text("section.plugin[data-name=\"echo\"] tr.version").await;
    assert!(echo.contains("2:"), "running on both processes: {echo}");
    let replaced = browser
        .text("tr.reload[data-plugin=\"echo\"][data-event=\"replaced\"]")
        .await;
    assert!(replaced.contains('→'), "old → new version: {replaced}");

    // The Processes page shows each process's CPU.
    browser
        .wait_for(
            Duration::from_secs(30),
            || "a CPU figure on /processes".to_owned(),
            async |browser: &Browser| {
                browser.goto(&format!("{base}/processes")).await;
                let cpus = browser.find_all("tr.process td.cpu").await;
                let mut shown = 0;
                for cpu in cpus {
                    let text = cpu.text().await.unwrap_or_default();
                    shown += usize::from(text.ends_with('%') && text.trim_end_matches('%').parse::<f64>().is_ok());
                }
                shown == 2
            },
        )
        .await;
    drop(browser);
    assert!(runner_a.stop().success());
    assert!(runner_b.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_queues_and_sets_are_paged() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    // No runner: the jobs stay. Pushed one by one onto the head, so the
    // first pushed are the oldest, on the last page.
    let jids = push(&mut conn, "EchoJob", "default", (0..250).map(|i| json!([i])).collect()).await;
    let now = wasmjobs::redis::now_f64();
    for i in 0..150 {
        let class = if i % 3 == 0 { "RareJob" } else { "EchoJob" };
        let job = dead_job(class, vec![json!(i)], "failed");
        zadd(&mut conn, "dead", &job, now - f64::from(i)).await;
    }
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let base = format!("http://{addr}");
    let browser = Browser::start("long_queues_and_sets_are_paged").await;

    browser.goto(&format!("{base}/queues/default")).await;
    let mut sizes = vec![browser.find_all("tr.job").await.len()];
    assert_eq!(browser.text("nav.pager .page").await, "Page 1 of 3");
    assert!(browser.try_find("nav.pager a.prev").await.is_none());
    while browser.try_find("nav.pager a.next").await.is_some() {
        browser.click_to_navigate("nav.pager a.next").await;
        sizes.push(browser.find_all("tr.job").await.len());
    }
    assert_eq!(sizes, [100, 100, 50]);
    assert_eq!(browser.text("nav.pager .page").await, "Page 3 of 3");
    // The oldest job is on the last page, and can be deleted from there.
    let oldest = row(&jids[0]);
    browser.find(&oldest).await;
    browser.click_to_navigate(&format!("{oldest} button.delete")).await;
    let notice = browser.text("#notice").await;
    assert!(notice.contains(&format!("Job {} deleted", jids[0])), "{notice}");
    assert_eq!(
        browser.text("nav.pager .page").await,
        "Page 3 of 3",
        "back on the page it was deleted from"
    );
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 249);
    let left: Vec<String> = conn.lrange("queue:default", 0, -1).await.expect("LRANGE");
    assert!(!left.iter().any(|raw| raw.contains(&jids[0])), "the oldest job is gone");
    assert!(left.iter().any(|raw| raw.contains(&jids[1])), "and only it");

    // A set: two pages; filtered, every match in the window of 1,000.
    browser.goto(&format!("{base}/dead")).await;
    assert_eq!(browser.find_all("tr.job").await.len(), 100);
    browser.click_to_navigate("nav.pager a.next").await;
    assert_eq!(browser.find_all("tr.job").await.len(), 50);
    browser.goto(&format!("{base}/dead?class=Rare")).await;
    assert_eq!(browser.find_all("tr.job").await.len(), 50);
    let classes = browser
        .execute("return Array.from(document.querySelectorAll('tr.job td.class')).map(td => td.textContent);")
        .await;
    assert!(
        classes.as_array().is_some_and(|c| c.iter().all(|c| c == "RareJob")),
        "{classes}"
    );
    assert!(browser.text("p.looked").await.contains("1–150"));
    assert!(
        browser.try_find("nav.pager").await.is_none(),
        "one window holds the whole set"
    );
    // Hostile page numbers are page 1.
    for page in ["0", "-1", "x", "99999999999999999999999"] {
        let response = request(&addr, "GET", &format!("/dead?page={page}"), &[], "");
        assert_eq!(response.status, 200, "page={page}: {response:?}");
        assert_eq!(response.body.matches("<tr class=\"job\"").count(), 100, "page={page}");
    }
    let past = request(&addr, "GET", "/dead?page=7", &[], "");
    assert_eq!(past.status, 200);
    assert_eq!(past.body.matches("<tr class=\"job\"").count(), 0);
    assert!(past.body.contains("page=2"), "a way back from past the end");
}
