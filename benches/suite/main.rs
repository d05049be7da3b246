//! `wasmjobs-bench`: the benchmark suite, one command that reproduces every
//! workload of the seed report through the real path and writes
//! `benches/results/<date>-<host>.md`, the JSON beside it and SVG charts.
//! Normally started by `scripts/bench.sh`, which builds what it needs.
//!
//! ```text
//! wasmjobs-bench --wasmjobs target/release/wasmjobs [--native PATH] [--quick] [--only noop,http] [--out DIR]
//! wasmjobs-bench compare --a OLD --b NEW [--names A B] [--rounds N] [--only noop,noop-spaced,noop-c10,http,http-c10k] [--jobs N]
//! ```
//!
//! `compare` ([`ab`]) alternates the drains of two `wasmjobs` binaries on
//! the same servers and prints B ÷ A; `scripts/bench-compare.sh` builds
//! the two from git revisions.
//!
//! It starts its own `redis-server`, PostgreSQL (for `pg-sleep`) and two
//! 200 ms HTTP servers on loopback, one HTTP/1.1 and one HTTP/2-only (both
//! on their own runtime, so their CPU can be counted); see [`plan`] for the
//! cases, [`measure`] for how one is timed and checked, and [`output`] for
//! the report. Noop and HTTP cases also run through the native baseline,
//! `wasmjobs-native` (built beside this binary), and the report divides
//! wasmjobs by it. Exits non-zero when any job was lost or failed.

mod ab;
mod chart;
mod compare;
mod measure;
mod memory;
mod output;
mod plan;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wasmjobs_benches::{command, cores, cpu_model, date, hostname, percentile};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;

use measure::{Bench, Row};
use output::{Machine, Native, Results};
use plan::Workload;

const USAGE: &str = "usage: wasmjobs-bench --wasmjobs PATH [--native PATH] [--quick] [--only noop,http,http2,http-held,http2-held,http-async,http2-async,http-async-held,http2-async-held,pg-sleep,file-append,fib,idle] [--out DIR]";

/// Concurrent streams the HTTP/2 server allows per connection: more than
/// the largest concurrency, so all of a case's requests may share one
/// connection and the server's limit is never what is measured (hyper's
/// default is 200, and the clients open no second connection when a
/// connection's streams are used up).
const H2_MAX_STREAMS: u32 = 100_000;

struct Args {
    wasmjobs: PathBuf,
    native: PathBuf,
    quick: bool,
    only: Vec<Workload>,
    out: PathBuf,
}

fn parse_args() -> Result<Args> {
    let repo = wasmjobs_e2e::guests::repo_root();
    let beside = std::env::current_exe().context("locating this binary")?;
    let mut args = Args {
        wasmjobs: repo.join("target/release/wasmjobs"),
        native: beside.with_file_name("wasmjobs-native"),
        quick: false,
        only: Vec::new(),
        out: repo.join("benches/results"),
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        let mut value = || argv.next().with_context(|| format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--wasmjobs" => args.wasmjobs = value()?.into(),
            "--native" => args.native = value()?.into(),
            "--quick" => args.quick = true,
            "--only" => args.only = plan::parse_only(&value()?)?,
            "--out" => args.out = value()?.into(),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if !args.wasmjobs.is_file() {
        bail!(
            "{} is not built (cargo build --release -p wasmjobs)",
            args.wasmjobs.display()
        );
    }
    if !args.native.is_file() {
        bail!(
            "{} is not built (cargo build --release -p wasmjobs-benches --bin wasmjobs-native)",
            args.native.display()
        );
    }
    Ok(args)
}

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("compare") {
        return ab::main();
    }
    let args = parse_args()?;
    wasmjobs::runner::os_limits::raise_open_files(20_000);
    let cases = plan::cases(args.quick, &args.only);
    let native = args
        .only
        .iter()
        .chain(if args.only.is_empty() { &Workload::ALL[..] } else { &[] })
        .any(|w| *w == Workload::Fib)
        .then(native_fib);

    let rt = tokio::runtime::Runtime::new()?;
    let http_rt = http_runtime()?;
    let mut bench = start_bench(&rt, &http_rt, args.wasmjobs.clone(), args.native.clone());
    let started = Instant::now();
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        eprint!(
            "[{:>2}/{}] {:<8} {:<11} {:<8} C={:<6} N={:<9} ",
            i + 1,
            cases.len(),
            case.processor.name(),
            case.workload.name(),
            case.fetch.flag(),
            case.concurrency,
            output::group(case.jobs)
        );
        let row = rt.block_on(bench.run(case)).unwrap_or_else(|err| Row {
            problems: vec![format!("the case did not run: {err:#}")],
            ..measure::empty_row(case)
        });
        eprintln!(
            "{:>8.2} s {:>9.0} jobs/s  peak {:>7.1} MB  {:>6.2}% CPU {:>7.1} µs/job  {}",
            row.time_s,
            row.jobs_per_sec,
            row.peak_rss_kb as f64 / 1024.0,
            row.cpu_percent,
            row.cpu_per_job.map_or(0.0, |cpu| cpu.runner),
            if row.problems.is_empty() {
                "ok".to_owned()
            } else {
                row.problems.join("; ")
            }
        );
        rows.push(row);
    }
    drop(bench);
    drop(http_rt);

    let machine = machine(&args);
    let stem = format!(
        "{}-{}{}",
        machine.date.get(..10).unwrap_or("undated"),
        machine.host,
        if args.quick { "-quick" } else { "" }
    );
    let comparisons = compare::comparisons(&rows);
    let results = Results {
        targets: output::targets(&rows, &comparisons, native),
        comparisons,
        machine,
        quick: args.quick,
        native,
        rows,
    };
    let path = results.write(&args.out, &stem)?;
    println!("{}", results.markdown(&stem)?);
    eprintln!(
        "\n{} cases in {:.1} min; written to {} (+ .json, -*.svg)",
        results.rows.len(),
        started.elapsed().as_secs_f64() / 60.0,
        path.display()
    );
    let broken = results.problems().count();
    if broken > 0 {
        bail!("{broken} runs lost or failed jobs (see the report)");
    }
    Ok(())
}

