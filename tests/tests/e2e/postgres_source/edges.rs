//! The PostgreSQL store at its edges, as an attacker or a careless
//! producer would push it: payloads over `--max-payload` are buried in
//! SQL without ever reaching the runner.

use std::time::Duration;

use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, plugins};

use super::{connect, count, eventually, source_flags, store};

/// Enqueues one `class` job `["ok"]` in the store and waits until no job
/// is left in it (`what` names the wait).
async fn run_one(store: &tokio_postgres::Client, runner: &mut Runner, class: &str, what: &str) {
    store
        .query_one("SELECT wasmjobs.enqueue($1, '[\"ok\"]')", &[&class])
        .await
        .expect("enqueue");
    eventually(what, Duration::from_secs(60), &mut [runner], || async move {
        count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0
    })
    .await;
}

/// A process's peak resident memory since the last [`reset_peak`], in
/// bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

/// Starts `pid`'s peak memory afresh (`clear_refs` 5 resets `VmHWM`).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM through /proc/PID/clear_refs");
}

/// Eight jobs of 25 MB, committed together so one claim sees them all,
/// with `--max-payload` at 1 MB: each is dead with the reason Redis gives
/// (`PayloadTooLarge`, its size), whole, and the runner's peak memory grew
/// by far less than one of them — they never left PostgreSQL. The normal
/// jobs around them run. (Before, the claim returned every payload and
/// the size was compared after: the runner held all eight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_max_payload_are_buried_in_sql_unread() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let flags = source_flags(&url, &["--max-payload", "1000000", "-c", "20"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
    runner.wait_running();
    let store = connect(&url).await;
    run_one(&store, &mut runner, "ChaosJob", "the first job to run").await;

    let pid = runner.pid();
    reset_peak(pid);
    let before = peak_rss(pid);
    const BIG: i64 = 25_000_000;
    store
        .batch_execute(&format!(
            "BEGIN;
             SELECT wasmjobs.enqueue('ChaosJob', jsonb_build_array('ok', repeat(chr(97 + n % 26), {BIG}))) FROM generate_series(1, 8) AS n;
             SELECT wasmjobs.enqueue('ChaosJob', '[\"ok\"]') FROM generate_series(1, 3);
             COMMIT;"
        ))
        .await
        .expect("enqueue the large jobs");
    eventually(
        "every job to leave the queue",
        Duration::from_secs(120),
        &mut [&mut runner],
        || {
            let store = &store;
            async move { count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0 }
        },
    )
    .await;
    let grew = peak_rss(pid).saturating_sub(before);

    let rows = store
        .query(
            "SELECT payload->>'error_class', payload->>'error_message', (payload->>'payload_bytes')::bigint,
                    octet_length(payload->'args'->>1), payload->>'class'
             FROM wasmjobs.dead ORDER BY id",
            &[],
        )
        .await
        .expect("dead rows");
    assert_eq!(rows.len(), 8, "the eight large jobs are dead, the small ones ran");
    for row in &rows {
        let (class, message): (String, String) = (row.get(0), row.get(1));
        assert_eq!(class, "wasmjobs::PayloadTooLarge");
        assert!(
            message.contains("larger than the 1000000 a job may have (wasmjobs run --max-payload)"),
            "{message}"
        );
        let (bytes, kept): (i64, i32) = (row.get(2), row.get(3));
        assert!(bytes > BIG, "payload_bytes {bytes}");
        assert_eq!(i64::from(kept), BIG, "kept whole");
        assert_eq!(row.get::<_, String>(4), "ChaosJob");
    }
    assert!(
        grew < 50_000_000,
        "the runner's peak memory grew by {grew} bytes while 8 payloads of {BIG} bytes were buried: it read them"
    );
    let log = runner.log();
    assert!(log.contains("sent to the dead set unrun"), "{log}");
    assert!(runner.stop().success(), "{}", runner.log());
}

/// A copy of the chaos guest at `plugins/<name>` serving `class`, granted
/// the environment variable `var`.
fn env_plugin(plugins: &std::path::Path, name: &str, class: &str, var: &str) {
    let dir = plugins.join(name);
    std::fs::create_dir_all(&dir).expect("plugin dir");
    std::fs::copy(
        wasmjobs_e2e::test_guests_dir().join("chaos/chaos_job.wasm"),
        dir.join("chaos_job.wasm"),
    )
    .expect("copy component");
    std::fs::write(
        dir.join("wasmjobs.toml"),
        format!("component = \"chaos_job.wasm\"\nclasses = [{class:?}]\nenv = [{var:?}]\n"),
    )
    .expect("write manifest");
}

