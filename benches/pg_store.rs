//! The PostgreSQL job store (`run --source postgres://…`) against the Redis
//! one, the same cases in one run (issue 37's table):
//!
//! - noop drain: 100,000 `NoopJob` (20,000 with `BENCH_QUICK=1`) at C=100,
//!   PostgreSQL and Redis alternated twice; the runner's own busy rate
//!   (`--summary-json`), and the ratio PostgreSQL ÷ Redis per round;
//! - enqueue: 100,000 `wasmjobs.enqueue` calls, 1,000 per transaction,
//!   one statement each pipelined on one connection (as an application
//!   calls it), and one statement per transaction (the client crate's
//!   `pg::push_bulk`, as `wasmjobs enqueue --source --count` sends them);
//!   the same calls through libpq's pipeline mode (`pgbench`, one `Sync`
//!   per batch where tokio-postgres sends one per statement); and the
//!   tokio-postgres baseline, a statement each: the row inserted without
//!   the function, and a statement that does nothing;
//! - commit → start with an idle runner: 200 jobs, each enqueued and
//!   committed alone 20 ms apart; start time from the job's own clock
//!   (`ChaosJob` `span`, millisecond resolution);
//! - idle: the runner's CPU and the transactions it makes in PostgreSQL per
//!   minute with nothing to do;
//! - soak: 1,000,000 jobs (200,000 quick) enqueued and drained, then the
//!   table's size and dead tuples;
//! - the seed's shape (full run only): 500,000 noop jobs on each store.
//!
//! PostgreSQL is the test server: `fsync=off`, `synchronous_commit=off`,
//! 32 MB shared buffers — a durable server pays a WAL flush per commit;
//! `WASMJOBS_PG_DURABLE=1` runs it with the durable defaults instead.
//!
//! Run: `cargo bench -p wasmjobs-benches --bench pg_store` (`BENCH_QUICK=1`
//! for the reduced set, ~3 minutes on a 2-core machine).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio_postgres::NoTls;
use wasmjobs_benches::{Report, RunnerProcess, cpu_ticks, percentile, push_jobs};
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let jobs: u64 = if quick { 20_000 } else { 100_000 };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let pg = TestPostgres::start();
    pg.create_database("jobs");
    let url = pg.url("jobs");
    let migrate = std::process::Command::new(BIN)
        .args(["migrate", "--source", &url])
        .output()
        .context("wasmjobs migrate")?;
    if !migrate.status.success() {
        bail!("wasmjobs migrate: {}", String::from_utf8_lossy(&migrate.stderr));
    }
    let plugin_dir = wasmjobs_e2e::runner::plugins(&["noop"], &["chaos"]);
    let plugins = plugin_dir.path().to_path_buf();
    let mut report = match wasmjobs_e2e::postgres::durable() {
        true => Report::new(
            "pg_store_durable",
            "PostgreSQL job store (durable) against Redis, one run",
        ),
        false => Report::new("pg_store", "PostgreSQL job store against Redis, one run"),
    };

    // Noop drains, alternated.
    let mut ratios = Vec::new();
    for round in 1..=2 {
        let on_pg = rt.block_on(async {
            enqueue(&url, "NoopJob", jobs, |_| json!([])).await?;
            drain(&redis, &plugins, &["--source", &url], jobs).await
        })?;
        let on_redis = rt.block_on(async {
            let mut conn = redis.conn().await;
            redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
            push_jobs(&mut conn, "NoopJob", jobs, |_| json!([])).await?;
            drain(&redis, &plugins, &[], jobs).await
        })?;
        report.row(
            &format!("noop {jobs}, C=100, round {round}: PostgreSQL / Redis jobs/s"),
            format!("{on_pg:.0} / {on_redis:.0}"),
            "≥ 20,000 on PostgreSQL",
        );
        ratios.push(on_pg / on_redis);
    }
    report.row(
        "noop: PostgreSQL ÷ Redis, per round",
        ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
        "≥ 0.25",
    );

    // Enqueue rate, a statement per call and a statement per transaction.
    let n = 100_000;
    let each = rt.block_on(pipelined(&url, ENQUEUE, n, |i| {
        vec!["ParkedJob".into(), json!([i]).to_string()]
    }))?;
    rt.block_on(sql(&url, "TRUNCATE wasmjobs.jobs"))?;
    // The same calls through libpq's pipeline mode (one Sync per batch).
    let script = tempfile::NamedTempFile::new()?;
    let call = "SELECT wasmjobs.enqueue('ParkedJob', jsonb_build_array(:i::bigint));\n";
    let body = format!(
        "\\set i random(1, 1000000000)\nBEGIN;\n\\startpipeline\n{}\\endpipeline\nCOMMIT;\n",
        call.repeat(1_000)
    );
    std::fs::write(script.path(), body)?;
    let libpq = pg.pgbench("jobs", script.path(), n / 1_000) * 1_000.0;
    rt.block_on(sql(&url, "TRUNCATE wasmjobs.jobs"))?;
    // The same client's floor: the row alone (its payload built here, no
    // function, no NOTIFY), and a statement that does nothing.
    let insert = rt.block_on(pipelined(&url, INSERT, n, |i| {
        let payload = json!({"class": "ParkedJob", "args": [i], "queue": "default",
            "jid": format!("{i:024x}"), "retry": true,
            "created_at": 1.7e9, "enqueued_at": 1.7e9});
        vec![payload.to_string()]
    }))?;
    rt.block_on(sql(&url, "TRUNCATE wasmjobs.jobs"))?;
    let nothing = rt.block_on(pipelined(&url, "SELECT $1::text", n, |i| vec![i.to_string()]))?;
    let started = Instant::now();
    rt.block_on(enqueue(&url, "ParkedJob", n, |i| json!([i])))?;
    let bulk = n as f64 / started.elapsed().as_secs_f64();
    rt.block_on(sql(&url, "TRUNCATE wasmjobs.jobs"))?;
    report.row(
        "enqueue: 100,000 wasmjobs.enqueue calls, 1,000 per transaction, a statement each, pipelined (jobs/s)",
        format!("{each:.0}"),
        "≥ 30,000",
    );
    report.row(
        "enqueue: the same calls, a statement each, libpq's pipeline mode (pgbench -M prepared) (jobs/s)",
        format!("{libpq:.0}"),
        "≥ 30,000",
    );
    report.row(
        "tokio-postgres as above, baseline: a plain INSERT of the same row / `SELECT $1` per statement (statements/s)",
        format!("{insert:.0} / {nothing:.0}"),
        "(the ceiling of a statement each)",
    );
    report.row(
        "enqueue: the same calls, one statement per transaction (pg::push_bulk) (jobs/s)",
        format!("{bulk:.0}"),
        "≥ 30,000",
    );

    // Commit → start, and idle cost, with one idle runner.
    let (latencies, idle_cpu, idle_tx) = rt.block_on(idle_runner(&redis, &url, &plugins, quick))?;
    report.row(
        "commit → start, idle runner: p50 / p99 (ms)",
        format!(
            "{:.0} / {:.0}",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99)
        ),
        "≤ 5 / ≤ 20",
    );
    report.row(
        "idle runner: CPU (% of a core) / PostgreSQL transactions per minute",
        format!("{idle_cpu:.2} / {idle_tx:.0}"),
        "≤ 0.5% / no polling storm",
    );

    // Soak.
    let soak: u64 = if quick { 200_000 } else { 1_000_000 };
    let (soak_rate, size, dead) = rt.block_on(async {
        enqueue(&url, "NoopJob", soak, |_| json!([])).await?;
        let rate = drain(&redis, &plugins, &["--source", &url], soak).await?;
        let (size, dead) = table_health(&url).await?;
        anyhow::Ok((rate, size, dead))
    })?;
    report.row(
        &format!("soak: {soak} jobs drained (jobs/s); then wasmjobs.jobs size (MB) / dead tuples"),
        format!("{soak_rate:.0}; {:.1} / {dead}", size as f64 / 1e6),
        "bounded",
    );

    if !quick {
        let seed = 500_000;
        let (on_pg, on_redis) = rt.block_on(async {
            enqueue(&url, "NoopJob", seed, |_| json!([])).await?;
            let pg_rate = drain(&redis, &plugins, &["--source", &url], seed).await?;
            let mut conn = redis.conn().await;
            redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
            push_jobs(&mut conn, "NoopJob", seed, |_| json!([])).await?;
            let redis_rate = drain(&redis, &plugins, &[], seed).await?;
            anyhow::Ok((pg_rate, redis_rate))
        })?;
        report.row(
            "the seed's shape: 500,000 noop jobs, PostgreSQL / Redis (s)",
            format!("{:.1} / {:.1}", seed as f64 / on_pg, seed as f64 / on_redis),
            "(seed: Solid Queue 15× Sidekiq)",
        );
    }
    report.note(
        "Rates are the runner's busy rate (first job taken to last outcome written, --summary-json), \
         the same measure on both stores."
            .into(),
    );
    report.note(if wasmjobs_e2e::postgres::durable() {
        "PostgreSQL is durable (WASMJOBS_PG_DURABLE=1): fsync, synchronous_commit and full_page_writes on, 32 MB shared buffers.".into()
    } else {
        "PostgreSQL runs as the tests run it: fsync=off, synchronous_commit=off, 32 MB shared buffers.".into()
    });
    report.finish()?;
    Ok(())
}

