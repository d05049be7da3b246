//! The hot-reload benchmark, against the real `wasmjobs run`.
//!
//! - **Reload latency**: a steady stream of `marked-append` jobs (one every
//!   2 ms) runs on the chaos plugin; a new version of its component (the
//!   marker bytes rewritten, so the content hash is new) is renamed into
//!   place, and the time from the rename to the first line written by the
//!   new version is measured. "compiled": a version never seen (Cranelift
//!   compiles it); "cached": a version compiled before (loaded from the
//!   compilation cache).
//! - **Start-up with 50 plugins**: 50 plugin directories, each a distinct
//!   component (the noop example with a custom section making its hash
//!   unique) serving its own class; time from spawning `wasmjobs run` to
//!   "running", with an empty compilation cache (cold) and again (warm).
//!
//! Run: `cargo bench -p wasmjobs-benches --bench reload`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs_benches::{Report, RunnerProcess, percentile};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");
const MARKER_V1: &[u8] = b"wasmjobs-marker-v1";
const ROUNDS: usize = 5;

fn main() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let mut report = Report::new("reload", "Hot reload: deploy-to-first-job latency and start-up");

    let chaos = wasmjobs_e2e::test_guests_dir().join("chaos");
    let original = std::fs::read(chaos.join("chaos_job.wasm"))?;
    let (compiled, cached) = rt.block_on(reload_latency(&redis, &chaos, &original))?;
    report.row(
        &format!("reload → first job, new component (compiled), median of {ROUNDS} (ms)"),
        format!("{:.0}", percentile(&compiled, 0.5)),
        "≤ 300",
    );
    report.row(
        "reload → first job, new component (compiled), max (ms)",
        format!("{:.0}", percentile(&compiled, 1.0)),
        "",
    );
    report.row(
        &format!("reload → first job, known component (cached), median of {ROUNDS} (ms)"),
        format!("{:.0}", percentile(&cached, 0.5)),
        "≤ 300",
    );
    report.row(
        "chaos component size (KB)",
        format!("{:.0}", original.len() as f64 / 1024.0),
        "",
    );

    let (cold, warm) = startup_50(&redis)?;
    report.row("start-up with 50 plugins, cold cache (ms)", format!("{cold:.0}"), "");
    report.row(
        "start-up with 50 plugins, warm cache (ms)",
        format!("{warm:.0}"),
        "≤ 1,000",
    );
    report.note("Reload latency includes the 50 ms settle time after the rename, the rescan, compiling or loading, pre-linking, and the next job's run (jobs arrive every 2 ms).".into());
    report.note("Start-up is spawn → \"running\": Redis connection, engine and pool set-up, every plugin loaded, first heartbeat.".into());
    report.finish()?;
    Ok(())
}

/// The chaos component with the marker's last two bytes set to `tag`.
fn variant(original: &[u8], tag: &[u8; 2]) -> Result<Vec<u8>> {
    let at = original
        .windows(MARKER_V1.len())
        .position(|w| w == MARKER_V1)
        .context("marker not found in the chaos component")?;
    let mut bytes = original.to_vec();
    let end = at + MARKER_V1.len();
    bytes[end - 2..end].copy_from_slice(tag);
    Ok(bytes)
}

