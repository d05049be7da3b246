//! What cluster limits cost (`docs/limits.md`), against the real
//! `wasmjobs run`.
//!
//! - **Limits on another plugin**: N pre-pushed `NoopJob`s drained at
//!   C=100 (reliable fetch), alternately with the chaos test guest loaded
//!   without limits and loaded with `limits.rate` and a per-key
//!   concurrency limit; median jobs/s of each and the ratio (target
//!   ≥ 0.95: a job whose plugin has no limit costs no Redis call).
//! - **Every job through a per-key limit**: the same drain with `noop`
//!   itself limited per key (`key = "args.0"`, 100 key values,
//!   `concurrency = 1000` each: generous, so the figure is the cost of the
//!   check, the lease and its release, not of waiting).
//!
//! N is 100,000 (`BENCH_QUICK=1`: 10,000, one round each).
//! Run: `cargo bench -p wasmjobs-benches --bench limits`.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use wasmjobs_benches::{Report, drain, percentile};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

/// `noop` and `chaos` copied into a new directory, with `chaos_limits` and
/// `noop_limits` appended to their manifests.
fn plugins(noop_limits: &str, chaos_limits: &str) -> Result<tempfile::TempDir> {
    let dir = wasmjobs_e2e::runner::plugins(&["noop"], &["chaos"]);
    for (plugin, limits) in [("noop", noop_limits), ("chaos", chaos_limits)] {
        let manifest = dir.path().join(plugin).join("wasmjobs.toml");
        let text = std::fs::read_to_string(&manifest).context("reading a manifest")?;
        std::fs::write(&manifest, format!("{text}\n{limits}\n")).context("writing a manifest")?;
    }
    Ok(dir)
}

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (jobs, rounds) = if quick { (10_000u64, 1) } else { (100_000, 3) };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let plain = plugins("", "")?;
    let other_limited = plugins(
        "",
        "[limits]\nrate = \"100/s\"\n[limits.per_key]\nkey = \"args.0\"\nconcurrency = 2",
    )?;
    let noop_limited = plugins("[limits.per_key]\nkey = \"args.0\"\nconcurrency = 1000", "")?;
    let mut report = Report::new("limits", "Cluster limits: their cost on jobs without and with them");

    let rate = |dir: &Path, args: fn(u64) -> serde_json::Value| -> Result<f64> {
        let run = rt.block_on(drain(
            BIN.as_ref(),
            &redis,
            dir,
            "NoopJob",
            jobs,
            args,
            &["--concurrency", "100"],
        ))?;
        Ok(jobs as f64 / run.wall.as_secs_f64())
    };
    let no_args = |_| json!([]);
    let (mut without, mut beside, mut through) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(rate(plain.path(), no_args)?);
        beside.push(rate(other_limited.path(), no_args)?);
        through.push(rate(noop_limited.path(), |i| json!([i % 100]))?);
    }
    for runs in [&mut without, &mut beside, &mut through] {
        runs.sort_by(f64::total_cmp);
    }
    let median = |runs: &[f64]| percentile(runs, 0.5);
    let base = median(&without);
    report.row(
        "NoopJob C=100, no plugin limited: jobs/s, median",
        format!("{base:.0}"),
        "",
    );
    report.row(
        "NoopJob C=100, another plugin rate- and key-limited: jobs/s, median",
        format!("{:.0}", median(&beside)),
        "",
    );
    report.row(
        "limits on another plugin ÷ none",
        format!("{:.3}", median(&beside) / base),
        "≥ 0.95",
    );
    report.row(
        "NoopJob C=100, every job through a per-key concurrency limit: jobs/s, median",
        format!("{:.0}", median(&through)),
        "",
    );
    report.row(
        "per-key limited ÷ unlimited",
        format!("{:.3}", median(&through) / base),
        "",
    );
    let list = |runs: &[f64]| runs.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    report.row(
        "runs none / other limited / per-key (jobs/s)",
        format!("{} / {} / {}", list(&without), list(&beside), list(&through)),
        "",
    );
    report.note(format!(
        "{jobs} NoopJob per run, reliable fetch, {rounds} round(s), the three set-ups in turn each round."
    ));
    report.note("Per-key: 100 key values (`args.0`), `concurrency = 1000` each: one Lua check-and-take per job, and one ZREM when it ends.".into());
    report.finish()?;
    Ok(())
}