/// No plugin may be granted a variable that holds the job store's URL
/// (`--source`, never protected before), a `--db` URL as the operator
/// typed it (only its normalised form was), or either's password alone:
/// each such plugin is refused at load, naming the variable; a harmless
/// variable is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_and_database_urls_and_their_passwords_are_kept_from_plugins() {
    let (pg, _) = store();
    pg.create_database("app");
    // Trust authentication: the passwords are parsed, never checked.
    let source = pg.url_as("wasmjobs:St0re-pass-99", super::DB);
    let db = format!("{}?pool=5&sslmode=disable", pg.url_as("wasmjobs:Zq-secret-77", "app"));
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().expect("plugins dir");
    let grants = [
        ("db-url", "DbUrlJob", "PG_DSN"),
        ("store-url", "StoreUrlJob", "JOBS_DSN"),
        ("db-pass", "DbPassJob", "PG_PASS"),
        ("store-pass", "StorePassJob", "STORE_PASS"),
        ("respelled", "RespelledJob", "OTHER_DSN"),
        ("harmless", "HarmlessJob", "GREETING"),
    ];
    for (name, class, var) in grants {
        env_plugin(dir.path(), name, class, var);
    }
    let respelled = format!("postgresql://wasmjobs:St0re-pass-99@localhost:{}/jobs", pg.port());
    let env = [
        ("PG_DSN", db.as_str()),
        ("JOBS_DSN", source.as_str()),
        ("PG_PASS", "Zq-secret-77"),
        ("STORE_PASS", "St0re-pass-99"),
        ("OTHER_DSN", respelled.as_str()),
        ("GREETING", "hello"),
    ];
    let main = format!("main={db}");
    let flags = source_flags(&source, &["--db", &main]);
    let mut runner = Runner::start_with_env(&env, &redis.url(), dir.path(), &flags);
    runner.wait_running();
    let log = runner.log();
    for (name, _, var) in &grants[..5] {
        assert!(
            log.lines()
                .any(|line| line.contains("plugin refused") && line.contains(&format!("env grants {var}"))),
            "plugin {name}, granted {var}, was not refused:\n{log}"
        );
    }
    assert!(!log.contains("env grants GREETING"), "{log}");
    for secret in ["St0re-pass-99", "Zq-secret-77"] {
        assert!(!log.contains(secret), "the log shows a password:\n{log}");
    }
    let store = connect(&source).await;
    run_one(&store, &mut runner, "HarmlessJob", "the harmless plugin's job to run").await;
    assert!(runner.stop().success(), "{}", runner.log());
}

/// A process's CPU time so far (user + system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name (which may hold spaces), from field 3.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).expect("stat fields");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// Any role that can connect may `NOTIFY` the runners' channel, and each
/// notification naming the runner's queue woke an idle runner for a claim
/// (67,000 cost 3.2 CPU-s). Here 3,000 notifications, 2 ms apart (so each
/// finds the runner idle), each in its own transaction: wake-ups are now
/// paced (at most one per 10 ms, none lost), so the runner claims a few
/// hundred times, not once per notification (the server logs each claim
/// statement), and a job enqueued right after still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_notifications_does_not_keep_an_idle_runner_busy() {
    let (pg, url) = store();
    pg.psql(
        super::DB,
        &format!("ALTER DATABASE {} SET log_statement = 'all'", super::DB),
    );
    let redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &[]));
    runner.wait_running();
    let claims = || pg.log().matches("WITH picked AS").count();
    let claimed = claims();
    let pid = runner.pid();
    let before = cpu_seconds(pid);
    pg.psql(
        super::DB,
        "DO $$ BEGIN FOR i IN 1..3000 LOOP PERFORM pg_notify('wasmjobs_jobs', 'default'); COMMIT; PERFORM pg_sleep(0.002); END LOOP; END $$",
    );
    let store = connect(&url).await;
    run_one(&store, &mut runner, "ChaosJob", "the job after the flood to run").await;
    let spent = cpu_seconds(pid) - before;
    let claimed = claims() - claimed;
    eprintln!("3,000 notifications: the idle runner claimed {claimed} times, spending {spent:.3} CPU-s");
    assert!(
        claimed < 1_200,
        "3,000 notifications woke the idle runner for {claimed} claims ({spent:.3} CPU-s)\n{}",
        runner.log()
    );
    assert!(runner.stop().success(), "{}", runner.log());
}

