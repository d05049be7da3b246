//! `wasmjobs build DIR`: builds a plugin directory's component, from
//! anywhere.
//!
//! The language is read off the directory (`Cargo.toml`: Rust, `app.py`:
//! Python, `job.js`: JavaScript), the pinned toolchain is installed on first
//! use ([`super::sdk`]), the result is checked to be a component of the
//! job world (compiled through the same cache `run` uses, so the runner
//! then loads it at once), and it is put where the manifest's `component`
//! says by write-then-rename, so a runner watching the directory reloads a
//! whole file, never half of one. With `--watch` it builds again after
//! each change to the sources ([`super::build_watch`]); with `--dev` a
//! Python plugin is a development build ([`super::build_dev`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};
use clap::Args;

use super::Cli;
use super::new::Language;
use super::sdk::{self, Sdk};
use crate::plugin::{MANIFEST_FILE, Manifest};
use crate::sandbox::{EngineConfig, Executor};

/// Arguments of `wasmjobs build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The plugin directory (holding wasmjobs.toml).
    pub dir: PathBuf,
    /// Another guest SDK (a wasmjobs checkout's `guest-sdk` directory, to
    /// try changes to the SDK; default: the one this wasmjobs carries).
    #[arg(long, env = "WASMJOBS_SDK")]
    pub sdk: Option<PathBuf>,
    /// Keep watching the plugin's sources and build again after each
    /// change (a failed build waits for the next one); Ctrl-C stops.
    #[arg(long)]
    pub watch: bool,
    /// A development build (Python): the interpreter and the modules the
    /// app imports are built once, the app's sources travel beside them
    /// and are imported on an instance's first job, so an edit builds in
    /// well under a second. Not for production: build without it to deploy.
    #[arg(long)]
    pub dev: bool,
}

/// Runs the command.
pub fn run(cli: &Cli, args: &BuildArgs) -> Result<ExitCode> {
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("{}: no such plugin directory", args.dir.display()))?;
    // Stopped (Ctrl-C, kill) mid-build: no tool left running, no
    // temporary file left in the plugin directory.
    super::build_stop::on_stop_remove_temporaries();
    if args.watch {
        return super::build_watch::watch(&dir, || build_once(cli, args, &dir));
    }
    build_once(cli, args, &dir)?;
    Ok(ExitCode::SUCCESS)
}

/// Builds the plugin in `dir` once.
fn build_once(cli: &Cli, args: &BuildArgs, dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest_path)
        .with_context(|| format!("{}: cannot read (is this a plugin directory?)", manifest_path.display()))?;
    let manifest = Manifest::parse(&manifest_path, &text)?;
    let language = detect(&dir)?;
    let sdk = Sdk::locate(args.sdk.as_deref())?;
    let name = manifest.component_name();
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _listed = super::build_stop::Temporary::register(&temporary);
    let concurrent = manifest.instances.concurrent.is_some();
    let built = build(language, &dir, &sdk, &temporary, concurrent, args.dev)
        .and_then(|()| check(cli, &temporary, &name, concurrent));
    let size = match built {
        Ok(size) => size,
        Err(err) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(err);
        }
    };
    std::fs::rename(&temporary, &manifest.component)
        .with_context(|| format!("cannot move the component to {}", manifest.component.display()))?;

    let kind = if args.dev { ", a development build" } else { "" };
    println!("built {} ({size} bytes{kind})", manifest.component.display());
    let parent = dir.parent().unwrap_or(&dir);
    for class in &manifest.classes {
        println!(
            "{}",
            try_it(&parent.display().to_string(), class, manifest.examples.get(class))
        );
    }
    Ok(())
}

/// The plugin's language, from the files it has.
fn detect(dir: &Path) -> Result<Language> {
    let found: Vec<Language> = [
        ("Cargo.toml", Language::Rust),
        ("app.py", Language::Python),
        ("job.js", Language::Js),
    ]
    .into_iter()
    .filter(|(file, _)| dir.join(file).is_file())
    .map(|(_, language)| language)
    .collect();
    match found.as_slice() {
        [language] => Ok(*language),
        [] => bail!(
            "{}: no Cargo.toml (Rust), app.py (Python) or job.js (JavaScript) to build; `wasmjobs new` makes one",
            dir.display()
        ),
        _ => bail!(
            "{}: more than one of Cargo.toml, app.py and job.js; which language is it?",
            dir.display()
        ),
    }
}

