//! The `sql` capability end to end: real PostgreSQL and SQLite, the real
//! executor, the test guest `ChaosJob` (modes `sql`, `sql-exec`,
//! `sql-typed`) and the example plugins `SqlJob` and `PgSleepJob`.
//!
//! ChaosJob's manifest grants `main`, `local` and `missing`; the tests
//! configure `main`, `local` (the same database with one connection, small
//! caps and a short timeout) and `secret` (configured, never granted).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmjobs::host::sql::{Databases, DbSpec};
use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{Execution, Executor};
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, plugins, push, wait_processed};
use wasmjobs_e2e::{catalog, copy_plugin, executor, messages, plugins_dir, run, test_guests_dir};

/// The runner's databases, as `--db NAME=URL` would give them.
fn databases(specs: &[String]) -> Arc<Databases> {
    let specs: Vec<DbSpec> = specs.iter().map(|s| s.parse().expect("valid --db")).collect();
    Arc::new(Databases::open(&specs, Path::new("/nonexistent")).expect("open databases"))
}

/// The three databases every suite configures, for one backend.
struct Setup {
    postgres: bool,
    main: String,
    local: String,
    secret: String,
}

impl Setup {
    fn specs(&self) -> Vec<String> {
        vec![
            format!("main={}", self.main),
            format!("local={}", self.local),
            format!("secret={}", self.secret),
        ]
    }

    /// A statement producing `n` rows, in this backend's dialect.
    fn series(&self, n: u64) -> String {
        if self.postgres {
            format!("SELECT generate_series(1, {n}) AS x")
        } else {
            format!("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT x FROM c")
        }
    }
}

struct Chaos {
    executor: Executor,
    catalog: Catalog,
}

impl Chaos {
    fn new(setup: &Setup) -> Chaos {
        let executor = executor(8).with_databases(databases(&setup.specs()));
        let catalog = catalog(&test_guests_dir().join("chaos"), &executor);
        Chaos { executor, catalog }
    }

    async fn job(&self, args: Value) -> Execution {
        run(&self.executor, &self.catalog, "ChaosJob", &args.to_string()).await
    }

    /// Runs a query; panics unless it succeeds; returns the rows as JSON.
    async fn rows(&self, db: &str, statement: &str, params: Value) -> Vec<Value> {
        let execution = self.job(json!(["sql", db, statement, params])).await;
        assert_eq!(execution.outcome, Outcome::Success, "{statement}: {:?}", execution.logs);
        messages(&execution)
            .iter()
            .filter_map(|m| m.strip_prefix("row: "))
            .map(|row| serde_json::from_str(row).expect("row JSON"))
            .collect()
    }

    /// Runs a statement with `execute`; returns the affected count.
    async fn exec(&self, db: &str, statement: &str, params: Value) -> u64 {
        let execution = self.job(json!(["sql-exec", db, statement, params])).await;
        assert_eq!(execution.outcome, Outcome::Success, "{statement}: {:?}", execution.logs);
        messages(&execution)
            .iter()
            .find_map(|m| m.strip_prefix("affected: ").map(|n| n.parse().expect("count")))
            .expect("affected line")
    }

    /// Runs a query that must fail; returns the retry message.
    async fn fails(&self, db: &str, statement: &str, params: Value) -> String {
        let execution = self.job(json!(["sql", db, statement, params])).await;
        match execution.outcome {
            Outcome::Retry(message) => message,
            other => panic!("{statement}: expected a retryable failure, got {other:?}"),
        }
    }
}

