//! The PostgreSQL job store (`--source postgres://…`), with a real
//! PostgreSQL, a real redis-server (the control plane) and real runner
//! processes: transactional enqueue, leases, unique keys, cancel, pause,
//! cron, the dashboard ([`dashboard`]), cluster limits, metrics and traces
//! ([`observed`]), and what is refused at start.

mod dashboard;
mod edges;
mod observed;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio_postgres::{Client, NoTls};
use wasmjobs_e2e::cli::wasmjobs_in;
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, lines, plugins, wait_for_lines};

const DB: &str = "jobs";
const NONE: &[(&str, &str)] = &[];

/// A PostgreSQL with the `jobs` database, migrated by the CLI as a user
/// would (twice: it is idempotent).
fn store() -> (TestPostgres, String) {
    let pg = TestPostgres::start();
    pg.create_database(DB);
    let url = pg.url(DB);
    let here = Path::new(".");
    let first = wasmjobs_in(here, &["migrate", "--source", &url], NONE, Duration::from_secs(60));
    wasmjobs_e2e::assert_success(&first, "wasmjobs migrate");
    let printed = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(printed.contains("applied migrations 1, 2, 3"), "{printed}");
    let again = wasmjobs_in(here, &["migrate", "--source", &url], NONE, Duration::from_secs(60));
    wasmjobs_e2e::assert_success(&again, "wasmjobs migrate (again)");
    assert!(String::from_utf8_lossy(&again.stdout).contains("up to date"));
    (pg, url)
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect to postgres");
    tokio::spawn(connection);
    client
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Owners of the claimed jobs, sorted.
async fn owners(client: &Client) -> Vec<String> {
    let rows = client
        .query(
            "SELECT owner FROM wasmjobs.jobs WHERE owner IS NOT NULL ORDER BY owner",
            &[],
        )
        .await
        .expect("owners");
    rows.iter().map(|row| row.get(0)).collect()
}

/// Waits for `check` with a deadline, the runners still up.
async fn eventually<F, Fut>(what: &str, timeout: Duration, runners: &mut [&mut Runner], mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        for runner in runners.iter_mut() {
            if let Some(status) = runner.try_status() {
                panic!("a runner exited ({status}) while waiting for {what}:\n{}", runner.log());
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}\n{}",
            runners.iter().map(|r| r.log()).collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis()
}

fn source_flags<'a>(url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec!["--source", url];
    flags.extend_from_slice(extra);
    flags
}

/// A job enqueued in a transaction that rolls back never exists; one in a
/// transaction that commits runs, woken by the commit's notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_exists_if_and_only_if_its_transaction_commits() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let file = dir.path().join("chaos/data/spans.txt");
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &[]));
    runner.wait_running();
    let mut app = connect(&url).await;

    // The application's own data and the job, in one transaction each.
    app.batch_execute("CREATE TABLE users (name text)")
        .await
        .expect("table");
    let tx = app.transaction().await.expect("begin");
    tx.execute("INSERT INTO users VALUES ('rolled back')", &[])
        .await
        .expect("insert");
    tx.query_one(
        "SELECT wasmjobs.enqueue('ChaosJob', '[\"span\", \"spans.txt\", \"rolled-back\", 0]')",
        &[],
    )
    .await
    .expect("enqueue");
    tx.rollback().await.expect("rollback");

    let mut latencies = Vec::new();
    for i in 0..5 {
        let key = format!("committed-{i}");
        let tx = app.transaction().await.expect("begin");
        tx.execute("INSERT INTO users VALUES ($1)", &[&key])
            .await
            .expect("insert");
        let jid: String = tx
            .query_one(
                "SELECT wasmjobs.enqueue('ChaosJob', jsonb_build_array('span', 'spans.txt', $1::text, 0), queue => 'default')",
                &[&key],
            )
            .await
            .expect("enqueue")
            .get(0);
        assert_eq!(jid.len(), 24, "a Sidekiq-shaped jid: {jid}");
        tx.commit().await.expect("commit");
        let committed = now_ms();
        let needle = format!("start {key} ");
        eventually(
            "the committed job to start",
            Duration::from_secs(30),
            &mut [&mut runner],
            || {
                let found = lines(&file).iter().any(|line| line.starts_with(&needle));
                async move { found }
            },
        )
        .await;
        let started: u128 = lines(&file)
            .iter()
            .find(|line| line.starts_with(&needle))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
            .expect("a start time");
        latencies.push(started.saturating_sub(committed));
    }
    eprintln!("commit -> start, ms: {latencies:?}");

    // Every committed job ran and left the table; the rolled-back one was never there.
    let store = connect(&url).await;
    eventually(
        "the table to empty",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let store = &store;
            async move { count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0 }
        },
    )
    .await;
    assert!(!lines(&file).iter().any(|line| line.contains("rolled-back")));
    assert_eq!(count(&store, "SELECT count(*) FROM wasmjobs.dead").await, 0);
    assert_eq!(count(&store, "SELECT count(*) FROM users").await, 5);
    let log = runner.log();
    assert!(log.contains("listening") || !log.contains("polling for jobs"), "{log}");
    runner.stop();
}