/// Builds `dir` into the component file `out`. For Python the world is
/// `async-plugin` if `concurrent` (`[instances] concurrent`), else
/// `plugin`; for Rust the source decides (`export_async_job!` or
/// `export_job!`), and [`check`] refuses a mismatch.
fn build(language: Language, dir: &Path, sdk: &Sdk, out: &Path, concurrent: bool, dev: bool) -> Result<()> {
    if dev && language != Language::Python {
        bail!(
            "--dev builds Python plugins (a JavaScript or Rust plugin has no interpreter to keep apart from the app)"
        );
    }
    if language == Language::Js && concurrent {
        bail!(
            "{}: [instances] concurrent needs an async-plugin component, whose perform is an `async func`, and componentize-js 0.23 cannot build async exports: remove `concurrent` (`reuse` keeps instances warm)",
            dir.display()
        );
    }
    let world = if concurrent { "async-plugin" } else { "plugin" };
    match language {
        Language::Rust => build_rust(dir, sdk, out),
        Language::Python if dev => super::build_dev::build(dir, sdk, world, out),
        Language::Python => {
            eprintln!("componentize-py: building {} (~10 s)", dir.display());
            // componentize-py imports the app to snapshot it, and writes
            // `__pycache__/` beside the sources whatever
            // PYTHONDONTWRITEBYTECODE says: build from a copy, so nothing
            // lands in the plugin directory.
            let stage = tempfile::tempdir().context("cannot create a staging directory")?;
            stage_sources(dir, stage.path())?;
            componentize_py(sdk, world, stage.path(), "app", out)
        }
        Language::Js => {
            sdk::componentize_js(sdk)?;
            eprintln!("componentize-js: building {} (~10 s)", dir.display());
            sdk::run_quietly(
                Command::new("node")
                    .arg(sdk.js().join("build.mjs"))
                    .arg(dir)
                    .arg(out)
                    .arg(sdk.wit()),
                "componentize-js",
            )
        }
    }
}

/// Runs componentize-py on the module `module` of `stage` (with the SDK on
/// the path) for `world`, writing the component to `out`.
pub(super) fn componentize_py(sdk: &Sdk, world: &str, stage: &Path, module: &str, out: &Path) -> Result<()> {
    let tool = sdk::componentize_py()?;
    sdk::run_quietly(
        Command::new(tool)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg("-d")
            .arg(sdk.wit())
            .args(["-w", world, "componentize", "-p"])
            .arg(stage)
            .arg("-p")
            .arg(sdk.python())
            .arg(module)
            .arg("-o")
            .arg(out),
        "componentize-py",
    )
}

/// Copies `dir`'s files to `stage`, leaving out build output and caches
/// ([`not_a_source`]).
fn stage_sources(dir: &Path, stage: &Path) -> Result<()> {
    let skipped = super::sources::not_a_source;
    for entry in walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| !skipped(e))
    {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let relative = entry.path().strip_prefix(dir).context("a path outside the plugin")?;
        let target = stage.join(relative);
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&target).with_context(|| format!("cannot create {}", target.display()))?;
        } else if entry.file_type().is_file() {
            std::fs::copy(entry.path(), &target).with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

const RUST_TARGET: &str = "wasm32-wasip2";

/// `cargo build --release --target wasm32-wasip2`, adding the target with
/// rustup if it is missing, and copies the library's `.wasm` to `out`.
/// `wasmjobs-guest` is the SDK crate `sdk` holds (a `[patch]` given on
/// the command line: the plugin's `Cargo.toml` names only a version). The
/// build output goes to `CARGO_TARGET_DIR` if set, else to `target/` in
/// the toolchains directory (shared by every plugin), never into the
/// plugin directory.
fn build_rust(dir: &Path, sdk: &Sdk, out: &Path) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|t| t.trim() == RUST_TARGET)
        });
    match installed {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("adding the {RUST_TARGET} target with rustup (first Rust build only)");
            sdk::run_quietly(
                Command::new("rustup").args(["target", "add", RUST_TARGET]),
                "rustup target add",
            )?;
        }
        Err(_) => eprintln!("no rustup: assuming this Rust toolchain has the {RUST_TARGET} target"),
    }
    let mut cargo = Command::new("cargo");
    if std::env::var_os("CARGO_TARGET_DIR").is_none_or(|d| d.is_empty()) {
        // Not `target/` in the plugin directory, where a running runner
        // would watch the build churn; shared by every plugin built here.
        cargo.env("CARGO_TARGET_DIR", sdk::toolchains_dir()?.join("target"));
    }
    let patch = format!(
        "patch.crates-io.wasmjobs-guest.path={}",
        toml::Value::String(sdk.rust_crate().display().to_string())
    );
    cargo
        .arg("--config")
        .arg(patch)
        .args([
            "build",
            "--release",
            "--target",
            RUST_TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let output =
        super::build_stop::output(&mut cargo).context("cannot run cargo (is Rust installed? https://rustup.rs)")?;
    if !output.status.success() {
        bail!("cargo build failed for {}", dir.display());
    }
    let wasm = wasm_artifact(&String::from_utf8_lossy(&output.stdout)).with_context(|| {
        format!(
            "cargo built no .wasm library for {} (is crate-type [\"cdylib\"]?)",
            dir.display()
        )
    })?;
    std::fs::copy(&wasm, out).with_context(|| format!("cannot copy {}", wasm.display()))?;
    Ok(())
}

/// The `.wasm` file of the last cdylib among cargo's JSON messages.
fn wasm_artifact(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
        })
        .filter_map(|m| {
            m["filenames"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".wasm"))
                .map(PathBuf::from)
        })
        .next_back()
}