/// The database's own message for `err`.
fn db_message(err: &tokio_postgres::Error) -> String {
    err.as_db_error()
        .map_or_else(|| err.to_string(), |db| db.message().to_owned())
}

/// A job due at `-infinity` broke `stats` and the pages ("cannot subtract
/// infinite timestamps"), one at `infinity` never ran: both are refused,
/// by `wasmjobs.enqueue` with the reason and by the table for any other
/// writer; `stats` keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_that_is_not_finite_is_refused() {
    let (_pg, url) = store();
    let store = connect(&url).await;
    for at in ["-infinity", "infinity"] {
        let err = store
            .query_one(&format!("SELECT wasmjobs.enqueue('ChaosJob', run_at => '{at}')"), &[])
            .await
            .expect_err("a run_at that is not finite");
        assert!(db_message(&err).contains("run_at must be a finite time"), "{err:?}");
        let err = store
            .execute(
                &format!("INSERT INTO wasmjobs.jobs (queue, payload, run_at) VALUES ('default', '{{}}', '{at}')"),
                &[],
            )
            .await
            .expect_err("a direct insert");
        assert!(db_message(&err).contains("jobs_run_at_finite"), "{err:?}");
    }
    store
        .query_one(
            "SELECT wasmjobs.enqueue('ChaosJob', run_at => now() + interval '1 hour')",
            &[],
        )
        .await
        .expect("a finite time is fine");
    let redis = TestRedis::start();
    let stats = wasmjobs_e2e::cli::wasmjobs_in(
        std::path::Path::new("."),
        &["stats", "--redis", &redis.url(), "--source", &url],
        &[] as &[(&str, &str)],
        Duration::from_secs(60),
    );
    wasmjobs_e2e::assert_success(&stats, "wasmjobs stats --source");
}

/// A job of a class no plugin serves waits for a retry in the store as
/// "no plugin"; when a reload brings its plugin, it runs at once, as on
/// the Redis store (the release scanned only Redis's `retry` set: on
/// PostgreSQL it waited out its backoff, 15 s or more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_waiting_for_a_plugin_run_once_a_reload_brings_it() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &[]));
    runner.wait_running();
    let store = connect(&url).await;
    store
        .query_one(
            "SELECT count(wasmjobs.enqueue('ChaosJob', '[\"ok\"]')) FROM generate_series(1, 5)",
            &[],
        )
        .await
        .expect("enqueue");
    let waiting = "SELECT count(*) FROM wasmjobs.jobs WHERE owner IS NULL AND run_at > now() \
                   AND payload->>'error_class' = 'wasmjobs::NoPlugin'";
    eventually(
        "the jobs to wait for a plugin",
        Duration::from_secs(60),
        &mut [&mut runner],
        || {
            let store = &store;
            async move { count(store, waiting).await == 5 }
        },
    )
    .await;
    wasmjobs_e2e::deploy_plugin(&wasmjobs_e2e::test_guests_dir().join("chaos"), dir.path());
    runner.wait_for_log("plugin added", Duration::from_secs(60));
    let added = std::time::Instant::now();
    eventually(
        "the released jobs to run",
        Duration::from_secs(60),
        &mut [&mut runner],
        || {
            let store = &store;
            async move { count(store, "SELECT count(*) FROM wasmjobs.jobs").await == 0 }
        },
    )
    .await;
    assert!(
        added.elapsed() < Duration::from_secs(10),
        "they waited {:?}: their retry time, not the release",
        added.elapsed()
    );
    runner.wait_for_log("enqueued jobs that were waiting for a plugin", Duration::from_secs(5));
    assert!(runner.stop().success(), "{}", runner.log());
}

/// Jobs left in the store.
async fn left(store: &tokio_postgres::Client) -> i64 {
    count(store, "SELECT count(*) FROM wasmjobs.jobs").await
}