/// A process stopped for more than half its lease keeps its jobs; one that
/// is killed has them run elsewhere once its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_a_live_process_jobs_and_return_a_dead_ones() {
    const LEASE: u64 = 8;
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let file = dir.path().join("chaos/data/slow.txt");
    let lease = LEASE.to_string();
    let flags = source_flags(&url, &["--lease", &lease, "--concurrency", "2", "--timeout", "1"]);
    let mut first = Runner::start(&redis.url(), dir.path(), &flags);
    first.wait_running();
    let store = connect(&url).await;
    for i in 0..2 {
        let args = json!(["slow-append", "slow.txt", format!("job-{i}"), 15_000]).to_string();
        store
            .query_one("SELECT wasmjobs.enqueue('ChaosJob', $1::text::jsonb)", &[&args])
            .await
            .expect("enqueue");
    }
    eventually(
        "the first runner to claim both jobs",
        Duration::from_secs(30),
        &mut [&mut first],
        || {
            let store = &store;
            async move { owners(store).await.len() == 2 }
        },
    )
    .await;
    let held = owners(&store).await;
    let mut second = Runner::start(&redis.url(), dir.path(), &flags);
    second.wait_running();

    // Past half a lease without a beat: nobody takes the jobs.
    first.signal("STOP");
    let stopped = Instant::now();
    while stopped.elapsed() < Duration::from_millis(LEASE * 1000 * 6 / 10) {
        // The second runner sweeps meanwhile; it must find nothing expired.
        assert_eq!(
            count(&store, "SELECT count(*) FROM wasmjobs.jobs WHERE recoveries > 0").await,
            0,
            "a job was taken from a live process"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.signal("CONT");
    // Its next renewal lands; then the jobs are still its own.
    let renewed = count(&store, "SELECT count(*) FROM wasmjobs.jobs WHERE lease_until > now()").await;
    eventually(
        "the stopped runner's renewal",
        Duration::from_secs(LEASE),
        &mut [&mut first, &mut second],
        || {
            let store = &store;
            async move {
                count(
                    store,
                    "SELECT count(*) FROM wasmjobs.jobs WHERE lease_until > now() + interval '4 seconds'",
                )
                .await
                    == 2
            }
        },
    )
    .await;
    assert_eq!(owners(&store).await, held, "renewed: {renewed}");
    assert_eq!(
        count(&store, "SELECT count(*) FROM wasmjobs.jobs WHERE recoveries > 0").await,
        0
    );

    // Killed: its jobs run in the second runner within about a lease.
    first.signal("KILL");
    first.wait(Duration::from_secs(10));
    let killed = Instant::now();
    eventually(
        "the dead runner's jobs to be taken back",
        Duration::from_secs(LEASE * 3),
        &mut [&mut second],
        || {
            let store = &store;
            async move {
                count(
                    store,
                    "SELECT count(*) FROM wasmjobs.jobs WHERE recoveries = 1 AND owner IS NOT NULL",
                )
                .await
                    == 2
            }
        },
    )
    .await;
    eprintln!("kill -> claimed elsewhere: {:?} (lease {LEASE} s)", killed.elapsed());
    let taken_by = owners(&store).await;
    assert!(
        taken_by.iter().all(|owner| !held.contains(owner)),
        "{taken_by:?} vs {held:?}"
    );
    eventually(
        "both jobs to finish",
        Duration::from_secs(60),
        &mut [&mut second],
        || {
            let store = &store;
            async move { count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0 }
        },
    )
    .await;
    let mut done = lines(&file);
    done.sort();
    assert_eq!(done, ["job-0", "job-1"]);
    assert_eq!(count(&store, "SELECT count(*) FROM wasmjobs.dead").await, 0);
    second.stop();
}

/// Fifty sessions enqueue the same unique key at once: one job goes in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_key_lets_one_of_fifty_parallel_sessions_in() {
    let (_pg, url) = store();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&url).await;
            let tx = client.transaction().await.expect("begin");
            let jid: Option<String> = tx
                .query_one(
                    "SELECT wasmjobs.enqueue('ReportJob', jsonb_build_array($1::int), queue => 'reports', unique_key => 'report:42')",
                    &[&i],
                )
                .await
                .expect("enqueue")
                .get(0);
            tx.commit().await.expect("commit");
            jid
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("task").is_some());
    }
    assert_eq!(admitted, 1);
    let store = connect(&url).await;
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM wasmjobs.jobs WHERE unique_key = 'report:42'"
        )
        .await,
        1
    );
    // Malformed input is refused with a reason, and nothing is written.
    let err = store
        .query_one("SELECT wasmjobs.enqueue('X', '{\"not\": \"an array\"}')", &[])
        .await
        .expect_err("args must be an array");
    assert!(format!("{err:?}").contains("args must be a JSON array"), "{err:?}");
    assert_eq!(count(&store, "SELECT count(*) FROM wasmjobs.jobs").await, 1);
}

