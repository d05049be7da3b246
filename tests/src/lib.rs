//! Support for the end-to-end tests in `tests/tests/`.
//!
//! Everything here is real: components built from the repo's guest sources
//! by `scripts/build-plugins.sh`, the real executor, real HTTP, Redis and
//! PostgreSQL servers on loopback. Nothing is mocked.

pub mod browser;
pub mod cli;
pub mod dashboard;
pub mod guests;
pub mod http_server;
pub mod otlp;
pub mod postgres;
pub mod redis_server;
pub mod runner;
pub mod sidekiq;

use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmjobs::job::Job;
use wasmjobs::plugin::{Catalog, CompileCache};
use wasmjobs::sandbox::{EngineConfig, ExecOptions, Execution, Executor, Limits};

pub use guests::{plugins_dir, repo_root, test_guests_dir};

/// A manifest's `[[schedule]]` that enqueues a `NoopJob` on `cron` every
/// second.
pub const EVERY_SECOND_SCHEDULE: &str = r#"
[[schedule]]
name = "every-second"
cron = "*/1 * * * * *"
class = "NoopJob"
queue = "cron"
"#;

/// Polls `check` every 10 ms until it holds; panics with `what()` after
/// `timeout`. The tests' one way to wait for a condition.
pub async fn eventually<F, Fut>(timeout: Duration, what: impl Fn() -> String, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {timeout:?}: {}",
            what()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shared compilation cache for tests, so each component compiles once
/// per machine rather than once per test.
pub fn cache() -> CompileCache {
    CompileCache::new(repo_root().join("target/wasmjobs-test-cache"))
}

/// An executor for `concurrency` jobs with the given timeout and memory limit.
pub fn executor_with(concurrency: u32, timeout: Duration, memory: usize) -> Executor {
    executor_from(&EngineConfig {
        concurrency,
        limits: Limits { memory, timeout },
        ..EngineConfig::default()
    })
}

/// An executor with default limits.
pub fn executor(concurrency: u32) -> Executor {
    executor_from(&EngineConfig {
        concurrency,
        ..EngineConfig::default()
    })
}

/// An executor from a full configuration.
pub fn executor_from(config: &EngineConfig) -> Executor {
    Executor::new(config).expect("executor")
}

/// Loads `dir` and asserts that nothing in it is broken.
///
/// Loads are serialised within a test process: `plugins/` holds 15–19 MB
/// Python and JS components (seconds of Cranelift each), and tests running
/// in parallel would all compile them at once before the shared cache has
/// them; one at a time, the first compiles and the rest read the cache.
pub fn catalog(dir: &Path, executor: &Executor) -> Catalog {
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = LOADING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let catalog = Catalog::load(dir, executor, &cache()).expect("catalog");
    drop(guard);
    assert!(
        catalog.broken().is_empty(),
        "broken plugins in {}: {:?}",
        dir.display(),
        catalog.broken()
    );
    catalog
}

/// Runs one job of `class` with `args`, capturing its logs.
pub async fn run(executor: &Executor, catalog: &Catalog, class: &str, args: &str) -> Execution {
    let plugin = catalog.get(class).unwrap_or_else(|| panic!("no plugin for {class}"));
    let job = Job::new(class, args).expect("valid job");
    executor
        .execute(&plugin.loaded, &job, &ExecOptions { capture_logs: true })
        .await
}

/// The captured log messages of an execution.
pub fn messages(execution: &Execution) -> Vec<String> {
    execution.logs.iter().map(|l| l.message.clone()).collect()
}

/// Copies a built plugin (manifest + component) into `dest/<name>`, so a
/// test can give it a private data directory or edit its manifest.
pub fn copy_plugin(src: &Path, dest: &Path) -> PathBuf {
    let name = src.file_name().expect("plugin dir name");
    let target = dest.join(name);
    std::fs::create_dir_all(&target).expect("create plugin copy");
    for entry in std::fs::read_dir(src).expect("read plugin dir") {
        let path = entry.expect("dir entry").path();
        let keep =
            path.file_name().is_some_and(|n| n == "wasmjobs.toml") || path.extension().is_some_and(|e| e == "wasm");
        if keep {
            std::fs::copy(&path, target.join(path.file_name().expect("file name"))).expect("copy plugin file");
        }
    }
    target
}

/// Deploys the built plugin `src` into the plugins directory `plugins`
/// whole, as an operator should: copied into a hidden staging directory
/// there, then renamed into place, so a watching runner never sees it half
/// written. Returns its directory.
pub fn deploy_plugin(src: &Path, plugins: &Path) -> PathBuf {
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(plugins)
        .expect("staging dir");
    let staged = copy_plugin(src, staging.path());
    let target = plugins.join(staged.file_name().expect("plugin dir name"));
    std::fs::rename(&staged, &target).expect("rename plugin dir");
    target
}

/// Appends the lines `toml` (a table, say) to the `wasmjobs.toml` of the
/// plugin in `dir`.
pub fn append_to_manifest(dir: &Path, toml: &str) {
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("read manifest");
    std::fs::write(&manifest, format!("{text}\n{toml}\n")).expect("write manifest");
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn output_text(output: &std::process::Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Asserts that a finished command succeeded, showing what it printed if not.
pub fn assert_success(output: &std::process::Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