/// Milliseconds from each rename to the first line of the new version:
/// (never-seen versions, versions seen before).
async fn reload_latency(redis: &TestRedis, chaos: &Path, original: &[u8]) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    let dir = tempfile::tempdir()?;
    wasmjobs_e2e::copy_plugin(chaos, dir.path());
    let component = dir.path().join("chaos/chaos_job.wasm");
    let out = dir.path().join("chaos/data/reload.txt");
    // A data dir of its own, so "compiled" versions are never in the cache.
    let data = tempfile::tempdir()?;
    let runner = RunnerProcess::start_in(
        BIN.as_ref(),
        data.path(),
        &redis.url(),
        dir.path(),
        &[],
        "warn,wasmjobs::runner=info",
    )?;
    let mut runner = runner;
    runner.wait_for_log(" running")?;
    let nonce = std::process::id() % 10;
    let tags: Vec<[u8; 2]> = (0..ROUNDS).map(|i| [b'a' + nonce as u8, b'a' + i as u8]).collect();
    let mut compiled = Vec::new();
    let mut cached = Vec::new();
    let mut seq = 0u64;
    for (round, tag) in tags.iter().chain(tags.iter()).enumerate() {
        let bytes = variant(original, tag)?;
        let marker = format!("wasmjobs-marker-{}", String::from_utf8_lossy(tag));
        let staging = component.with_extension("wasm.tmp");
        std::fs::write(&staging, &bytes)?;
        let seen = std::fs::metadata(&out).map(|m| m.len() as usize).unwrap_or(0);
        let renamed = Instant::now();
        std::fs::rename(&staging, &component)?;
        let deadline = renamed + Duration::from_secs(30);
        loop {
            let mut payload = Payload::new(
                "ChaosJob",
                vec![json!("marked-append"), json!("reload.txt"), json!(seq), json!(0)],
                "default",
                wasmjobs::redis::now_f64(),
            );
            client::push(&mut conn, &mut payload).await?;
            seq += 1;
            let written = std::fs::read(&out).unwrap_or_default();
            if String::from_utf8_lossy(written.get(seen..).unwrap_or_default()).contains(&marker) {
                break;
            }
            if Instant::now() > deadline {
                bail!("version {marker} never ran: {}", runner.log());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let ms = renamed.elapsed().as_secs_f64() * 1e3;
        if round < ROUNDS {
            compiled.push(ms)
        } else {
            cached.push(ms)
        }
        // Let the stream settle on this version before the next swap.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    runner.stop()?;
    compiled.sort_by(f64::total_cmp);
    cached.sort_by(f64::total_cmp);
    Ok((compiled, cached))
}

/// A custom section named `wasmjobs-bench` holding `n`, appended to a
/// component: a distinct content hash, the same behaviour.
fn with_custom_section(component: &[u8], n: u32) -> Vec<u8> {
    let name = b"wasmjobs-bench";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(&n.to_le_bytes());
    let mut bytes = component.to_vec();
    bytes.push(0);
    bytes.push(payload.len() as u8);
    bytes.extend_from_slice(&payload);
    bytes
}

/// Start-up time with 50 distinct plugins: (cold cache, warm cache) in ms.
fn startup_50(redis: &TestRedis) -> Result<(f64, f64)> {
    let noop = wasmjobs_e2e::plugins_dir().join("noop");
    let component = std::fs::read(noop.join("noop_job.wasm"))?;
    let dir = tempfile::tempdir()?;
    let salt = std::process::id();
    for i in 0..50u32 {
        let root = dir.path().join(format!("noop-{i:02}"));
        std::fs::create_dir_all(&root)?;
        std::fs::write(
            root.join("noop_job.wasm"),
            with_custom_section(&component, salt.wrapping_mul(64) + i),
        )?;
        std::fs::write(
            root.join("wasmjobs.toml"),
            format!("component = \"noop_job.wasm\"\nclasses = [\"NoopJob{i}\"]\n"),
        )?;
    }
    let data = tempfile::tempdir()?;
    let mut times = Vec::new();
    for _ in 0..2 {
        let spawned = Instant::now();
        let mut runner = RunnerProcess::start_in(BIN.as_ref(), data.path(), &redis.url(), dir.path(), &[], "info")?;
        runner.wait_for_log(" running")?;
        times.push(spawned.elapsed().as_secs_f64() * 1e3);
        let log = runner.stop()?;
        if log.matches("plugin loaded").count() != 50 {
            bail!("not every plugin loaded:\n{log}");
        }
    }
    Ok((times[0], times[1]))
}
