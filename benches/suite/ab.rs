//! `wasmjobs-bench compare`: two `wasmjobs` binaries, A and B, drain the
//! same cases on the same Redis and HTTP servers, alternating (A then B in
//! odd rounds, B then A in even ones, so a machine that speeds up or slows
//! down during the run favours neither), and the report is B ÷ A per case
//! with the spread of the rounds, and the Redis commands each sent per
//! job (`INFO commandstats`, commands run by scripts included, from the
//! runner's start to its last job).
//!
//! Only the runner differs between A and B: payloads, plugins
//! (`plugins/`, built once) and servers are this checkout's. This is the
//! guard against slow regressions: a loss of a few percent per change
//! hides in the day-to-day drift of a shared machine when each change is
//! compared with figures committed earlier, never when both binaries run
//! in the same minutes. `scripts/bench-compare.sh REV_A REV_B` builds the
//! binaries from git revisions and runs this.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use wasmjobs_benches::JsonStyle;

use crate::measure::Bench;
use crate::plan::{Case, Fetch, Processor, Workload};

const USAGE: &str = "usage: wasmjobs-bench compare --a PATH --b PATH [--names A B] [--rounds N] \
                     [--only noop,noop-spaced,noop-c10,http,http-c10k] [--jobs N]";

/// One case of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AbCase {
    /// NoopJob, reliable fetch, C=100, compact JSON.
    Noop,
    /// The same with spaced JSON (Python's `json.dumps`).
    NoopSpaced,
    /// NoopJob at C=10.
    NoopC10,
    /// HttpGetJob at C=1,000 against the 200 ms server.
    Http,
    /// HttpGetJob at C=10,000 against the 200 ms server: the memory of
    /// 10,000 jobs in flight (peak RSS). Not run unless named in `--only`.
    HttpC10k,
}

impl AbCase {
    /// The cases run without `--only`.
    const DEFAULT: [AbCase; 4] = [AbCase::NoopC10, AbCase::Noop, AbCase::NoopSpaced, AbCase::Http];
    const ALL: [AbCase; 5] = [
        AbCase::NoopC10,
        AbCase::Noop,
        AbCase::NoopSpaced,
        AbCase::Http,
        AbCase::HttpC10k,
    ];

    fn name(self) -> &'static str {
        match self {
            AbCase::Noop => "noop",
            AbCase::NoopSpaced => "noop-spaced",
            AbCase::NoopC10 => "noop-c10",
            AbCase::Http => "http",
            AbCase::HttpC10k => "http-c10k",
        }
    }

    fn label(self) -> &'static str {
        match self {
            AbCase::Noop => "noop C=100",
            AbCase::NoopSpaced => "noop C=100, spaced JSON",
            AbCase::NoopC10 => "noop C=10",
            AbCase::Http => "http C=1,000 (200 ms)",
            AbCase::HttpC10k => "http C=10,000 (200 ms)",
        }
    }

    /// The suite's case; `jobs` overrides the default count.
    fn case(self, jobs: Option<u64>) -> Case {
        let (workload, concurrency, default_jobs) = match self {
            AbCase::Noop | AbCase::NoopSpaced => (Workload::Noop, 100, 100_000),
            AbCase::NoopC10 => (Workload::Noop, 10, 50_000),
            // 10 rounds of the server's 200 ms: ~2 s at best.
            AbCase::Http => (Workload::Http, 1_000, 10_000),
            // 5 rounds of the server's 200 ms: ~1 s at best.
            AbCase::HttpC10k => (Workload::Http, 10_000, 50_000),
        };
        Case {
            processor: Processor::Wasmjobs,
            workload,
            fetch: Fetch::Reliable,
            concurrency,
            jobs: jobs.unwrap_or(default_jobs),
            idle: std::time::Duration::ZERO,
        }
    }

    fn json(self) -> JsonStyle {
        if self == AbCase::NoopSpaced {
            JsonStyle::Spaced
        } else {
            JsonStyle::Compact
        }
    }
}