/// Jobs per second taken from the store over each of `windows` 2 s
/// windows, the runner alive throughout.
async fn store_rates(store: &tokio_postgres::Client, runner: &mut Runner, windows: usize) -> Vec<f64> {
    let mut rates = Vec::new();
    let mut before = left(store).await;
    for _ in 0..windows {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            if let Some(status) = runner.try_status() {
                panic!("the runner exited ({status}):\n{}", runner.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = left(store).await;
        assert!(now > 0, "the store ran dry: enqueue more jobs");
        rates.push((before - now) as f64 / started.elapsed().as_secs_f64());
        before = now;
    }
    rates
}

/// The jobs live in PostgreSQL; Redis is only the control plane
/// (counters, cancels, the process list). With that Redis stopped, then
/// frozen (`SIGSTOP`), the store's jobs keep **≥ 0.8×** their rate: no job
/// start waits for its cancel look-up (at most 250 ms, then none for 5 s)
/// and no outcome batch for its counters (at most 500 ms, then none for
/// 5 s). On ff5d42a every start waited up to 5 s for Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_control_plane_redis_costs_the_stores_jobs_no_rate() {
    let (_pg, url) = store();
    let mut redis = TestRedis::start();
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &["-c", "20"]));
    runner.wait_running();
    let store = connect(&url).await;
    store
        .query_one(
            "SELECT count(wasmjobs.enqueue('ChaosJob', '[\"sleep\", 20]')) FROM generate_series(1, 30000)",
            &[],
        )
        .await
        .expect("enqueue");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = store_rates(&store, &mut runner, 2).await;
    redis.stop();
    let refused = store_rates(&store, &mut runner, 2).await;
    redis.start_again();
    redis.freeze();
    let hung = store_rates(&store, &mut runner, 2).await;
    redis.thaw();
    let baseline = before.iter().sum::<f64>() / before.len() as f64;
    eprintln!(
        "jobs/s from the store by 2 s window: before {before:.0?}, Redis stopped {refused:.0?}, Redis frozen {hung:.0?}"
    );
    for (case, windows) in [("stopped", &refused), ("frozen", &hung)] {
        for (i, rate) in windows.iter().enumerate() {
            assert!(
                *rate >= 0.8 * baseline,
                "with Redis {case}, window {i} ran {rate:.0} jobs/s, under 0.8x the {baseline:.0} before\n{}",
                runner.log()
            );
        }
    }
    assert!(runner.stop().success(), "{}", runner.log());
}