/// Cancel and pause work on PostgreSQL jobs through the same commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_guest_and_pause_holds_a_queue() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let flags = source_flags(&url, &["--queues", "default,held"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
    runner.wait_running();
    let store = connect(&url).await;
    let here = Path::new(".");
    let none: &[(&str, &str)] = &[];

    let jid: String = store
        .query_one("SELECT wasmjobs.enqueue('ChaosJob', '[\"loop\"]')", &[])
        .await
        .expect("enqueue")
        .get(0);
    eventually(
        "the spinning job to be claimed",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let store = &store;
            async move { owners(store).await.len() == 1 }
        },
    )
    .await;
    // Running as the process list in Redis shows it (`wasmjobs cancel`
    // looks there), which the next heartbeat writes.
    let conn = redis.conn().await;
    eventually(
        "the job in the process's work list",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let (mut conn, jid) = (conn.clone(), &jid);
            async move {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("*:work")
                    .query_async(&mut conn)
                    .await
                    .expect("KEYS");
                for key in keys {
                    let work: Vec<String> = redis::cmd("HVALS")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .expect("HVALS");
                    if work.iter().any(|w| w.contains(jid.as_str())) {
                        return true;
                    }
                }
                false
            }
        },
    )
    .await;
    let cancel = wasmjobs_in(
        here,
        &["cancel", "--redis", &redis.url(), &jid],
        none,
        Duration::from_secs(30),
    );
    wasmjobs_e2e::assert_success(&cancel, "wasmjobs cancel");
    eventually(
        "the cancelled job in wasmjobs.dead",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let store = &store;
            async move {
                count(store, "SELECT count(*) FROM wasmjobs.dead WHERE kind = 'cancelled'").await == 1
                    && count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0
            }
        },
    )
    .await;
    let row = store
        .query_one(
            "SELECT payload->>'jid' FROM wasmjobs.dead WHERE kind = 'cancelled'",
            &[],
        )
        .await
        .expect("dead row");
    assert_eq!(row.get::<_, String>(0), jid);

    // Waiting jobs (one due in a queue nobody serves, one scheduled) are
    // taken out of the store by `cancel --source`, kept as cancelled.
    let mut waiting = Vec::new();
    for sql in [
        "SELECT wasmjobs.enqueue('ChaosJob', '[]', queue => 'elsewhere')",
        "SELECT wasmjobs.enqueue('ChaosJob', '[]', run_at => now() + interval '1 hour')",
    ] {
        waiting.push(store.query_one(sql, &[]).await.expect("enqueue").get::<_, String>(0));
    }
    let cancel = wasmjobs_in(
        here,
        &[
            "cancel",
            "--redis",
            &redis.url(),
            "--source",
            &url,
            "--by",
            "ops",
            &waiting[0],
            &waiting[1],
        ],
        none,
        Duration::from_secs(30),
    );
    wasmjobs_e2e::assert_success(&cancel, "wasmjobs cancel --source");
    let printed = String::from_utf8_lossy(&cancel.stdout).into_owned();
    assert!(
        printed.contains(&format!("{}: cancelled; taken out of queue elsewhere", waiting[0])),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("{}: cancelled; taken out of the schedule", waiting[1])),
        "{printed}"
    );
    assert_eq!(count(&store, "SELECT count(*) FROM wasmjobs.jobs").await, 0);
    let kept = store
        .query(
            "SELECT payload->>'cancelled_by', payload->>'cancelled_from' FROM wasmjobs.dead
             WHERE kind = 'cancelled' AND payload->>'jid' = ANY($1) ORDER BY payload->>'cancelled_from'",
            &[&waiting],
        )
        .await
        .expect("kept");
    let kept: Vec<(String, String)> = kept.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert_eq!(
        kept,
        [
            ("ops".to_owned(), "queue elsewhere".to_owned()),
            ("ops".to_owned(), "schedule".to_owned())
        ]
    );
    // Cancelled again: said so, with when and where, and not an error.
    let again = wasmjobs_in(
        here,
        &["cancel", "--redis", &redis.url(), "--source", &url, &waiting[0]],
        none,
        Duration::from_secs(30),
    );
    wasmjobs_e2e::assert_success(&again, "wasmjobs cancel --source (again)");
    let printed = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(
        printed.contains(&format!("{}: already cancelled at ", waiting[0])) && printed.contains("(queue elsewhere)"),
        "{printed}"
    );

    // Paused: its jobs wait while the other queue's run.
    let pause = wasmjobs_in(
        here,
        &["pause", "--redis", &redis.url(), "held"],
        none,
        Duration::from_secs(30),
    );
    wasmjobs_e2e::assert_success(&pause, "wasmjobs pause");
    let file = dir.path().join("chaos/data/pause.txt");
    for (queue, line) in [("held", "held"), ("default", "free")] {
        let args = json!(["slow-append", "pause.txt", line, 0]).to_string();
        store
            .query_one(
                "SELECT wasmjobs.enqueue('ChaosJob', $1::text::jsonb, queue => $2)",
                &[&args, &queue],
            )
            .await
            .expect("enqueue");
    }
    eventually(
        "the unpaused queue's job",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let done = lines(&file).contains(&"free".to_owned());
            async move { done }
        },
    )
    .await;
    assert_eq!(lines(&file), ["free"]);
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM wasmjobs.jobs WHERE queue = 'held' AND owner IS NULL"
        )
        .await,
        1
    );
    let resume = wasmjobs_in(
        here,
        &["resume", "--redis", &redis.url(), "held"],
        none,
        Duration::from_secs(30),
    );
    wasmjobs_e2e::assert_success(&resume, "wasmjobs resume");
    eventually(
        "the resumed queue's job",
        Duration::from_secs(30),
        &mut [&mut runner],
        || {
            let done = lines(&file).contains(&"held".to_owned());
            async move { done }
        },
    )
    .await;
    runner.stop();
}