/// Checks that `component` is a component of the job world (the async one
/// if `concurrent`) by compiling it through the data directory's cache;
/// its size in bytes.
fn check(cli: &Cli, component: &Path, name: &str, concurrent: bool) -> Result<u64> {
    let bytes = std::fs::read(component).with_context(|| format!("cannot read {}", component.display()))?;
    let executor = Executor::new(&EngineConfig {
        concurrency: 1,
        ..EngineConfig::default()
    })?;
    let cache = super::data_cache(&cli.data_dir);
    crate::plugin::catalog::check_component(&executor, &cache, &bytes, name, concurrent)
        .context("the build is not a usable plugin")?;
    Ok(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdylib_artifact_is_found_among_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"filenames":["/t/libserde.rlib"]}
{"reason":"compiler-artifact","target":{"kind":["cdylib"]},"filenames":["/t/wasm32-wasip2/release/greet.wasm"]}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            wasm_artifact(messages),
            Some(PathBuf::from("/t/wasm32-wasip2/release/greet.wasm"))
        );
        assert_eq!(wasm_artifact("not json"), None);
    }

    #[test]
    fn the_language_is_read_off_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(detect(dir.path()).unwrap_err().to_string().contains("wasmjobs new"));
        std::fs::write(dir.path().join("app.py"), "").unwrap();
        assert_eq!(detect(dir.path()).unwrap(), Language::Python);
        std::fs::write(dir.path().join("job.js"), "").unwrap();
        assert!(detect(dir.path()).unwrap_err().to_string().contains("more than one"));
    }
}

/// The `exec` command that tries `class`: with its `[examples]` args, or
/// a placeholder saying what to put there (a guess could be of the wrong
/// type).
fn try_it(plugins: &str, class: &str, example: Option<&String>) -> String {
    match example {
        Some(args) => format!(
            "try it: wasmjobs exec --plugins {plugins} {class} '{}'   (its [examples] args)",
            args.replace('\'', "'\\''")
        ),
        None => format!(
            "try it: wasmjobs exec --plugins {plugins} {class} '[ARGS]'   (the job's args as a JSON array; set [examples] {class} = '[...]' in wasmjobs.toml to have them here)"
        ),
    }
}

#[cfg(test)]
mod try_it_tests {
    use super::try_it;

    #[test]
    fn the_hint_uses_the_declared_example_or_says_what_to_give() {
        let with = try_it("plugins", "AddJob", Some(&"[1, 2]".to_owned()));
        assert_eq!(
            with,
            "try it: wasmjobs exec --plugins plugins AddJob '[1, 2]'   (its [examples] args)"
        );
        let quoted = try_it("p", "Greet", Some(&r#"["it's"]"#.to_owned()));
        assert!(quoted.contains(r#"'["it'\''s"]'"#), "{quoted}");
        let without = try_it("p", "AddJob", None);
        assert!(
            without.contains("'[ARGS]'") && without.contains("[examples] AddJob"),
            "{without}"
        );
    }
}