/// Everything both backends must do alike.
async fn common_suite(setup: &Setup, chaos: &Chaos) {
    // A granted, configured database works.
    assert_eq!(chaos.rows("main", "SELECT 1 AS one", json!([])).await, [json!([1])]);
    let execution = chaos.job(json!(["sql", "main", "SELECT 1 AS one, 'a' AS two"])).await;
    assert!(
        messages(&execution).contains(&r#"columns: ["one","two"]"#.to_owned()),
        "{:?}",
        execution.logs
    );

    let (blob_type, bool_type) = if setup.postgres {
        ("BYTEA", "BOOLEAN")
    } else {
        ("BLOB", "BOOLEAN")
    };
    let ddl = format!(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, i BIGINT, f DOUBLE PRECISION, t TEXT, b {blob_type}, flag {bool_type}, n BIGINT)"
    );
    assert_eq!(chaos.exec("main", &ddl, json!([])).await, 0);

    // Parameters are bound, never spliced: the value is stored verbatim and
    // the table survives.
    let evil = "'; DROP TABLE t; --";
    let insert = "INSERT INTO t (id, i, f, t, b, flag, n) VALUES ($1, $2, $3, $4, $5, $6, $7)";
    let big = -9_007_199_254_740_993_i64; // not representable as f64
    let params = json!([1, big, 1.5, evil, {"blob": [0, 255, 1]}, true, null]);
    assert_eq!(chaos.exec("main", insert, params).await, 1);
    let select = "SELECT i, f, t, b, flag, n FROM t WHERE id = $1";
    let stored_flag = if setup.postgres { json!(true) } else { json!(1) };
    assert_eq!(
        chaos.rows("main", select, json!([1])).await,
        [json!([big, 1.5, evil, {"blob": [0, 255, 1]}, stored_flag, null])]
    );
    assert_eq!(
        chaos.rows("main", "SELECT count(*) AS n FROM t", json!([])).await,
        [json!([1])]
    );

    // The SDK's typed getters, by name and index, Option for NULL.
    let typed = chaos.job(json!(["sql-typed", "main", select, [1]])).await;
    assert_eq!(typed.outcome, Outcome::Success, "{:?}", typed.logs);
    let expected = format!("typed: i={big} f=1.5 t={evil:?} b=[0, 255, 1] flag=true n=None");
    assert!(messages(&typed).contains(&expected), "{:?}", typed.logs);

    // NULL in every column round-trips, and reading it as a plain type is a
    // clear error.
    let nulls = json!([2, null, null, null, null, null, null]);
    assert_eq!(chaos.exec("main", insert, nulls).await, 1);
    assert_eq!(
        chaos.rows("main", select, json!([2])).await,
        [json!([null, null, null, null, null, null])]
    );
    let typed = chaos.job(json!(["sql-typed", "main", select, [2]])).await;
    let message = typed.outcome.message().unwrap_or_default().to_owned();
    assert!(
        message.contains("sql type error") && message.contains("NULL"),
        "{message}"
    );

    // Floats and text survive exactly, including the awkward ones.
    let awkward = json!([3, 0, -0.000123456789, "tab\there \u{1F600} ü", {"blob": []}, false, 0]);
    assert_eq!(chaos.exec("main", insert, awkward).await, 1);
    let stored_false = if setup.postgres { json!(false) } else { json!(0) };
    assert_eq!(
        chaos.rows("main", select, json!([3])).await,
        [json!([0, -0.000123456789, "tab\there \u{1F600} ü", {"blob": []}, stored_false, 0])]
    );

    // Updates report affected rows.
    assert_eq!(
        chaos
            .exec("main", "UPDATE t SET n = $1 WHERE id > $2", json!([5, 1]))
            .await,
        2
    );

    // Not granted, whether or not the runner has it; granted but unknown.
    let message = chaos.fails("secret", "SELECT 1", json!([])).await;
    assert!(message.starts_with("sql not-granted error"), "{message}");
    assert!(
        message.contains("\"secret\"") && message.contains("wasmjobs.toml"),
        "{message}"
    );
    let message = chaos.fails("nowhere", "SELECT 1", json!([])).await;
    assert!(message.starts_with("sql not-granted error"), "{message}");
    let message = chaos.fails("missing", "SELECT 1", json!([])).await;
    assert!(message.starts_with("sql unknown-database error"), "{message}");
    assert!(message.contains("--db missing=URL"), "{message}");

    // SQL errors are job errors with the database's message.
    let message = chaos.fails("main", "SELEC 1", json!([])).await;
    assert!(
        message.starts_with("sql query error") && message.contains("syntax error"),
        "{message}"
    );
    let message = chaos.fails("main", "SELECT * FROM no_such_table", json!([])).await;
    assert!(message.contains("no_such_table"), "{message}");
    let message = chaos.fails("main", "INSERT INTO t (id) VALUES ($1)", json!([1])).await;
    assert!(message.starts_with("sql query error"), "{message}");
    let message = chaos.fails("main", "SELECT $1 AS a, $2 AS b", json!([1])).await;
    assert!(message.starts_with("sql query error"), "{message}");
    let message = chaos.fails("main", "SELECT $1 AS a", json!([1, 2])).await;
    assert!(message.starts_with("sql query error"), "{message}");
    let message = chaos.fails("main", "SELECT 1; SELECT 2", json!([])).await;
    assert!(message.starts_with("sql query error"), "{message}");
    for refused in ["BEGIN", "  /* hi */ commit", "SET search_path = x"] {
        let message = chaos.fails("main", refused, json!([])).await;
        assert!(message.contains("not allowed"), "{refused}: {message}");
    }

    // Result caps: rows and bytes (on `local`: max_rows=100, max_bytes=8KiB),
    // and the default 100,000 rows on `main`.
    assert_eq!(chaos.rows("local", &setup.series(100), json!([])).await.len(), 100);
    let message = chaos.fails("local", &setup.series(101), json!([])).await;
    assert!(
        message.starts_with("sql limit error") && message.contains("max_rows"),
        "{message}"
    );
    let message = chaos
        .fails("local", "SELECT $1 AS big", json!(["x".repeat(9000)]))
        .await;
    assert!(
        message.starts_with("sql limit error") && message.contains("max_bytes"),
        "{message}"
    );
    let message = chaos.fails("main", &setup.series(100_001), json!([])).await;
    assert!(message.contains("100000 rows"), "{message}");

    // A cached prepared statement whose table changed shape still works
    // (`local` has one connection, so the second query reuses the first's).
    assert_eq!(chaos.exec("local", "CREATE TABLE s (a BIGINT)", json!([])).await, 0);
    assert_eq!(
        chaos.exec("local", "INSERT INTO s (a) VALUES ($1)", json!([1])).await,
        1
    );
    assert_eq!(chaos.rows("local", "SELECT * FROM s", json!([])).await, [json!([1])]);
    assert_eq!(
        chaos
            .exec("local", "ALTER TABLE s ADD COLUMN b BIGINT", json!([]))
            .await,
        0
    );
    assert_eq!(
        chaos.rows("local", "SELECT * FROM s", json!([])).await,
        [json!([1, null])]
    );

    // The process keeps serving, on the same pools.
    assert_eq!(chaos.rows("local", "SELECT 2 AS two", json!([])).await, [json!([2])]);
    assert_eq!(chaos.job(json!(["ok"])).await.outcome, Outcome::Success);
    assert_eq!(
        chaos.rows("main", "SELECT count(*) AS n FROM t", json!([])).await,
        [json!([3])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_round_trips_values_and_fails_cleanly() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.create_database("other");
    let setup = Setup {
        postgres: true,
        main: pg.url("app"),
        local: format!("{}?max_rows=100&max_bytes=8KiB&timeout=1&pool=1", pg.url("app")),
        secret: pg.url("other"),
    };
    let chaos = Chaos::new(&setup);
    common_suite(&setup, &chaos).await;

    // The table really holds the hostile string, as psql sees it.
    assert_eq!(pg.psql("app", "SELECT t FROM t WHERE id = 1"), "'; DROP TABLE t; --");

    // PostgreSQL's richer types arrive as text in its own format.
    let rows = chaos
        .rows(
            "main",
            "SELECT 1.50::numeric AS n, '{\"a\":1}'::jsonb AS j, '{\"b\": 2}'::json AS js, \
             '00010203-0405-0607-0809-0a0b0c0d0e0f'::uuid AS u, \
             '2024-02-29 12:34:56.789+00'::timestamptz AS ts, '2024-02-29 01:02:03'::timestamp AS tsz, \
             '2024-02-29'::date AS d, '13:14:15.5'::time AS tm, 7::int2 AS s, 8::int4 AS i, 0.5::float4 AS r, \
             'v'::varchar AS v, 'c'::char(3) AS c, 9::oid AS o, NULL::int AS z, (-12345678901.000123)::numeric AS neg",
            json!([]),
        )
        .await;
    assert_eq!(
        rows,
        [json!([
            "1.50",
            "{\"a\": 1}",
            "{\"b\": 2}",
            "00010203-0405-0607-0809-0a0b0c0d0e0f",
            "2024-02-29 12:34:56.789+00",
            "2024-02-29 01:02:03",
            "2024-02-29",
            "13:14:15.5",
            7,
            8,
            0.5,
            "v",
            "c  ",
            9,
            null,
            "-12345678901.000123"
        ])]
    );
    // Text binds to any type the server can parse; ints to numeric and text.
    let rows = chaos
        .rows(
            "main",
            "SELECT $1::timestamptz = '2024-02-29 12:34:56.789+00'::timestamptz AS same, $2::numeric + 1 AS n, \
             $3::int4 AS i4, $4::jsonb AS j, $5 AS untyped, $6::float4 AS f4",
            json!(["2024-02-29 12:34:56.789+00", 41, 5, "{\"k\": [1]}", 12, 2.5]),
        )
        .await;
    assert_eq!(rows, [json!([true, "42", 5, "{\"k\": [1]}", "12", 2.5])]);
    let message = chaos.fails("main", "SELECT $1::int2 AS s", json!([100_000])).await;
    assert!(message.contains("out of range"), "{message}");
    let message = chaos
        .fails("main", "SELECT $1::int4 AS i", json!([{"blob": [1]}]))
        .await;
    assert!(message.contains("bytea"), "{message}");
    // Types without a mapping are refused with a hint; cast them instead.
    let message = chaos.fails("main", "SELECT ARRAY[1, 2] AS a", json!([])).await;
    assert!(message.contains("::text"), "{message}");
    assert_eq!(
        chaos.rows("main", "SELECT ARRAY[1, 2]::text AS a", json!([])).await,
        [json!(["{1,2}"])]
    );
    // pg_sleep returns void, which is NULL.
    assert_eq!(
        chaos.rows("main", "SELECT pg_sleep(0)", json!([])).await,
        [json!([null])]
    );

    // The statement timeout (1 s on `local`) cancels, and the pool recovers.
    let started = Instant::now();
    let message = chaos.fails("local", "SELECT pg_sleep(30)", json!([])).await;
    assert!(message.starts_with("sql timeout error"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(chaos.rows("local", "SELECT 3 AS three", json!([])).await, [json!([3])]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let active = pg.psql(
            "app",
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30)%' AND state = 'active'",
        );
        if active == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out statement is still running on the server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_round_trips_values_and_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("nested/app.db");
    let setup = Setup {
        postgres: false,
        main: format!("sqlite://{}", file.display()),
        local: format!(
            "sqlite://{}?max_rows=100&max_bytes=8KiB&timeout=1&pool=1",
            file.display()
        ),
        secret: format!("sqlite://{}", dir.path().join("secret.db").display()),
    };
    let chaos = Chaos::new(&setup);
    assert!(file.is_file(), "the database file is created at start-up");
    common_suite(&setup, &chaos).await;

    // WAL mode.
    assert_eq!(
        chaos.rows("main", "PRAGMA journal_mode", json!([])).await,
        [json!(["wal"])]
    );
    // `?`, `?NNN` and `$NNN` placeholders, in any order; named ones refused.
    assert_eq!(
        chaos.rows("main", "SELECT ? AS a, ? AS b", json!([1, 2])).await,
        [json!([1, 2])]
    );
    assert_eq!(
        chaos.rows("main", "SELECT $2 AS a, $1 AS b", json!([1, 2])).await,
        [json!([2, 1])]
    );
    assert_eq!(
        chaos
            .rows("main", "SELECT ?2 AS a, ?1 AS b, ?2 AS c", json!([1, 2]))
            .await,
        [json!([2, 1, 2])]
    );
    let message = chaos.fails("main", "SELECT :x AS a", json!([1])).await;
    assert!(message.contains("named parameter"), "{message}");
    // No reaching other files.
    let outside = dir.path().join("copy.db");
    let message = chaos
        .fails("main", &format!("VACUUM INTO '{}'", outside.display()), json!([]))
        .await;
    assert!(message.starts_with("sql query error"), "{message}");
    assert!(!outside.exists());
    // The statement timeout (1 s on `local`) interrupts a runaway query.
    let started = Instant::now();
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
    let message = chaos.fails("local", endless, json!([])).await;
    assert!(message.starts_with("sql timeout error"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(chaos.rows("local", "SELECT 3 AS three", json!([])).await, [json!([3])]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_granted_or_configured_by_default() {
    // A runner without --db: a granted name is unknown.
    let bare = executor(2);
    let chaos = catalog(&test_guests_dir().join("chaos"), &bare);
    let execution = run(&bare, &chaos, "ChaosJob", r#"["sql", "main", "SELECT 1"]"#).await;
    let message = execution.outcome.message().unwrap_or_default();
    assert!(message.starts_with("sql unknown-database error"), "{message}");
    let examples = catalog(&plugins_dir(), &bare);
    let execution = run(&bare, &examples, "SqlJob", r#"["main", "SELECT 1"]"#).await;
    assert!(
        matches!(&execution.outcome, Outcome::Dead(m) if m.contains("unknown-database")),
        "{:?}",
        execution.outcome
    );

    // A manifest without `sql` grants nothing, whatever the runner has.
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = copy_plugin(&test_guests_dir().join("chaos"), dir.path());
    let manifest = plugin.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("sql ="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&manifest, without).expect("rewrite manifest");
    let url = format!("main=sqlite://{}", dir.path().join("main.db").display());
    let executor = executor(2).with_databases(databases(&[url]));
    let ungranted = catalog(&plugin, &executor);
    let execution = run(&executor, &ungranted, "ChaosJob", r#"["sql", "main", "SELECT 1"]"#).await;
    let message = execution.outcome.message().unwrap_or_default();
    assert!(
        message.starts_with("sql not-granted error") && message.contains("no `sql` grants"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_sleep_jobs_overlap_on_a_shared_pool() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    let executor = Arc::new(executor(100).with_databases(databases(&[format!("main={}?pool=100", pg.url("app"))])));
    let catalog = Arc::new(catalog(&plugins_dir(), &executor));
    // Warm the pool (connections are opened on first use).
    let warm: Vec<_> = (0..100)
        .map(|_| {
            let (executor, catalog) = (executor.clone(), catalog.clone());
            tokio::spawn(async move { run(&executor, &catalog, "PgSleepJob", "[]").await.outcome })
        })
        .collect();
    for job in warm {
        assert_eq!(job.await.expect("join"), Outcome::Success);
    }
    let jobs = 1_000;
    let started = Instant::now();
    let handles: Vec<_> = (0..jobs)
        .map(|_| {
            let (executor, catalog) = (executor.clone(), catalog.clone());
            tokio::spawn(async move { run(&executor, &catalog, "PgSleepJob", "[]").await.outcome })
        })
        .collect();
    for job in handles {
        assert_eq!(job.await.expect("join"), Outcome::Success);
    }
    let elapsed = started.elapsed();
    let ideal = Duration::from_millis(100) * jobs / 100;
    let efficiency = ideal.as_secs_f64() / elapsed.as_secs_f64();
    eprintln!("PgSleepJob x{jobs} at concurrency 100, pool 100: {elapsed:?} (efficiency {efficiency:.2})");
    assert!(
        efficiency >= 0.7,
        "efficiency {efficiency:.2} ({elapsed:?} for {jobs} jobs)"
    );
    let connections = pg.psql(
        "app",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wasmjobs'",
    );
    let connections: u32 = connections.parse().expect("count");
    assert!(connections <= 100, "{connections} connections for a pool of 100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasmjobs_run_serves_sql_jobs_with_db_options() {
    let redis = TestRedis::start();
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.psql("app", "CREATE TABLE hits (id serial PRIMARY KEY, note text)");
    let mut conn = redis.conn().await;
    let dir = plugins(&["sql", "pg-sleep"], &[]);
    let local = dir.path().join("local.db");
    let main = format!("main={}?pool=100", pg.url("app"));
    let local = format!("local=sqlite://{}", local.display());
    // A plugin's own database for a plugin that is not there (a typo).
    let typo = format!("main@sq1={}?pool=1", pg.url("app"));
    let mut runner = Runner::start(
        &redis.url(),
        dir.path(),
        &["--concurrency", "100", "--db", &main, "--db", &local, "--db", &typo],
    );
    runner.wait_running();
    // The pool was filled before the first job: the first wave of 100
    // PgSleepJobs does not queue behind 100 simultaneous connects.
    let warm = pg.psql(
        "app",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wasmjobs'",
    );
    assert_eq!(warm, "100", "{}", runner.log());

    push(
        &mut conn,
        "SqlJob",
        "default",
        (0..20)
            .map(|i| {
                json!([
                    "main",
                    format!("INSERT INTO hits (note) VALUES ('job {i}') RETURNING id")
                ])
            })
            .collect(),
    )
    .await;
    push(
        &mut conn,
        "SqlJob",
        "default",
        vec![json!(["local", "SELECT 40 + 2 AS answer, 'ok' AS word"])],
    )
    .await;
    wait_processed(&mut conn, 21, Duration::from_secs(60), || runner.log()).await;
    let jobs = 500;
    let started = Instant::now();
    push(
        &mut conn,
        "PgSleepJob",
        "default",
        (0..jobs).map(|_| json!([])).collect(),
    )
    .await;
    wait_processed(&mut conn, 21 + u64::from(jobs), Duration::from_secs(120), || {
        runner.log()
    })
    .await;
    let elapsed = started.elapsed();
    assert!(runner.stop().success(), "{}", runner.log());

    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
    assert_eq!(pg.psql("app", "SELECT count(*) FROM hits"), "20");
    let log = runner.log();
    assert!(log.contains("main: 1 row(s)"), "{log}");
    assert!(log.contains("local: first row: answer=42, word='ok'"), "{log}");
    assert!(log.contains("database configured"), "{log}");
    assert!(
        log.contains(r#"--db main@sq1: no plugin named "sq1" is loaded"#),
        "{log}"
    );
    let efficiency = (Duration::from_millis(100) * jobs / 100).as_secs_f64() / elapsed.as_secs_f64();
    eprintln!("wasmjobs run: PgSleepJob x{jobs} at concurrency 100: {elapsed:?} (efficiency {efficiency:.2})");
}

#[test]
fn wasmjobs_exec_takes_db_options() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["exec", "--plugins"])
        .arg(plugins_dir())
        .args([
            "--db",
            "local=sqlite://relative/local.db",
            "SqlJob",
            r#"["local", "SELECT 6 * 7 AS n"]"#,
        ])
        .output()
        .expect("run wasmjobs exec");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("local: first row: n=42"), "{stdout}");
    assert!(
        dir.path().join("relative/local.db").is_file(),
        "relative paths live under the data dir"
    );

    let output = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["exec", "--plugins"])
        .arg(plugins_dir())
        .args(["SqlJob", r#"["main", "SELECT 1"]"#])
        .output()
        .expect("run wasmjobs exec");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("unknown-database"), "{stdout}");

    let output = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin())
        .args(["exec", "--db", "main=mysql://x", "SqlJob", "[]"])
        .output()
        .expect("run wasmjobs exec");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("postgres://"));
}

/// `wasmjobs exec` of SqlJob from `dir/plugins` (its data directory `dir`)
/// with `--db`/`WASMJOBS_DB` as given; its output (stdout, stderr) and exit
/// code.
fn exec_sql_job(dir: &Path, env_db: Option<&str>, db_args: &[&str], args: &str) -> (String, String, Option<i32>) {
    let mut command = std::process::Command::new(wasmjobs_e2e::runner::wasmjobs_bin());
    command
        .arg("--data-dir")
        .arg(dir)
        .args(["exec", "--plugins"])
        .arg(dir.join("plugins"));
    for spec in db_args {
        command.args(["--db", spec]);
    }
    command.args(["SqlJob", args]).env_remove("WASMJOBS_DB");
    if let Some(value) = env_db {
        command.env("WASMJOBS_DB", value);
    }
    let output = command.output().expect("run wasmjobs exec");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.code(),
    )
}

/// `NAME@PLUGIN=URL` gives one plugin (here `sql`, SqlJob's) its
/// own credentials for `NAME`, beside `NAME=URL` for every other plugin,
/// from the command line or `WASMJOBS_DB`; `application_name` names the
/// plugin either way. A bad `--db` is refused with a reason and without
/// the password it carries.
#[test]
fn wasmjobs_exec_gives_a_plugin_its_own_db_credentials() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.psql("postgres", "CREATE ROLE reporter LOGIN");
    let dir = tempfile::tempdir().expect("tempdir");
    // SqlJob alone (a copy of plugins/sql), so that only it is compiled.
    copy_plugin(&plugins_dir().join("sql"), &dir.path().join("plugins"));
    let who = r#"["main", "SELECT current_user AS who, current_setting('application_name') AS app"]"#;
    let default = format!("main={}", pg.url("app"));
    let own = format!("main@sql={}", pg.url_as("reporter", "app"));
    let other = format!("main@other={}", pg.url_as("reporter", "app"));
    for (env_db, db_args, expected) in [
        (
            Some(format!("{default} {own}")),
            vec![],
            "who='reporter', app='wasmjobs/sql'",
        ),
        (
            None,
            vec![own.clone(), default.clone()],
            "who='reporter', app='wasmjobs/sql'",
        ),
        (None, vec![default.clone()], "who='wasmjobs', app='wasmjobs/sql'"),
        (
            Some(format!("{other} {default}")),
            vec![],
            "who='wasmjobs', app='wasmjobs/sql'",
        ),
        (None, vec![own.clone()], "who='reporter', app='wasmjobs/sql'"),
        (
            None,
            vec![format!("{default}?application_name=mine")],
            "who='wasmjobs', app='mine'",
        ),
    ] {
        let db_args: Vec<&str> = db_args.iter().map(String::as_str).collect();
        let (stdout, stderr, code) = exec_sql_job(dir.path(), env_db.as_deref(), &db_args, who);
        assert_eq!(code, Some(0), "{env_db:?} {db_args:?}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("main: first row: {expected}")),
            "{env_db:?} {db_args:?}: {stdout}"
        );
    }
    // An override without a default serves only its plugin.
    let (stdout, _, code) = exec_sql_job(dir.path(), None, &[&other], who);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("unknown-database"), "{stdout}");

    let secret = "Zq-secret";
    let url = format!("postgres://u:{secret}@127.0.0.1:1/app");
    for (spec, needle) in [
        (format!("main@={url}"), "plugin name"),
        (format!("main@../sql={url}"), "plugin name"),
        (format!("main@.hidden={url}"), "plugin name"),
        (format!("main@a@b={url}"), "plugin name"),
        (format!("@sql={url}"), "database name"),
        (format!("main={url}?pool=0"), "pool=0"),
        (format!("{url}?sslmode=disable"), "NAME=URL"),
    ] {
        for (env_db, db_args) in [(Some(spec.as_str()), vec![]), (None, vec![spec.as_str()])] {
            let (stdout, stderr, code) = exec_sql_job(dir.path(), env_db, &db_args, who);
            assert_eq!(code, Some(2), "{spec}: {stdout}\n{stderr}");
            assert!(stderr.contains(needle), "{spec}: {stderr}");
            assert!(!stderr.contains(secret) && !stdout.contains(secret), "{spec}: {stderr}");
        }
    }
    let (_, stderr, code) = exec_sql_job(dir.path(), None, &[&own, &own], who);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("main@sql") && stderr.contains("twice"), "{stderr}");
}
