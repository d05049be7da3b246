//! A first plugin, made the way the README tells a newcomer to: in a
//! directory of their own outside this repository, `wasmjobs new` for each
//! language, `wasmjobs build`, the `wasmjobs exec` line the build prints,
//! then `wasmjobs enqueue` and `wasmjobs run` on the embedded Redis. Real
//! toolchains (cargo, componentize-py, componentize-js), real processes.
//! Toolchains and the Rust target directory: [`toolchain_env`].

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use wasmjobs_e2e::cli::{printed, toolchain_env, wasmjobs_in};
use wasmjobs_e2e::{assert_success, repo_root};

/// A build installs its toolchain on first use: give it time.
const BUILD: Duration = Duration::from_secs(900);
const QUICK: Duration = Duration::from_secs(120);

/// Runs a wasmjobs command in the newcomer's directory.
fn wasmjobs(home: &Path, args: &[&str], timeout: Duration) -> Output {
    wasmjobs_in(home, args, &toolchain_env(), timeout)
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under dir");
                found.insert(relative.to_string_lossy().into_owned());
            }
        }
    }
    found
}

/// new → build → exec → enqueue → run for one language; `sources` are the
/// files `new` writes besides the manifest, `wrong_type` what the dead
/// outcome of `[42]` for a string argument says.
fn first_plugin(language: &str, class: &str, sources: &[&str], wrong_type: &str) {
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path();
    assert!(
        !home.starts_with(repo_root()),
        "the newcomer's directory must be outside the repository"
    );

    let new = wasmjobs(home, &["new", language, "plugins/greet", "--class", class], QUICK);
    assert_success(&new, "wasmjobs new");
    assert!(
        printed(&new).contains("wasmjobs build plugins/greet"),
        "{}",
        printed(&new)
    );
    let refused = wasmjobs(home, &["new", language, "plugins/greet"], QUICK);
    assert!(
        !refused.status.success() && printed(&refused).contains("already exists"),
        "new must not overwrite a plugin: {}",
        printed(&refused)
    );

    let build = wasmjobs(home, &["build", "plugins/greet"], BUILD);
    assert_success(&build, "wasmjobs build");
    let said = printed(&build);
    assert!(
        said.contains("compiling greet.wasm") && said.contains("first run only"),
        "{said}"
    );
    let try_it = String::from_utf8_lossy(&build.stdout)
        .lines()
        .find(|l| l.starts_with("try it: "))
        .unwrap_or_else(|| panic!("build printed no `try it` line: {said}"))
        .to_owned();
    assert!(
        try_it.contains(&format!("wasmjobs exec --plugins {}", home.join("plugins").display())),
        "{try_it}"
    );
    assert!(try_it.contains(class), "{try_it}");

    let mut expected: BTreeSet<String> = sources.iter().map(|s| (*s).to_owned()).collect();
    expected.extend(["wasmjobs.toml".to_owned(), "greet.wasm".to_owned()]);
    assert_eq!(
        files(&home.join("plugins/greet")),
        expected,
        "the plugin directory holds its sources, its manifest and the component, nothing else (no __pycache__, no temporary file)"
    );

    // The line the build printed, as the newcomer would paste it: the
    // component was compiled once, by the build, into the same cache.
    let exec = wasmjobs(home, &["exec", "--plugins", "plugins", class, r#"["world"]"#], QUICK);
    assert_success(&exec, "wasmjobs exec");
    assert!(printed(&exec).contains("hello, world!"), "{}", printed(&exec));
    assert!(
        !printed(&exec).contains("compiling"),
        "exec compiled the component again: {}",
        printed(&exec)
    );

    let wrong = wasmjobs(home, &["exec", "--plugins", "plugins", class, "[42]"], QUICK);
    let said = printed(&wrong);
    assert!(!wrong.status.success(), "[42] must fail: {said}");
    assert!(
        said.contains(&format!("{class} dead")),
        "args of the wrong type are dead: {said}"
    );
    assert!(said.contains(wrong_type), "{said}");

    // Through the queue: enqueue into the embedded Redis (nothing runs yet,
    // and the command says so), then a runner that drains it.
    let enqueue = wasmjobs(home, &["enqueue", class, r#"["runner"]"#], QUICK);
    assert_success(&enqueue, "wasmjobs enqueue");
    assert!(
        String::from_utf8_lossy(&enqueue.stderr).contains("no `wasmjobs run` is using the Redis of"),
        "{}",
        printed(&enqueue)
    );
    let run = wasmjobs(home, &["run", "--plugins", "plugins", "--exit-when-empty"], QUICK);
    assert_success(&run, "wasmjobs run");
    assert!(printed(&run).contains("hello, runner!"), "{}", printed(&run));
}

#[test]
fn a_rust_plugin_from_new_to_run_outside_the_repo() {
    first_plugin(
        "rust",
        "RustGreet",
        &["Cargo.toml", "Cargo.lock", "src/lib.rs"],
        "expected (String,): invalid type: integer `42`",
    );
}

#[test]
fn a_python_plugin_from_new_to_run_outside_the_repo() {
    first_plugin("python", "PyGreet", &["app.py"], "name must be str, got an integer 42");
}

#[test]
fn a_javascript_plugin_from_new_to_run_outside_the_repo() {
    first_plugin("js", "JsGreet", &["job.js"], "arg 1 must be string, got an integer 42");
}