/// A retry stays in PostgreSQL with its new `run_at`, readable by Ruby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_is_retried_in_the_store() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &[]));
    runner.wait_running();
    let store = connect(&url).await;
    store
        .query_one("SELECT wasmjobs.enqueue('ChaosJob', '[\"retry\", \"boom\"]')", &[])
        .await
        .expect("enqueue");
    eventually("the failed job to wait for its retry", Duration::from_secs(30), &mut [&mut runner], || {
        let store = &store;
        async move {
            count(store, "SELECT count(*) FROM wasmjobs.jobs WHERE owner IS NULL AND run_at > now() AND payload ? 'retry_count'").await == 1
        }
    })
    .await;
    let payload: Value = serde_json::from_str(
        &store
            .query_one("SELECT payload::text FROM wasmjobs.jobs", &[])
            .await
            .expect("row")
            .get::<_, String>(0),
    )
    .expect("json");
    assert_eq!(payload["retry_count"], 0);
    assert_eq!(payload["class"], "ChaosJob");
    assert!(
        payload["error_message"].as_str().is_some_and(|m| m.contains("boom")),
        "{payload}"
    );
    runner.stop();
}

/// What the PostgreSQL store cannot serve (`--fetch basic`: its claims are
/// leased, not Redis lists) is refused at start, with the reason; and a
/// store that was never migrated says what to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_store_cannot_serve_is_refused_at_start() {
    let pg = TestPostgres::start();
    pg.create_database(DB);
    let url = pg.url(DB);
    let redis = TestRedis::start();
    let dir = plugins(&["noop"], &[]);
    let plugins_dir = dir.path().to_string_lossy().into_owned();
    let here = Path::new(".");
    let none: &[(&str, &str)] = &[];
    let redis_url = redis.url();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--plugins",
            &plugins_dir,
            "--redis",
            &redis_url,
            "--source",
            &url,
        ];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        wasmjobs_in(here, &args, none, Duration::from_secs(120))
    };
    let unmigrated = run(&[]);
    assert!(!unmigrated.status.success());
    let said = String::from_utf8_lossy(&unmigrated.stderr).into_owned();
    assert!(said.contains("wasmjobs migrate --source"), "{said}");

    let migrate = wasmjobs_in(here, &["migrate", "--source", &url], none, Duration::from_secs(60));
    wasmjobs_e2e::assert_success(&migrate, "wasmjobs migrate");
    let basic = run(&["--fetch", "basic"]);
    assert!(!basic.status.success());
    assert!(String::from_utf8_lossy(&basic.stderr).contains("--fetch"));
    // A plugin database that is the store's own database and role: a
    // plugin granted it would own the queue (read every job, enqueue for
    // another plugin's class).
    let same = format!("main={url}?pool=2");
    let mixed = run(&["--db", &same]);
    assert!(!mixed.status.success());
    let said = String::from_utf8_lossy(&mixed.stderr).into_owned();
    assert!(said.contains("is --source's database and role"), "{said}");
}

