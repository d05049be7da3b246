//! The dashboard on the PostgreSQL store (`run --source URL --web ADDR`),
//! in a real browser: its queue and set pages list the store's rows, and
//! their buttons delete, clear and run them in the store, where a runner
//! picks them up; `wasmjobs web --source` serves the same pages on its own.

use std::time::Duration;

use serde_json::Value;
use tokio_postgres::Client;
use wasmjobs_e2e::browser::Browser;
use wasmjobs_e2e::dashboard::{Web, wait_listening};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, http_get, int, plugins};

use super::{connect, count, source_flags, store};

/// `tr.job` of the job `jid`.
fn row(jid: &str) -> String {
    format!("tr.job[data-jid=\"{jid}\"]")
}

async fn jid_of(client: &Client, sql: &str) -> String {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Whether the live table (or, with `dead`, the dead one) holds `jid`.
async fn holds(client: &Client, table: &str, jid: &str) -> bool {
    let sql = format!("SELECT count(*) FROM wasmjobs.{table} WHERE payload->>'jid' = $1");
    client.query_one(&sql, &[&jid]).await.expect(&sql).get::<_, i64>(0) == 1
}

async fn until(what: &str, runner: &Runner, check: impl AsyncFn() -> bool) {
    wasmjobs_e2e::eventually(
        Duration::from_secs(30),
        || format!("{what}\n{}", runner.log()),
        async || check().await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_and_changes_the_jobs_in_the_store() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let conn = redis.conn().await;
    let db = connect(&url).await;
    // Two jobs in a queue no runner serves; one scheduled and one retry in
    // the served queue; a dead one whose queue is not served.
    let held: Vec<String> = vec![
        jid_of(
            &db,
            "SELECT wasmjobs.enqueue('NoopJob', '[\"first\"]', queue => 'held')",
        )
        .await,
        jid_of(
            &db,
            "SELECT wasmjobs.enqueue('NoopJob', '[\"second\"]', queue => 'held')",
        )
        .await,
    ];
    let scheduled = jid_of(
        &db,
        "SELECT wasmjobs.enqueue('NoopJob', '[\"later\"]', run_at => now() + interval '1 hour')",
    )
    .await;
    db.execute(
        "INSERT INTO wasmjobs.jobs (queue, payload, run_at) VALUES ('default',
           '{\"class\":\"NoopJob\",\"args\":[],\"jid\":\"retry1\",\"queue\":\"default\",\"retry_count\":2,
             \"error_class\":\"Boom\",\"error_message\":\"it failed\"}', now() + interval '1 hour')",
        &[],
    )
    .await
    .expect("a retry");
    db.execute(
        "INSERT INTO wasmjobs.dead (kind, queue, payload) VALUES ('dead', 'held',
           '{\"class\":\"NoopJob\",\"args\":[\"<script>alert(1)</script>\"],\"jid\":\"dead1\",\"queue\":\"held\",
             \"retry_count\":25,\"at\":1,\"error_class\":\"Boom\",\"error_message\":\"it died\"}')",
        &[],
    )
    .await
    .expect("a dead job");

    // A schedule that does not tick during the test (1 January), into the
    // queue no runner serves.
    let dir = plugins(&["noop"], &[]);
    let manifest = dir.path().join("noop/wasmjobs.toml");
    let base_manifest = std::fs::read_to_string(&manifest).expect("manifest");
    let yearly = "[[schedule]]\nname = \"yearly\"\ncron = \"0 0 0 1 1 *\"\nclass = \"NoopJob\"\nqueue = \"held\"\n";
    std::fs::write(&manifest, format!("{base_manifest}\n{yearly}")).expect("write");
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &["--web", "127.0.0.1:0"]));
    runner.wait_running();
    let base = format!("http://{}", wait_listening(|| runner.log(), || None));
    let browser = Browser::start("the_dashboard_lists_and_changes_the_jobs_in_the_store").await;

    // The overview counts the store's jobs, and says where they are.
    let addr = base.trim_start_matches("http://");
    let overview: Value = serde_json::from_str(&http_get(addr, "/api/overview")).expect("JSON");
    assert_eq!(
        (
            &overview["enqueued"],
            &overview["scheduled"],
            &overview["retries"],
            &overview["dead"]
        ),
        (&2.into(), &1.into(), &1.into(), &1.into()),
        "{overview}"
    );
    browser.goto(&base).await;
    assert!(browser.text("#jobs-in").await.contains("PostgreSQL"));

    // A queue's page lists its rows; one is deleted from it.
    browser.goto(&format!("{base}/queues")).await;
    browser.click_to_navigate("tr.queue[data-queue=\"held\"] a").await;
    for jid in &held {
        browser.find(&row(jid)).await;
    }
    browser
        .click_to_navigate(&format!("{} button.delete", row(&held[0])))
        .await;
    assert!(!holds(&db, "jobs", &held[0]).await, "deleted from the page");
    assert!(holds(&db, "jobs", &held[1]).await, "the other job stays");
    assert!(browser.try_find(&row(&held[0])).await.is_none());

    // Search finds a job by its jid, in the store.
    browser.goto(&format!("{base}/search?q={}", held[1])).await;
    browser
        .find(&format!(
            "tr.match[data-jid=\"{}\"][data-where=\"queue:held\"]",
            held[1]
        ))
        .await;

    // The scheduled job runs now, from its page, and the runner runs it.
    browser.goto(&format!("{base}/scheduled")).await;
    browser
        .click_to_navigate(&format!("{} a.job-link", row(&scheduled)))
        .await;
    browser.click_to_navigate("button#retry-now").await;
    until("the scheduled job to run", &runner, async || {
        !holds(&db, "jobs", &scheduled).await && int(&mut conn.clone(), "stat:processed").await == 1
    })
    .await;

    // The retry is deleted from its page.
    browser.goto(&format!("{base}/retries")).await;
    assert_eq!(browser.text(&format!("{} td.retries", row("retry1"))).await.trim(), "2");
    browser
        .click_to_navigate(&format!("{} a.job-link", row("retry1")))
        .await;
    assert!(browser.text("pre#error").await.contains("it failed"));
    browser.click_to_navigate("button#delete").await;
    assert!(!holds(&db, "jobs", "retry1").await);

    // The dead job goes back to its queue as Sidekiq's "Retry now" sends
    // it: one retry fewer, enqueued now, no `at`; its args shown as text.
    browser.goto(&format!("{base}/dead")).await;
    assert_eq!(
        browser.text(&format!("{} td.args", row("dead1"))).await.trim(),
        "[\"<script>alert(1)</script>\"]"
    );
    browser.click_to_navigate(&format!("{} a.job-link", row("dead1"))).await;
    browser.click_to_navigate("button#retry-now").await;
    assert!(!holds(&db, "dead", "dead1").await);
    let moved: Value = serde_json::from_str(
        &db.query_one(
            "SELECT payload::text FROM wasmjobs.jobs WHERE payload->>'jid' = 'dead1' AND queue = 'held' AND run_at <= now()",
            &[],
        )
        .await
        .expect("the dead job, due in its queue")
        .get::<_, String>(0),
    )
    .expect("JSON");
    assert_eq!(moved["retry_count"], 24, "{moved}");
    assert!(
        moved.get("at").is_none() && moved["enqueued_at"].as_f64().is_some(),
        "{moved}"
    );

    // Cron's "Enqueue now" enqueues into the store, not into Redis.
    browser.goto(&format!("{base}/cron")).await;
    browser
        .click_to_navigate("tr.schedule[data-name=\"yearly\"] button.enqueue-now")
        .await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM wasmjobs.jobs WHERE queue = 'held' AND payload->>'class' = 'NoopJob' AND payload ? 'cron_tick'").await,
        1
    );
    assert_eq!(
        redis::AsyncCommands::llen::<_, u64>(&mut conn.clone(), "queue:held")
            .await
            .expect("LLEN"),
        0
    );

    // `wasmjobs web` on its own serves the store named by WASMJOBS_SOURCE.
    let (_web, alone) = Web::start(&redis, "127.0.0.1:0", &[("WASMJOBS_SOURCE", &url)]);
    let page = http_get(&alone, "/queues/held");
    assert!(page.contains(&format!("data-jid=\"{}\"", held[1])), "{page}");
    assert!(page.contains("data-jid=\"dead1\""), "{page}");

    // Clearing the queue deletes its waiting jobs, and only them.
    browser.goto(&format!("{base}/queues/held")).await;
    browser
        .execute("window.confirm = function () { return true; }; return null;")
        .await;
    browser.click_to_navigate("button#clear").await;
    assert_eq!(count(&db, "SELECT count(*) FROM wasmjobs.jobs").await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM wasmjobs.dead").await, 0);
    browser.goto(&base).await;
    drop(browser);
    assert!(runner.stop().success(), "{}", runner.log());
}