/// A job through the SQL function, as an application calls it.
const ENQUEUE: &str = "SELECT wasmjobs.enqueue($1, $2::text::jsonb)";
/// The row `wasmjobs.enqueue` inserts, without the function.
const INSERT: &str = "INSERT INTO wasmjobs.jobs (queue, payload, run_at) VALUES ('default', $1::text::jsonb, now())";

/// Runs `statement` `n` times, 1,000 per transaction, a statement each,
/// pipelined on one connection (tokio-postgres ends each with a `Sync`);
/// returns statements per second.
async fn pipelined(url: &str, statement: &str, n: u64, params: impl Fn(u64) -> Vec<String>) -> Result<f64> {
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let batch = 1_000.min(n - done);
        let tx = client.transaction().await?;
        let statement = tx.prepare(statement).await?;
        let params: Vec<Vec<String>> = (done..done + batch).map(&params).collect();
        let calls = params.iter().map(|p| {
            let (tx, statement) = (&tx, &statement);
            let p: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = p
                .iter()
                .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            async move { tx.execute(statement, &p).await }
        });
        futures_util::future::try_join_all(calls).await?;
        tx.commit().await?;
        done += batch;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Enqueues `n` jobs with the client crate's `pg::push_bulk`, 1,000 per
/// transaction in one statement.
async fn enqueue(url: &str, class: &str, n: u64, args: impl Fn(u64) -> Value) -> Result<()> {
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let mut done = 0;
    while done < n {
        let batch = 1_000.min(n - done);
        let jobs: Vec<wasmjobs_client::Job> = (done..done + batch)
            .map(|i| wasmjobs_client::Job::new(class).args(args(i)))
            .collect();
        let tx = client.transaction().await?;
        wasmjobs_client::pg::push_bulk(&tx, &jobs).await?;
        tx.commit().await?;
        done += batch;
    }
    Ok(())
}

async fn sql(url: &str, statement: &str) -> Result<()> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    client.batch_execute(statement).await?;
    Ok(())
}