struct Args {
    a: PathBuf,
    b: PathBuf,
    names: [String; 2],
    rounds: usize,
    cases: Vec<AbCase>,
    jobs: Option<u64>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        a: PathBuf::new(),
        b: PathBuf::new(),
        names: ["A".into(), "B".into()],
        rounds: 3,
        cases: AbCase::DEFAULT.to_vec(),
        jobs: None,
    };
    let mut argv = std::env::args().skip(2);
    while let Some(arg) = argv.next() {
        let mut value = || argv.next().with_context(|| format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--a" => args.a = value()?.into(),
            "--b" => args.b = value()?.into(),
            "--names" => args.names = [value()?, value()?],
            "--rounds" => args.rounds = value()?.parse().context("--rounds")?,
            "--jobs" => args.jobs = Some(value()?.parse().context("--jobs")?),
            "--only" => {
                args.cases = value()?
                    .split(',')
                    .map(|name| {
                        AbCase::ALL
                            .into_iter()
                            .find(|case| case.name() == name)
                            .with_context(|| format!("no case {name:?}\n{USAGE}"))
                    })
                    .collect::<Result<_>>()?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    for bin in [&args.a, &args.b] {
        if !bin.is_file() {
            bail!("{} is not a file\n{USAGE}", bin.display());
        }
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    Ok(args)
}

/// One drain's figures.
#[derive(Debug, Clone, Copy)]
struct Drain {
    jobs_per_sec: f64,
    commands_per_job: f64,
    /// CPU per job of the runner and of redis-server, µs.
    runner_us: f64,
    redis_us: f64,
    /// The runner's peak RSS (`VmHWM`), MB.
    peak_mb: f64,
}

pub fn main() -> Result<()> {
    let args = parse_args()?;
    wasmjobs::runner::os_limits::raise_open_files(20_000);
    let rt = tokio::runtime::Runtime::new()?;
    let http_rt = crate::http_runtime()?;
    let native = std::env::current_exe()?.with_file_name("wasmjobs-native");
    let mut bench = crate::start_bench(&rt, &http_rt, args.a.clone(), native);
    let data = bench.data_dir.clone();
    let bins = [
        (args.a.clone(), data.join("compare-a")),
        (args.b.clone(), data.join("compare-b")),
    ];
    // results[case][side] = one Drain per round.
    let mut results: BTreeMap<usize, [Vec<Drain>; 2]> = BTreeMap::new();
    // A case one of the binaries cannot run (a plugin built for a newer
    // host, say) is reported and left out of the later rounds.
    let mut failed: BTreeMap<usize, String> = BTreeMap::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for (index, ab) in args.cases.iter().enumerate() {
            for side in order {
                if failed.contains_key(&index) {
                    continue;
                }
                let case = ab.case(args.jobs);
                (bench.bin, bench.data_dir) = bins[side].clone();
                bench.json = ab.json();
                let drain = match rt.block_on(drain(&mut bench, &case)) {
                    Ok(drain) => drain,
                    Err(err) => {
                        eprintln!("{} with {}: {err:#}", ab.label(), args.names[side]);
                        failed.insert(index, format!("{} could not run it", args.names[side]));
                        continue;
                    }
                };
                eprintln!(
                    "round {} {:<26} {:<12} {:>9.0} jobs/s {:>5.2} commands/job, CPU µs/job: runner {:.1}, redis {:.1}, peak RSS {:.1} MB",
                    round + 1,
                    ab.label(),
                    args.names[side],
                    drain.jobs_per_sec,
                    drain.commands_per_job,
                    drain.runner_us,
                    drain.redis_us,
                    drain.peak_mb
                );
                results.entry(index).or_default()[side].push(drain);
            }
        }
    }
    drop(bench);
    drop(http_rt);
    println!("{}", table(&args, &results, &failed));
    Ok(())
}

/// Drains `case` once with the bench's binary; fails on any lost or failed job.
async fn drain(bench: &mut Bench, case: &Case) -> Result<Drain> {
    let row = bench.run(case).await?;
    if !row.problems.is_empty() {
        bail!(
            "{} with {}: {}",
            case.workload.name(),
            bench.bin.display(),
            row.problems.join("; ")
        );
    }
    let cpu = row.cpu_per_job;
    Ok(Drain {
        jobs_per_sec: row.jobs_per_sec,
        commands_per_job: row.redis_commands_per_job.unwrap_or(f64::NAN),
        runner_us: cpu.map_or(f64::NAN, |cpu| cpu.runner),
        redis_us: cpu.and_then(|cpu| cpu.redis).unwrap_or(f64::NAN),
        peak_mb: row.peak_rss_kb as f64 / 1024.0,
    })
}

/// The report: per case, each side's jobs/s per round, B ÷ A (the mean of
/// the rounds' ratios, with their range), commands per job, CPU per job
/// and the runner's peak RSS per round.
fn table(args: &Args, results: &BTreeMap<usize, [Vec<Drain>; 2]>, failed: &BTreeMap<usize, String>) -> String {
    let [a, b] = &args.names;
    let mut out = format!(
        "\n| case | {a} jobs/s | {b} jobs/s | {b} ÷ {a} (min–max) | commands/job {a} → {b} | CPU µs/job runner {a} → {b} | redis {a} → {b} | peak RSS MB {a} → {b} |\n|---|---|---|---|---|---|---|---|\n"
    );
    for (index, case) in args.cases.iter().enumerate() {
        if let Some(why) = failed.get(&index) {
            out.push_str(&format!("| {} | – | – | {why} | | | | |\n", case.label()));
            continue;
        }
        let Some([left, right]) = results.get(&index) else {
            continue;
        };
        let ratios: Vec<f64> = left
            .iter()
            .zip(right)
            .map(|(l, r)| r.jobs_per_sec / l.jobs_per_sec)
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let (min, max) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let rates = |side: &[Drain]| {
            side.iter()
                .map(|d| format!("{:.0}", d.jobs_per_sec))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let peaks = |side: &[Drain]| {
            side.iter()
                .map(|d| format!("{:.0}", d.peak_mb))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let mean_of = |side: &[Drain], f: fn(&Drain) -> f64| side.iter().map(f).sum::<f64>() / side.len() as f64;
        out.push_str(&format!(
            "| {} | {} | {} | **{mean:.2}×** ({min:.2}–{max:.2}) | {:.2} → {:.2} | {:.1} → {:.1} | {:.1} → {:.1} | {} → {} |\n",
            case.label(),
            rates(left),
            rates(right),
            mean_of(left, |d| d.commands_per_job),
            mean_of(right, |d| d.commands_per_job),
            mean_of(left, |d| d.runner_us),
            mean_of(right, |d| d.runner_us),
            mean_of(left, |d| d.redis_us),
            mean_of(right, |d| d.redis_us),
            peaks(left),
            peaks(right),
        ));
    }
    out.push_str(&format!(
        "\n{} rounds, alternating; A = {}, B = {}.\n",
        args.rounds,
        args.a.display(),
        args.b.display()
    ));
    out
}