/// Jobs in the PostgreSQL chaos run; `WASMJOBS_CHAOS_JOBS` overrides.
fn chaos_jobs() -> usize {
    std::env::var("WASMJOBS_CHAOS_JOBS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000)
}

/// Three runners share 50,000 jobs while one is `kill -9`ed, PostgreSQL
/// restarts (cutting every connection), a second runner is killed and two
/// more start: every job runs at least once (duplicates counted), nothing
/// is left claimed, nothing is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_runners_kill_restart_postgres_and_lose_nothing() {
    use std::collections::HashSet;

    let n = chaos_jobs();
    let (mut pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&["file-append"], &[]);
    let file = dir.path().join("file-append/data/chaos.txt");
    let mut app = connect(&url).await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let tx = app.transaction().await.expect("begin");
        let statement = tx
            .prepare("SELECT wasmjobs.enqueue('FileAppendJob', jsonb_build_array('chaos.txt', $1::int))")
            .await
            .expect("prepare");
        let calls = chunk.iter().map(|&i| {
            let i = i32::try_from(i).expect("small");
            let (tx, statement) = (&tx, &statement);
            async move { tx.query_one(statement, &[&i]).await }
        });
        futures_util::future::try_join_all(calls).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    drop(app);
    let started = Instant::now();
    let flags = source_flags(&url, &["--concurrency", "20", "--lease", "6"]);
    let mut live: Vec<Runner> = (0..3)
        .map(|_| Runner::start(&redis.url(), dir.path(), &flags))
        .collect();
    for runner in &mut live {
        runner.wait_running();
    }
    let timeout = Duration::from_secs(180).max(Duration::from_millis(n as u64 * 3));
    let deadline = started + timeout;
    let progress = |live: &mut Vec<Runner>, at: usize| wait_for_lines(live, &file, at, n, deadline, timeout);

    let mut killed = Vec::new();
    let done = progress(&mut live, n / 5);
    let mut victim = live.remove(0);
    victim.signal("KILL");
    victim.wait(Duration::from_secs(10));
    eprintln!("killed a runner at {done} lines ({:?})", started.elapsed());
    killed.push(victim);

    let done = progress(&mut live, 2 * n / 5);
    pg.restart();
    eprintln!("restarted PostgreSQL at {done} lines ({:?})", started.elapsed());

    let done = progress(&mut live, 3 * n / 5);
    let mut victim = live.remove(0);
    victim.signal("KILL");
    victim.wait(Duration::from_secs(10));
    eprintln!("killed a second runner at {done} lines ({:?})", started.elapsed());
    killed.push(victim);
    for _ in 0..2 {
        let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
        runner.wait_running();
        live.push(runner);
    }

    let store = connect(&url).await;
    loop {
        for runner in live.iter_mut() {
            if let Some(status) = runner.try_status() {
                panic!("a runner exited ({status}):\n{}", runner.log());
            }
        }
        let ids: HashSet<String> = lines(&file).into_iter().collect();
        let left = count(&store, "SELECT count(*) FROM wasmjobs.jobs").await;
        if ids.len() >= n && left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {timeout:?}: {} of {n} ids, {left} jobs left in the table\n{}",
            ids.len(),
            live.iter().map(Runner::log).collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    let (all, duplicates) = wasmjobs_e2e::runner::every_id_once_at_least(&file, n);
    eprintln!("postgres chaos: {n} jobs in {elapsed:?}: {all} lines, {duplicates} duplicates");
    assert_eq!(
        count(&store, "SELECT count(*) FROM wasmjobs.dead").await,
        0,
        "nothing is dead"
    );
    assert_eq!(
        count(&store, "SELECT count(*) FROM wasmjobs.jobs WHERE owner IS NOT NULL").await,
        0,
        "nothing is left claimed"
    );
    for mut runner in live {
        runner.stop();
    }
}

/// The Rust client pushes the same `Job` it pushes to Redis into the store,
/// inside the caller's transaction: rolled back, nothing; committed, the
/// payload with its extra fields; a held unique key, `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_pushes_inside_a_transaction() {
    let (_pg, url) = store();
    let mut app = connect(&url).await;
    let job = wasmjobs_client::Job::new("InvoiceJob")
        .args(json!([1234]))
        .queue("billing")
        .retry(3)
        .field("tags", json!(["eu"]))
        .unique_key("invoice:1234");

    let tx = app.transaction().await.expect("begin");
    let jid = wasmjobs_client::pg::push(&tx, &job).await.expect("push");
    assert!(jid.is_some());
    tx.rollback().await.expect("rollback");
    assert_eq!(count(&app, "SELECT count(*) FROM wasmjobs.jobs").await, 0);

    let tx = app.transaction().await.expect("begin");
    let jid = wasmjobs_client::pg::push(&tx, &job)
        .await
        .expect("push")
        .expect("a jid");
    assert_eq!(
        wasmjobs_client::pg::push(&tx, &job).await.expect("push again"),
        None,
        "the key is held"
    );
    tx.commit().await.expect("commit");
    let payload: Value = serde_json::from_str(
        &app.query_one("SELECT payload::text FROM wasmjobs.jobs", &[])
            .await
            .expect("row")
            .get::<_, String>(0),
    )
    .expect("json");
    assert_eq!(payload["jid"], jid.as_str());
    assert_eq!(payload["class"], "InvoiceJob");
    assert_eq!(payload["queue"], "billing");
    assert_eq!(payload["args"], json!([1234]));
    assert_eq!(payload["retry"], 3);
    assert_eq!(payload["tags"], json!(["eu"]));
    // A lifetime cannot be kept there: refused with the reason.
    let timed = job.clone().unique_for(Duration::from_secs(60));
    let err = wasmjobs_client::pg::push(&app, &timed)
        .await
        .expect_err("unique_for is refused");
    assert!(format!("{err:#}").contains("unique_key alone"), "{err:#}");
}