/// On the PostgreSQL store the overview, `/queues`, a queue's page and
/// `/api/overview` answered 500 while the control-plane Redis was down or
/// hanging, though the jobs they list are in PostgreSQL: they now show
/// the store's jobs with a notice saying what is missing and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_show_the_stores_jobs_while_the_control_plane_redis_is_down() {
    use wasmjobs_e2e::dashboard::{connectable, request, wait_listening};

    let (_pg, url) = store();
    let mut redis = TestRedis::start();
    let dir = plugins(&["noop"], &[]);
    // `-q elsewhere`: the store's `default` jobs stay where they are.
    let flags = source_flags(&url, &["-q", "elsewhere", "--web", "127.0.0.1:0"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
    runner.wait_running();
    let web = connectable(&wait_listening(|| runner.log(), || None));
    let store = connect(&url).await;
    store
        .query_one(
            "SELECT count(wasmjobs.enqueue('NoopJob', '[]')) FROM generate_series(1, 7)",
            &[],
        )
        .await
        .expect("enqueue");
    let pages = |web: String, down: bool| async move {
        tokio::task::spawn_blocking(move || {
            for path in ["/", "/queues", "/queues/default", "/api/overview"] {
                let response = request(&web, "GET", path, &[], "");
                assert_eq!(response.status, 200, "{path}: {}", response.body);
                let says_so = response.body.contains("control-plane Redis cannot be read")
                    || response.body.contains("\"control_down\"");
                assert_eq!(says_so, down, "{path} (Redis down: {down}): {}", response.body);
                let seven = match path {
                    "/api/overview" => response.body.contains("\"enqueued\":7"),
                    "/queues/default" => response.body.matches("NoopJob").count() >= 7,
                    _ => response.body.contains("data-queue=\"default\"") && response.body.contains("<td>7</td>"),
                };
                assert!(seven, "{path} shows the store's 7 jobs: {}", response.body);
            }
        })
        .await
        .expect("the page requests");
    };
    pages(web.clone(), false).await;
    redis.stop();
    pages(web.clone(), true).await;
    redis.start_again();
    redis.freeze();
    pages(web.clone(), true).await;
    redis.thaw();
    // The connection comes back by itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let api = web.clone();
    while tokio::task::spawn_blocking({
        let api = api.clone();
        move || {
            request(&api, "GET", "/api/overview", &[], "")
                .body
                .contains("control_down")
        }
    })
    .await
    .expect("the request")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "Redis never came back: {}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pages(web.clone(), false).await;
    assert!(runner.stop().success(), "{}", runner.log());
}

/// With every runner on the PostgreSQL store, a plain `wasmjobs enqueue`
/// and Sidekiq's `Client.push` went into Redis, where nothing reads, with
/// nothing said anywhere. Now the runners' heartbeats say which store
/// they read, `enqueue` refuses (naming the store and `--source`),
/// `stats` and the dashboard flag the jobs left in Redis, and a runner
/// starting on the store warns of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_pushed_into_redis_that_no_runner_reads_are_refused_or_flagged() {
    use redis::AsyncCommands;
    use wasmjobs_e2e::cli::wasmjobs_in;
    use wasmjobs_e2e::dashboard::{connectable, request, wait_listening};

    let (_pg, url) = store();
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    // Trust authentication ignores the password; no heartbeat may show it.
    let url = url.replacen("@127.0.0.1", ":secret@127.0.0.1", 1);
    let flags = source_flags(&url, &["--web", "127.0.0.1:0"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
    runner.wait_running();
    let web = connectable(&wait_listening(|| runner.log(), || None));
    let here = std::path::Path::new(".");
    let no_env: &[(&str, &str)] = &[];
    let timeout = Duration::from_secs(60);

    // The heartbeat says where the runner reads, without the password.
    let identity = wasmjobs_e2e::runner::identity_of(&mut conn, runner.pid(), || runner.log()).await;
    let info: String = conn.hget(&identity, "info").await.expect("HGET info");
    let info: serde_json::Value = serde_json::from_str(&info).expect("info is JSON");
    let said = info["store"].as_str().expect("the store in the heartbeat");
    assert!(said.starts_with("postgres://") && !said.contains("secret"), "{said}");

    let refused = wasmjobs_in(here, &["enqueue", "--redis", &redis.url(), "NoopJob"], no_env, timeout);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "enqueue into Redis was accepted: {stderr}");
    assert!(
        stderr.contains(said) && stderr.contains("--source") && stderr.contains("--to-redis"),
        "{stderr}"
    );
    let waiting: u64 = conn.llen("queue:default").await.expect("LLEN");
    assert_eq!(waiting, 0, "the refused job was not pushed");

    // Sidekiq's Ruby client cannot be refused: the jobs are flagged.
    wasmjobs_e2e::sidekiq::ruby(
        &redis.url(),
        r#"2.times { Sidekiq::Client.push("class" => "NoopJob", "queue" => "default", "args" => []) }"#,
    );
    let forced = wasmjobs_in(
        here,
        &["enqueue", "--redis", &redis.url(), "--to-redis", "NoopJob"],
        no_env,
        timeout,
    );
    wasmjobs_e2e::assert_success(&forced, "enqueue --to-redis");
    let stats = wasmjobs_in(here, &["stats", "--redis", &redis.url(), "--json"], no_env, timeout);
    wasmjobs_e2e::assert_success(&stats, "stats --json");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["stranded"][0]["queue"], "default", "{stats}");
    assert_eq!(stats["stranded"][0]["size"], 3, "{stats}");
    assert_eq!(stats["stranded"][0]["read_from"][0], said, "{stats}");
    let text = wasmjobs_in(here, &["stats", "--redis", &redis.url()], no_env, timeout);
    assert!(
        String::from_utf8_lossy(&text.stdout)
            .contains("WARNING queue default holds 3 jobs in Redis that no runner reads"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    let page = tokio::task::spawn_blocking(move || request(&web, "GET", "/", &[], ""))
        .await
        .expect("the request");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("id=\"stranded\"") && page.body.contains("class=\"stranded\" data-queue=\"default\""),
        "{}",
        page.body
    );

    // A runner starting on the store says so in its log.
    let mut second = Runner::start(&redis.url(), dir.path(), &source_flags(&url, &[]));
    second.wait_for_log("queue default holds 3 jobs in Redis", Duration::from_secs(60));
    assert!(second.stop().success(), "{}", second.log());
    assert!(runner.stop().success(), "{}", runner.log());
}
