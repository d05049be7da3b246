//! Trust tests: SQL. Pooled connections are shared by the jobs of every
//! plugin, so nothing one job does to its session (settings, temp tables,
//! advisory locks, SQLite pragmas and temp triggers) may reach the next;
//! a read-only grant is enforced by the database, not by statement text; a
//! plugin cannot hold more connections than its concurrency limit; a
//! SQLite file cannot grow past its size budget; and plugins sharing one
//! PostgreSQL role can watch and end each other's sessions, which a role
//! per plugin (`--db NAME@PLUGIN=URL`) stops.
//!
//! The guest is `ChaosJob` (modes `sql`, `sql-exec`), copied per test so
//! that its manifest can carry the grants and limits under test.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmjobs::host::sql::{Databases, DbSpec};
use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{Execution, Executor};
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::{catalog, copy_plugin, executor, messages, run, test_guests_dir};

/// The runner's databases, as `--db NAME=URL` would give them.
fn databases(specs: &[String]) -> Arc<Databases> {
    let specs: Vec<DbSpec> = specs.iter().map(|s| s.parse().expect("valid --db")).collect();
    Arc::new(Databases::open(&specs, Path::new("/nonexistent")).expect("open databases"))
}

/// A copy of ChaosJob under `dir/<label>/` whose manifest's `sql = ...`
/// line is `grants`, plus `extra` appended (e.g. a `[limits]` table).
fn chaos_plugin(dir: &Path, label: &str, grants: &str, extra: &str) -> PathBuf {
    let plugin = copy_plugin(&test_guests_dir().join("chaos"), &dir.join(label));
    let manifest = plugin.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let mut rewritten: String = text
        .lines()
        .map(|l| {
            if l.starts_with("sql =") {
                grants.to_owned()
            } else {
                l.to_owned()
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    rewritten.push_str(extra);
    std::fs::write(&manifest, rewritten).expect("rewrite manifest");
    plugin
}

/// One plugin's catalog on a shared executor.
struct Plugin {
    executor: Arc<Executor>,
    catalog: Arc<Catalog>,
}

impl Plugin {
    fn new(executor: &Arc<Executor>, dir: &Path) -> Plugin {
        Plugin {
            executor: executor.clone(),
            catalog: Arc::new(catalog(dir, executor)),
        }
    }

    async fn job(&self, args: Value) -> Execution {
        run(&self.executor, &self.catalog, "ChaosJob", &args.to_string()).await
    }

    /// Runs a query; panics unless it succeeds; returns the rows as JSON.
    async fn rows(&self, db: &str, statement: &str) -> Vec<Value> {
        let execution = self.job(json!(["sql", db, statement, []])).await;
        assert_eq!(execution.outcome, Outcome::Success, "{statement}: {:?}", execution.logs);
        messages(&execution)
            .iter()
            .filter_map(|m| m.strip_prefix("row: "))
            .map(|row| serde_json::from_str(row).expect("row JSON"))
            .collect()
    }

    /// Runs a statement; its error message, or `None` if it succeeded.
    async fn outcome(&self, db: &str, statement: &str) -> Option<String> {
        match self.job(json!(["sql", db, statement, []])).await.outcome {
            Outcome::Success => None,
            Outcome::Retry(message) => Some(message),
            other => panic!("{statement}: expected success or a sql error, got {other:?}"),
        }
    }

    /// Runs a statement that must fail; returns the message.
    async fn fails(&self, db: &str, statement: &str) -> String {
        self.outcome(db, statement)
            .await
            .unwrap_or_else(|| panic!("{statement}: expected a sql error, it succeeded"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_session_state_does_not_reach_the_next_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("app.db");
    let executor =
        Arc::new(executor(4).with_databases(databases(&[format!("main=sqlite://{}?pool=1", file.display())])));
    let chaos = Plugin::new(&executor, &chaos_plugin(dir.path(), "a", "sql = [\"main\"]", ""));
    chaos.rows("main", "CREATE TABLE t (x INTEGER)").await;
    chaos.rows("main", "INSERT INTO t VALUES (1)").await;

    // One job turns its (only) connection read-only; the next must still write.
    let _ = chaos.outcome("main", "PRAGMA query_only = 1").await;
    chaos.rows("main", "INSERT INTO t VALUES (2)").await;
    // Nor may it switch journaling off WAL, or otherwise retune the file.
    let _ = chaos.outcome("main", "PRAGMA journal_mode = DELETE").await;
    assert_eq!(chaos.rows("main", "PRAGMA journal_mode").await, [json!(["wal"])]);
    // A temp table shadowing `t` for whoever gets the connection next.
    let _ = chaos.outcome("main", "CREATE TEMP TABLE t AS SELECT 666 AS x").await;
    assert_eq!(
        chaos.rows("main", "SELECT x FROM t ORDER BY x").await,
        [json!([1]), json!([2])]
    );
    // A temp trigger rewriting every later insert into `t`.
    let _ = chaos
        .outcome(
            "main",
            "CREATE TEMP TRIGGER spy AFTER INSERT ON main.t BEGIN UPDATE t SET x = 666; END",
        )
        .await;
    chaos.rows("main", "INSERT INTO t VALUES (3)").await;
    assert_eq!(
        chaos.rows("main", "SELECT x FROM t ORDER BY x").await,
        [json!([1]), json!([2]), json!([3])]
    );
    // A temp view of the same name.
    let _ = chaos.outcome("main", "CREATE TEMP VIEW t AS SELECT 666 AS x").await;
    assert_eq!(chaos.rows("main", "SELECT count(*) FROM t").await, [json!([3])]);
    // These are refused outright, with an error the guest can read.
    for statement in [
        "PRAGMA query_only = 1",
        "PRAGMA main.query_only = true",
        "PRAGMA max_page_count = 1",
        "CREATE TEMP TABLE x (y INTEGER)",
        "/* */ ATTACH DATABASE ':memory:' AS m",
    ] {
        let message = chaos.fails("main", statement).await;
        assert!(message.starts_with("sql query error"), "{statement}: {message}");
    }
    // Schema introspection still works.
    assert_eq!(chaos.rows("main", "PRAGMA table_info(t)").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_read_only_grant_is_enforced_by_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("app.db");
    let executor =
        Arc::new(executor(4).with_databases(databases(&[format!("main=sqlite://{}?pool=1", file.display())])));
    let writer = Plugin::new(&executor, &chaos_plugin(dir.path(), "w", "sql = [\"main\"]", ""));
    let reader = Plugin::new(
        &executor,
        &chaos_plugin(dir.path(), "r", "sql = [{ name = \"main\", mode = \"ro\" }]", ""),
    );
    writer.rows("main", "CREATE TABLE t (x INTEGER)").await;
    writer.rows("main", "INSERT INTO t VALUES (1)").await;

    assert_eq!(reader.rows("main", "SELECT x FROM t").await, [json!([1])]);
    for statement in [
        "INSERT INTO t VALUES (2)",
        "WITH c AS (SELECT 2) INSERT INTO t SELECT * FROM c",
        "UPDATE t SET x = 2",
        "DELETE FROM t",
        "CREATE TABLE u (y INTEGER)",
        "DROP TABLE t",
    ] {
        let message = reader.fails("main", statement).await;
        assert!(message.starts_with("sql query error"), "{statement}: {message}");
    }
    // Turning `query_only` off first does not help (pool = 1: same connection).
    let _ = reader.outcome("main", "PRAGMA query_only = 0").await;
    let message = reader.fails("main", "INSERT INTO t VALUES (2)").await;
    assert!(
        message.contains("readonly") || message.contains("read-only"),
        "{message}"
    );
    assert_eq!(writer.rows("main", "SELECT x FROM t").await, [json!([1])]);
    // And the read-only job leaves the connection writable for a rw grant.
    writer.rows("main", "INSERT INTO t VALUES (3)").await;
    assert_eq!(
        writer.rows("main", "SELECT x FROM t ORDER BY x").await,
        [json!([1]), json!([3])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_size_budget_fails_the_statement_not_the_runner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("app.db");
    let executor = Arc::new(executor(4).with_databases(databases(&[format!(
        "main=sqlite://{}?max_size=256KiB&pool=2",
        file.display()
    )])));
    let chaos = Plugin::new(&executor, &chaos_plugin(dir.path(), "a", "sql = [\"main\"]", ""));
    chaos.rows("main", "CREATE TABLE big (b BLOB)").await;
    let fill = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000) \
                INSERT INTO big SELECT randomblob(1000) FROM c";
    let message = chaos.fails("main", fill).await;
    assert!(message.starts_with("sql limit error"), "{message}");
    assert!(
        message.contains("size limit") && message.contains("max_size"),
        "{message}"
    );
    // The failed statement left nothing behind, and smaller writes go on.
    assert_eq!(chaos.rows("main", "SELECT count(*) FROM big").await, [json!([0])]);
    chaos.rows("main", "INSERT INTO big VALUES (randomblob(1000))").await;
    assert_eq!(chaos.rows("main", "SELECT count(*) FROM big").await, [json!([1])]);
    let size = std::fs::metadata(&file).expect("db file").len();
    assert!(size <= 256 << 10, "the file is {size} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session_state_does_not_reach_the_next_job() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.psql(
        "app",
        "CREATE TABLE t (x int); INSERT INTO t VALUES (1); \
         CREATE SCHEMA evil; CREATE TABLE evil.t (x int); INSERT INTO evil.t VALUES (666)",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let executor =
        Arc::new(executor(4).with_databases(databases(&[format!("main={}?pool=1&timeout=5", pg.url("app"))])));
    let chaos = Plugin::new(&executor, &chaos_plugin(dir.path(), "a", "sql = [\"main\"]", ""));

    // A session-level setting, even from inside a SELECT or a DO block.
    chaos
        .rows("main", "SELECT set_config('search_path', 'evil', false)")
        .await;
    assert_eq!(chaos.rows("main", "SELECT x FROM t").await, [json!([1])]);
    chaos
        .rows(
            "main",
            "DO $$ BEGIN PERFORM set_config('search_path', 'evil', false); END $$",
        )
        .await;
    assert_eq!(chaos.rows("main", "SELECT x FROM t").await, [json!([1])]);
    chaos
        .rows("main", "SELECT set_config('statement_timeout', '0', false)")
        .await;
    assert_eq!(
        chaos.rows("main", "SELECT current_setting('statement_timeout')").await,
        [json!(["5s"])]
    );
    // A temp table shadowing `t` (pg_temp comes first in the search path).
    chaos.rows("main", "CREATE TEMP TABLE t AS SELECT 666 AS x").await;
    assert_eq!(chaos.rows("main", "SELECT x FROM t").await, [json!([1])]);
    // A session advisory lock is released when the job's statement is done.
    chaos.rows("main", "SELECT pg_advisory_lock(42)").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = pg.psql("app", "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
        if held == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "the advisory lock outlived its job");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        chaos.rows("main", "SELECT pg_try_advisory_lock(42)").await,
        [json!([true])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_only_grant_is_enforced_by_the_database() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    pg.psql("app", "CREATE TABLE t (x int); INSERT INTO t VALUES (1)");
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg.url("app");
    let executor =
        Arc::new(executor(4).with_databases(databases(&[format!("main={url}?pool=1"), format!("rw={url}?pool=1")])));
    let reader = Plugin::new(
        &executor,
        &chaos_plugin(
            dir.path(),
            "r",
            "sql = [{ name = \"main\", mode = \"ro\" }, \"rw\"]",
            "",
        ),
    );
    assert_eq!(reader.rows("main", "SELECT x FROM t").await, [json!([1])]);
    for statement in [
        "INSERT INTO t VALUES (2)",
        "WITH c AS (INSERT INTO t VALUES (2) RETURNING x) SELECT x FROM c",
        "DO $$ BEGIN INSERT INTO t VALUES (2); END $$",
        "DO $$ BEGIN SET TRANSACTION READ WRITE; INSERT INTO t VALUES (2); END $$",
        "SELECT set_config('transaction_read_only', 'off', false), (SELECT count(*) FROM t)",
        "CREATE TABLE u (y int)",
        "DELETE FROM t",
    ] {
        let message = reader.fails("main", statement).await;
        assert!(message.starts_with("sql query error"), "{statement}: {message}");
    }
    // Changing the session default first does not help either.
    let _ = reader
        .outcome(
            "main",
            "SELECT set_config('default_transaction_read_only', 'off', false)",
        )
        .await;
    let message = reader.fails("main", "INSERT INTO t VALUES (2)").await;
    assert!(message.contains("read-only transaction"), "{message}");
    // The same plugin writes through its rw grant.
    reader.rows("rw", "INSERT INTO t VALUES (3)").await;
    assert_eq!(
        pg.psql("app", "SELECT string_agg(x::text, ',' ORDER BY x) FROM t"),
        "1,3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_holds_no_more_connections_than_its_concurrency() {
    let pg = TestPostgres::start();
    pg.create_database("app");
    let dir = tempfile::tempdir().expect("tempdir");
    let executor =
        Arc::new(executor(16).with_databases(databases(&[format!("main={}?pool=3&timeout=60", pg.url("app"))])));
    let sleeper = Plugin::new(
        &executor,
        &chaos_plugin(
            dir.path(),
            "sleeper",
            "sql = [\"main\"]",
            "\n[limits]\nconcurrency = 2\n",
        ),
    );
    let other = Plugin::new(&executor, &chaos_plugin(dir.path(), "other", "sql = [\"main\"]", ""));
    let sleeper = Arc::new(sleeper);
    let sleepers: Vec<_> = (0..5)
        .map(|_| {
            let sleeper = sleeper.clone();
            tokio::spawn(async move { sleeper.outcome("main", "SELECT pg_sleep(50)").await })
        })
        .collect();
    let sleeping = || {
        pg.psql(
            "app",
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(50)' AND state = 'active'",
        )
        .parse::<u32>()
        .expect("count")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while sleeping() < 2 {
        assert!(Instant::now() < deadline, "the sleepers never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The other plugin's job gets a connection while the sleepers sleep.
    assert_eq!(other.rows("main", "SELECT 7").await, [json!([7])]);
    let finished = sleepers.iter().filter(|s| s.is_finished()).count();
    assert_eq!(finished, 0, "the other plugin's job waited for a sleeper to finish");
    assert!(sleeping() <= 2, "the sleeper plugin holds more than 2 connections");
    // Wake the sleepers (each is cancelled; the queued ones then start and
    // are cancelled in turn).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sleepers.iter().all(|s| s.is_finished()) {
        assert!(Instant::now() < deadline, "the sleepers never finished");
        pg.psql(
            "app",
            "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(50)'",
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for sleeper in sleepers {
        let message = sleeper.await.expect("join").expect("cancelled, so an error");
        assert!(message.contains("cancel"), "{message}");
    }
}

/// A secret in the victim's statement text, and a `LIKE` pattern that finds
/// it without matching the text of the query that looks for it.
const SECRET: &str = "card 4111-1111";
const SECRET_PATTERN: &str = "'%4111' || '-1111%'";

/// The victim's statement: it carries [`SECRET`] and runs until the test
/// puts a row into `gate` (so it is in flight for as long as the test needs,
/// and finishes when told, without a fixed sleep).
const VICTIM_STATEMENT: &str = "DO $$ BEGIN /* card 4111-1111 */ \
     WHILE NOT EXISTS (SELECT FROM gate) LOOP PERFORM pg_sleep(0.01); END LOOP; END $$";

/// Database `app` with a `gate` table and the plain LOGIN `roles` (not
/// superusers, not members of each other, of `pg_read_all_stats` or of
/// `pg_signal_backend`), each allowed to read `gate`.
fn database_with_roles(pg: &TestPostgres, roles: &[&str]) {
    pg.create_database("app");
    for role in roles {
        pg.psql("postgres", &format!("CREATE ROLE {role} LOGIN"));
    }
    pg.psql(
        "app",
        &format!(
            "CREATE TABLE gate (open boolean); GRANT SELECT ON gate TO {}",
            roles.join(", ")
        ),
    );
}

/// A copy of ChaosJob whose plugin directory is `dir/<name>` (so the
/// plugin is named `name`), with `grants` as its `sql = ...` line.
fn named_chaos(dir: &Path, name: &str, grants: &str) -> PathBuf {
    let copy = chaos_plugin(dir, &format!("{name}.copy"), grants, "");
    let plugin = dir.join(name);
    std::fs::rename(&copy, &plugin).expect("rename the plugin copy");
    plugin
}

/// The two plugins of the role tests: `victim` (read-write on `main`) and
/// `spy` (read-only on `main`, read-write on `own`).
fn victim_and_spy(executor: &Arc<Executor>, dir: &Path) -> (Arc<Plugin>, Plugin) {
    let victim = Arc::new(Plugin::new(executor, &named_chaos(dir, "victim", "sql = [\"main\"]")));
    let spy = Plugin::new(
        executor,
        &named_chaos(dir, "spy", "sql = [{ name = \"main\", mode = \"ro\" }, \"own\"]"),
    );
    (victim, spy)
}

/// Starts the victim's statement in a job of its own and waits (as the
/// superuser) until it is running; returns the job and the running
/// session's `usename application_name`.
async fn start_victim(pg: &TestPostgres, victim: &Arc<Plugin>) -> (tokio::task::JoinHandle<Option<String>>, String) {
    let job = {
        let victim = victim.clone();
        tokio::spawn(async move { victim.outcome("main", VICTIM_STATEMENT).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let session = pg.psql(
            "app",
            &format!(
                "SELECT usename || ' ' || application_name FROM pg_stat_activity \
                 WHERE query LIKE {SECRET_PATTERN} AND state = 'active' AND pid <> pg_backend_pid()"
            ),
        );
        if !session.is_empty() {
            return (job, session);
        }
        assert!(!job.is_finished(), "the victim's job ended before it was seen running");
        assert!(
            Instant::now() < deadline,
            "the victim's statement never showed as running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What docs/capabilities.md warns about: plugins given one database role
/// (two `--db` names on the same user are still one role) can watch and
/// end each other's sessions, even through a read-only grant; and a
/// read-write one can change the role's settings for every plugin's later
/// connections. `application_name` says which plugin runs a statement, and
/// is back to the pool's own once the statement is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_role_lets_a_plugin_watch_and_end_anothers_sessions() {
    let pg = TestPostgres::start();
    database_with_roles(&pg, &["jobs"]);
    let url = pg.url_as("jobs", "app");
    let dir = tempfile::tempdir().expect("tempdir");
    let executor = Arc::new(executor(8).with_databases(databases(&[
        format!("main={url}?pool=4&timeout=60"),
        format!("own={url}?pool=1"),
    ])));
    let (victim, spy) = victim_and_spy(&executor, dir.path());

    let (job, session) = start_victim(&pg, &victim).await;
    assert_eq!(session, "jobs wasmjobs/victim");
    // The spy, read-only, reads the victim's statement as it runs...
    let seen = spy
        .rows(
            "main",
            &format!(
                "SELECT query FROM pg_stat_activity WHERE query LIKE {SECRET_PATTERN} AND pid <> pg_backend_pid()"
            ),
        )
        .await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0][0].as_str().is_some_and(|q| q.contains(SECRET)), "{seen:?}");
    // ...and ends its connection.
    let ended = spy
        .rows(
            "main",
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE query LIKE {SECRET_PATTERN} AND pid <> pg_backend_pid()"
            ),
        )
        .await;
    assert_eq!(ended, [json!([true])]);
    let message = job
        .await
        .expect("join")
        .expect("the victim's statement was ended, so its job failed");
    assert!(message.contains("57P01"), "{message}");

    // Through its read-write grant (another name, the same role) the spy
    // changes the settings every later connection of every plugin starts with.
    spy.rows("own", "ALTER ROLE CURRENT_USER SET search_path = spy, public")
        .await;
    assert_eq!(
        pg.psql(
            "app",
            "SELECT array_to_string(rolconfig, ';') FROM pg_roles WHERE rolname = 'jobs'"
        ),
        "search_path=spy, public"
    );

    // A plugin may call itself another for the length of its own statement;
    // no connection keeps a plugin's name once its statement is done.
    assert_eq!(
        spy.rows(
            "main",
            "SELECT set_config('application_name', 'wasmjobs/victim', false)"
        )
        .await,
        [json!(["wasmjobs/victim"])]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let labelled = pg.psql(
            "app",
            "SELECT string_agg(application_name, ',') FROM pg_stat_activity \
             WHERE usename = 'jobs' AND application_name <> 'wasmjobs'",
        );
        if labelled.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "idle connections still named {labelled}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With a role of its own (`--db main@victim=URL`), the victim's sessions
/// are out of the spy's reach: PostgreSQL shows another role's statement
/// text as `<insufficient privilege>` and refuses to signal its backends,
/// and the spy cannot change the victim's role either. The victim's job
/// runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_plugin_roles_keep_plugins_out_of_each_others_sessions() {
    let pg = TestPostgres::start();
    database_with_roles(&pg, &["jobs", "victim_role"]);
    let url = pg.url_as("jobs", "app");
    let dir = tempfile::tempdir().expect("tempdir");
    let executor = Arc::new(executor(8).with_databases(databases(&[
        format!("main={url}?pool=4&timeout=60"),
        format!("main@victim={}?pool=2&timeout=60", pg.url_as("victim_role", "app")),
        format!("own={url}?pool=1"),
    ])));
    let (victim, spy) = victim_and_spy(&executor, dir.path());

    let (job, session) = start_victim(&pg, &victim).await;
    assert_eq!(session, "victim_role wasmjobs/victim");
    // The spy sees that the victim's session exists, not what it runs.
    let seen = spy
        .rows(
            "main",
            "SELECT usename, query FROM pg_stat_activity WHERE application_name = 'wasmjobs/victim'",
        )
        .await;
    assert!(!seen.is_empty(), "the victim's session is not listed at all");
    for row in &seen {
        assert_eq!(*row, json!(["victim_role", "<insufficient privilege>"]), "{seen:?}");
    }
    assert_eq!(
        spy.rows(
            "main",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE {SECRET_PATTERN} AND pid <> pg_backend_pid()"
            ),
        )
        .await,
        [json!([0])]
    );
    // It can neither cancel nor end the victim's statement...
    for signal in ["pg_cancel_backend", "pg_terminate_backend"] {
        let message = spy
            .fails(
                "main",
                &format!("SELECT {signal}(pid) FROM pg_stat_activity WHERE usename = 'victim_role'"),
            )
            .await;
        assert!(
            message.contains("42501") && message.contains("must be a member of the role"),
            "{signal}: {message}"
        );
    }
    // ...nor change the settings of the victim's role.
    let message = spy
        .fails("own", "ALTER ROLE victim_role SET search_path = spy, public")
        .await;
    assert!(message.contains("42501"), "{message}");

    // The victim's statement was running all along, and finishes when let go.
    assert!(!job.is_finished(), "the victim's job ended early");
    pg.psql("app", "INSERT INTO gate VALUES (true)");
    let outcome = tokio::time::timeout(Duration::from_secs(30), job)
        .await
        .expect("the victim's job finishes once the gate opens")
        .expect("join");
    assert_eq!(outcome, None, "the victim's job failed");
}