/// The wake-up: a due job's enqueue notifies `wasmjobs_jobs` with its
/// queue when its transaction commits; a rolled-back enqueue and a job due
/// later notify nobody (notifications arrive in commit order, so each
/// silent case is followed by one that must be heard). `push_bulk` enqueues
/// a batch in one statement, in order, and lets one holder of a key in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_enqueues_notify_at_commit_and_push_bulk_keeps_order() {
    use futures_util::StreamExt;
    let (_pg, url) = store();
    let (listener, mut connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    let (heard, mut notes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(note) = message {
                let _ = heard.send((note.channel().to_owned(), note.payload().to_owned()));
            }
        }
    });
    listener.batch_execute("LISTEN wasmjobs_jobs").await.expect("LISTEN");
    let mut app = connect(&url).await;

    // Rolled back: silent. Then a due job on `mail`: heard, and first.
    let tx = app.transaction().await.expect("begin");
    let job = wasmjobs_client::Job::new("WelcomeJob").queue("rolled");
    wasmjobs_client::pg::push(&tx, &job).await.expect("push");
    tx.rollback().await.expect("rollback");
    let later = wasmjobs_client::Job::new("WelcomeJob")
        .queue("later")
        .at(SystemTime::now() + Duration::from_secs(3600));
    wasmjobs_client::pg::push(&app, &later).await.expect("push later");
    let jobs: Vec<wasmjobs_client::Job> = (0..3)
        .map(|i| wasmjobs_client::Job::new("WelcomeJob").args(json!([i])).queue("mail"))
        .chain([wasmjobs_client::Job::new("WelcomeJob").unique_key("once").queue("mail")])
        .chain([wasmjobs_client::Job::new("WelcomeJob").unique_key("once").queue("mail")])
        .collect();
    let tx = app.transaction().await.expect("begin");
    let jids = wasmjobs_client::pg::push_bulk(&tx, &jobs).await.expect("push_bulk");
    tx.commit().await.expect("commit");
    let mut next = async || {
        let note = tokio::time::timeout(Duration::from_secs(30), notes.recv())
            .await
            .expect("a notification within 30 s")
            .expect("the listener is up");
        assert_eq!(note.0, "wasmjobs_jobs");
        note.1
    };
    assert_eq!(next().await, "mail", "the first notification");
    // One per queue per transaction: PostgreSQL folded the batch's, so the
    // next one heard is the next transaction's.
    let last = wasmjobs_client::Job::new("WelcomeJob").queue("last");
    wasmjobs_client::pg::push(&app, &last).await.expect("push last");
    assert_eq!(next().await, "last");

    assert_eq!(jids.len(), 5);
    assert!(jids[..4].iter().all(Option::is_some), "{jids:?}");
    assert_eq!(jids[4], None, "the second holder of a key is not let in");
    let stored: Vec<(String, Value)> = app
        .query(
            "SELECT payload->>'jid', (payload->'args')::text FROM wasmjobs.jobs WHERE queue = 'mail' ORDER BY id",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|row| (row.get(0), serde_json::from_str(row.get::<_, &str>(1)).expect("json")))
        .collect();
    let order: Vec<&str> = stored.iter().map(|(jid, _)| jid.as_str()).collect();
    let given: Vec<&str> = jids[..4].iter().flatten().map(String::as_str).collect();
    assert_eq!(order, given, "enqueued in the order given");
    assert_eq!(stored[2].1, json!([2]));
}