/// The runtime the HTTP servers run on, whose threads are named so their
/// CPU is told from the rest of this process's.
fn http_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .thread_name(measure::HTTP_THREADS)
        .enable_all()
        .build()?)
}

/// The servers every case uses (Redis, the 200 ms HTTP/1.1 and HTTP/2
/// servers on `http_rt`), for the binaries `bin` and `native`.
fn start_bench(
    rt: &tokio::runtime::Runtime,
    http_rt: &tokio::runtime::Runtime,
    bin: PathBuf,
    native: PathBuf,
) -> Bench {
    let redis = TestRedis::start();
    let redis_pid = rt.block_on(async { measure::redis_pid(&mut redis.conn().await).await });
    Bench {
        bin,
        native,
        data_dir: wasmjobs_e2e::guests::repo_root().join("target/wasmjobs-bench-data"),
        redis,
        http: http_rt.block_on(HttpServer::start(Duration::from_millis(200))),
        http2: http_rt.block_on(HttpServer::start_h2(Duration::from_millis(200), H2_MAX_STREAMS)),
        redis_pid,
        postgres: None,
        json: wasmjobs_benches::JsonStyle::Compact,
    }
}

/// fib(25) natively: the same source as `plugins/fib/src/lib.rs`.
#[inline(never)]
fn fib(n: u32) -> u64 {
    if n <= 1 { 1 } else { fib(n - 1).wrapping_add(fib(n - 2)) }
}

/// Median of 100 native fib(25) calls, after 10 warm-up calls.
fn native_fib() -> Native {
    for _ in 0..10 {
        black_box(fib(black_box(25)));
    }
    let mut times: Vec<f64> = (0..100)
        .map(|_| {
            let start = Instant::now();
            black_box(fib(black_box(25)));
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    Native {
        fib25_ms: percentile(&times, 0.5),
    }
}

fn machine(args: &Args) -> Machine {
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb / 1024);
    let commit = command("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = command("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let mut invocation = "scripts/bench.sh".to_owned();
    if args.quick {
        invocation.push_str(" --quick");
    }
    if !args.only.is_empty() {
        let names: Vec<_> = args.only.iter().map(|w| w.name()).collect();
        invocation.push_str(&format!(" --only {}", names.join(",")));
    }
    Machine {
        date: date(),
        host: hostname(),
        cpu: cpu_model(),
        cores: cores(),
        memory_mib,
        kernel: command("uname", &["-sr"]).unwrap_or_default(),
        redis: command("redis-server", &["--version"])
            .and_then(|v| {
                v.split_whitespace()
                    .find(|w| w.starts_with("v="))
                    .map(|v| format!("Redis {}", &v[2..]))
            })
            .unwrap_or_else(|| "Redis (unknown version)".into()),
        wasmjobs: format!(
            "{} at {commit}{}",
            env!("CARGO_PKG_VERSION"),
            if dirty { " (uncommitted changes)" } else { "" }
        ),
        command: invocation,
    }
}