/// Runs the runner until the queue is empty; returns its busy rate.
async fn drain(redis: &TestRedis, plugins: &Path, extra: &[&str], jobs: u64) -> Result<f64> {
    let summary = tempfile::NamedTempFile::new()?;
    let summary_path = summary.path().to_string_lossy().into_owned();
    let mut flags = vec![
        "--concurrency",
        "100",
        "--exit-when-empty",
        "--summary-json",
        &summary_path,
    ];
    flags.extend_from_slice(extra);
    let mut runner = RunnerProcess::start(BIN.as_ref(), &redis.url(), plugins, &flags, "warn")?;
    runner.wait_exit(Duration::from_secs(1200))?;
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(summary.path())?)?;
    let processed = summary["processed"].as_u64().unwrap_or(0);
    if processed != jobs {
        bail!("the drain processed {processed} of {jobs} jobs:\n{}", runner.log());
    }
    summary["busy_jobs_per_sec"]
        .as_f64()
        .context("no busy_jobs_per_sec in the summary")
}

/// Commit → start latencies (ms), then the idle runner's CPU (% of a core)
/// and its PostgreSQL transactions per minute.
async fn idle_runner(redis: &TestRedis, url: &str, plugins: &Path, quick: bool) -> Result<(Vec<f64>, f64, f64)> {
    let spans = plugins.join("chaos/data/spans.txt");
    let _ = std::fs::remove_file(&spans);
    let mut runner = RunnerProcess::start(
        BIN.as_ref(),
        &redis.url(),
        plugins,
        &["--source", url],
        "warn,wasmjobs::runner::launcher=info",
    )?;
    runner.wait_for_log(" running")?;
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let mut committed = Vec::new();
    for i in 0..200 {
        let key = format!("k{i}");
        let tx = client.transaction().await?;
        tx.query_one(
            "SELECT wasmjobs.enqueue('ChaosJob', jsonb_build_array('span', 'spans.txt', $1::text, 0))",
            &[&key],
        )
        .await?;
        tx.commit().await?;
        committed.push((key, now_ms()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut latencies = loop {
        let text = std::fs::read_to_string(&spans).unwrap_or_default();
        let starts: std::collections::HashMap<&str, f64> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split(' ');
                (words.next()? == "start").then_some(())?;
                let key = words.next()?;
                let at = words.nth(1)?.parse().ok()?;
                Some((key, at))
            })
            .collect();
        if starts.len() >= committed.len() {
            break committed
                .iter()
                .filter_map(|(key, at)| Some((starts.get(key.as_str())? - at).max(0.0)))
                .collect::<Vec<f64>>();
        }
        if Instant::now() > deadline {
            bail!(
                "{} of {} jobs started:\n{}",
                starts.len(),
                committed.len(),
                runner.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    latencies.sort_by(f64::total_cmp);

    // Idle: nothing to do for a while. A backend reports its transaction
    // counts lazily (within ~10 s of going idle), so the busy part above is
    // left to settle first, and the window is long against that lag.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let window = Duration::from_secs(if quick { 30 } else { 60 });
    let tx_before = transactions(&client).await?;
    let ticks_before = cpu_ticks(runner.pid());
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let ticks = cpu_ticks(runner.pid()) - ticks_before;
    let elapsed = started.elapsed().as_secs_f64();
    // Our own two reads are transactions too.
    let tx = transactions(&client).await?.saturating_sub(tx_before + 1);
    let cpu = ticks as f64 / 100.0 / elapsed * 100.0;
    runner.stop()?;
    Ok((latencies, cpu, tx as f64 / elapsed * 60.0))
}

async fn transactions(client: &tokio_postgres::Client) -> Result<u64> {
    let row = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

/// `wasmjobs.jobs`' total size (bytes) and dead tuples.
async fn table_health(url: &str) -> Result<(i64, i64)> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT pg_total_relation_size('wasmjobs.jobs'), n_dead_tup FROM pg_stat_user_tables WHERE relid = 'wasmjobs.jobs'::regclass",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}