/// docs/postgres.md's Rails snippet, as written there, run by Ruby with
/// Debian's ActiveRecord and `pg`: a job enqueued in a transaction that
/// rolls back leaves neither the user nor the job; one that commits leaves
/// both, the job in Sidekiq's shape with the user's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_rails_snippet_enqueues_with_the_models_transaction() {
    let (_pg, url) = store();
    let doc = std::fs::read_to_string(wasmjobs_e2e::repo_root().join("docs/postgres.md")).expect("docs/postgres.md");
    let start = doc.find("```ruby\n").expect("a ruby block in docs/postgres.md") + "```ruby\n".len();
    let snippet = &doc[start..start + doc[start..].find("```").expect("the block's end")];
    assert!(snippet.contains("wasmjobs.enqueue"), "{snippet}");
    let program = format!(
        r#"require "active_record"
ActiveRecord::Base.establish_connection(ENV.fetch("DATABASE_URL"))
ActiveRecord::Base.connection.execute("CREATE TABLE users (id bigserial PRIMARY KEY, email text NOT NULL)")
class User < ActiveRecord::Base; end
ActiveRecord::Base.transaction do
  email = "rolled-back@example.com"
{snippet}
  raise ActiveRecord::Rollback
end
email = "committed@example.com"
{snippet}
puts User.find_by!(email: email).id
"#
    );
    let id: i64 = wasmjobs_e2e::sidekiq::run_ruby(&program, &[("DATABASE_URL", &url)])
        .parse()
        .expect("the user's id");
    let store = connect(&url).await;
    assert_eq!(count(&store, "SELECT count(*) FROM users").await, 1);
    let rows = store
        .query("SELECT queue, payload::text FROM wasmjobs.jobs", &[])
        .await
        .expect("jobs");
    assert_eq!(rows.len(), 1, "only the committed transaction's job");
    assert_eq!(rows[0].get::<_, String>(0), "mail");
    let payload: Value = serde_json::from_str(rows[0].get(1)).expect("json");
    assert_eq!(payload["class"], "WelcomeJob");
    assert_eq!(payload["args"], json!([id]));
    assert_eq!(payload["jid"].as_str().map(str::len), Some(24));
}

/// Two runners on the store, a schedule firing every second: each tick is
/// claimed in PostgreSQL once, its job enqueued there and run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_on_two_runners_enqueues_each_tick_once() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    wasmjobs_e2e::append_to_manifest(
        &dir.path().join("chaos"),
        "\n[[schedule]]\nname = \"every-second\"\ncron = \"* * * * * *\"\nclass = \"ChaosJob\"\nargs = [\"span\", \"cron.txt\", \"tick\", 0]\n",
    );
    let file = dir.path().join("chaos/data/cron.txt");
    let flags = source_flags(&url, &[]);
    let mut first = Runner::start(&redis.url(), dir.path(), &flags);
    let mut second = Runner::start(&redis.url(), dir.path(), &flags);
    first.wait_running();
    second.wait_running();
    let store = connect(&url).await;
    let start = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs() as i64 + 1;
    let last = start + 5;
    eventually(
        "six ticks claimed",
        Duration::from_secs(30),
        &mut [&mut first, &mut second],
        || {
            let store = &store;
            async move {
                let claimed: i64 = store
                    .query_one(
                        "SELECT count(*) FROM wasmjobs.cron_ticks WHERE tick BETWEEN $1 AND $2",
                        &[&start, &last],
                    )
                    .await
                    .expect("ticks")
                    .get(0);
                claimed == 6
            }
        },
    )
    .await;
    first.stop();
    second.stop();
    // Every claimed tick's job ran once, here, and nothing is left.
    let claimed = count(&store, "SELECT count(*) FROM wasmjobs.cron_ticks").await;
    let ran = lines(&file)
        .iter()
        .filter(|line| line.starts_with("start tick "))
        .count();
    let left = count(&store, "SELECT count(*) FROM wasmjobs.jobs").await;
    assert_eq!(ran as i64 + left, claimed, "one job per claimed tick");
    let mut jids: Vec<String> = lines(&file)
        .iter()
        .filter(|line| line.starts_with("start tick "))
        .filter_map(|line| line.split(' ').nth(2).map(str::to_owned))
        .collect();
    let all = jids.len();
    jids.sort();
    jids.dedup();
    assert_eq!(jids.len(), all, "a job ran twice");
    // Nothing went to Redis's queues.
    let mut conn = redis.conn().await;
    let queued: u64 = redis::cmd("LLEN")
        .arg("queue:default")
        .query_async(&mut conn)
        .await
        .expect("LLEN");
    assert_eq!(queued, 0);
}
