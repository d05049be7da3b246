//! A first plugin, made the way the README tells a newcomer to: in a
//! directory of their own outside this repository, `wasmjobs new` for each
//! language, `wasmjobs build`, the `wasmjobs exec` line the build prints,
//! then `wasmjobs enqueue` and `wasmjobs run` on the embedded Redis. Real
//! toolchains (cargo, componentize-py, componentize-js), real processes.
//!
//! On the newcomer's machine there is no checkout: every command is an
//! installed copy of the binary, run with the repository hidden (an empty
//! `tmpfs` mounted over it in a mount namespace of the command's own), and
//! its toolchains outside the repository ([`Machine`]). The plugin
//! directory it makes names no path of the machine, and builds again
//! after being moved.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use wasmjobs_e2e::cli::{Killed, command_in, printed};
use wasmjobs_e2e::runner::wasmjobs_bin;
use wasmjobs_e2e::{assert_success, plugins_dir, repo_root};

/// A build installs its toolchain on first use: give it time.
const BUILD: Duration = Duration::from_secs(900);
const QUICK: Duration = Duration::from_secs(120);

/// The newcomer's machine: `wasmjobs` installed outside the repository,
/// toolchains outside it (shared by the tests of this file, installed by
/// the first that needs each).
struct Machine {
    bin: PathBuf,
    toolchains: PathBuf,
}

fn machine() -> &'static Machine {
    static MACHINE: OnceLock<Machine> = OnceLock::new();
    MACHINE.get_or_init(|| {
        // The guests are built first (the repository's own toolchains),
        // so that this file's builds do not race theirs for the CPU.
        let _ = plugins_dir();
        // One place per machine, reused by later runs (a CI machine is
        // fresh; a developer's keeps its toolchains instead of collecting
        // copies of them).
        let root = std::env::temp_dir().join("wasmjobs-newcomer");
        let bin = root.join("bin/wasmjobs");
        std::fs::create_dir_all(root.join("bin")).expect("create the bin directory");
        let copy = root.join(format!("bin/.wasmjobs.{}", std::process::id()));
        std::fs::copy(wasmjobs_bin(), &copy).expect("install wasmjobs");
        std::fs::rename(&copy, &bin).expect("install wasmjobs");
        let toolchains = root.join("toolchains");
        assert!(!bin.starts_with(repo_root()) && !toolchains.starts_with(repo_root()));
        Machine { bin, toolchains }
    })
}

/// The installed wasmjobs, to run in the newcomer's directory with the
/// repository hidden from it.
fn installed() -> Command {
    let machine = machine();
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs tmpfs "$0" && exec "$@""#)
        .arg(repo_root())
        .arg(&machine.bin)
        .env_remove("WASMJOBS_SDK")
        .env_remove("WASMJOBS_DATA_DIR")
        .env_remove("REDIS_URL")
        .env("WASMJOBS_TOOLCHAINS", &machine.toolchains)
        .env("CARGO_TARGET_DIR", "");
    command
}

/// Runs the installed wasmjobs in the newcomer's directory, the
/// repository hidden from it.
fn wasmjobs(home: &Path, args: &[&str], timeout: Duration) -> Output {
    command_in(installed(), home, args, &[] as &[(&str, &str)], timeout)
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
    assert!(
        try_it.contains(r#"'["world"]'"#),
        "the scaffold's [examples] args: {try_it}"
    );

    let mut expected: BTreeSet<String> = sources.iter().map(|s| (*s).to_owned()).collect();
    expected.extend(["wasmjobs.toml".to_owned(), "greet.wasm".to_owned()]);
    assert_eq!(
        files(&home.join("plugins/greet")),
        expected,
        "the plugin directory holds its sources, its manifest and the component, nothing else (no __pycache__, no temporary file)"
    );
    // Nothing in it names a place on this machine: it can be committed.
    for file in sources.iter().chain(&["wasmjobs.toml"]) {
        let text = std::fs::read_to_string(home.join("plugins/greet").join(file)).expect("read a source");
        for place in [home, repo_root().as_path(), machine().toolchains.as_path()] {
            assert!(
                !text.contains(&place.display().to_string()),
                "{file} names {}:\n{text}",
                place.display()
            );
        }
        assert!(
            !text.contains("./wasmjobs-guest"),
            "{file} imports a file that is not there:\n{text}"
        );
    }
    // The SDK was the binary's own, written out under the toolchains.
    let sdks: Vec<_> = std::fs::read_dir(machine().toolchains.join("sdk"))
        .expect("the SDK under the toolchains directory")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| !name.starts_with('.'))
        .collect();
    assert!(
        !sdks.is_empty() && sdks.iter().all(|name| name.starts_with(env!("CARGO_PKG_VERSION"))),
        "{sdks:?}"
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

    // Committed and checked out elsewhere: the sources alone build again.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let moved = elsewhere.path().join("greet");
    std::fs::create_dir_all(&moved).expect("create the new place");
    for file in sources.iter().chain(&["wasmjobs.toml"]) {
        let target = moved.join(file);
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("create a source directory");
        std::fs::copy(home.join("plugins/greet").join(file), target).expect("copy a source");
    }
    let rebuild = wasmjobs(elsewhere.path(), &["build", "greet"], BUILD);
    assert_success(&rebuild, "wasmjobs build of the moved plugin");
    assert!(moved.join("greet.wasm").is_file(), "{}", printed(&rebuild));
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

/// Starts the installed wasmjobs in `home` with `args`, both its streams
/// into `home/<name>.log` in the order they were written; the process
/// (killed when dropped, so a failing test leaves no `build --watch` or
/// runner behind) and a reader of what it has said so far.
fn spawn_logged(home: &Path, args: &[&str], name: &str) -> (Killed, impl Fn() -> String + use<>) {
    let log = home.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let mut command = installed();
    command
        .current_dir(home)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(file.try_clone().expect("log file"))
        .stdout(file);
    let child = command.spawn().expect("start wasmjobs");
    (Killed(child), move || std::fs::read_to_string(&log).unwrap_or_default())
}

/// Waits until what `said` returns satisfies `done`, failing with it after
/// `timeout`.
fn wait_until(what: &str, timeout: Duration, said: &dyn Fn() -> String, done: &dyn Fn(&str) -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done(&said()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {timeout:?}: {what}\n{}",
            said()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many builds a `build --watch` has finished.
fn builds(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("built ")).count()
}

/// `build --watch` builds again after an edit, prints a broken edit's
/// error and keeps watching, and builds the fix.
#[test]
fn build_watch_builds_each_edit_and_outlives_a_broken_one() {
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path();
    // Not `plugins/greet`: the Rust newcomer test builds a crate of that
    // name at the same time into the same shared cargo target directory,
    // where two crates of one name share their output file (the edit's
    // build then read the other build's component).
    let new = wasmjobs(
        home,
        &["new", "rust", "plugins/watched", "--class", "WatchGreet"],
        QUICK,
    );
    assert_success(&new, "wasmjobs new");
    let source = home.join("plugins/watched/src/lib.rs");
    let original = std::fs::read_to_string(&source).expect("lib.rs");
    let (mut watch, said) = spawn_logged(home, &["build", "--watch", "plugins/watched"], "watch");
    let wait = |what: &str, timeout: Duration, done: &dyn Fn(&str) -> bool| wait_until(what, timeout, &said, done);
    let watching = |text: &str| text.lines().filter(|l| l.starts_with("watching ")).count();
    wait("the first build", BUILD, &|t| builds(t) == 1 && watching(t) == 1);

    std::fs::write(&source, original.replace("hello, ", "howdy, ")).expect("edit");
    wait("a build of the edit", BUILD, &|t| builds(t) >= 2 && watching(t) >= 2);
    // Compiling the edit reused the unchanged functions of the first build
    // (what makes the edit loop of a Python or JS job seconds shorter).
    assert!(
        said().contains("functions from its last compile"),
        "the edit's compile reused nothing:\n{}",
        said()
    );
    // Only the first compile is the "first run"; every rebuild said so.
    assert_eq!(
        said().matches("first run only").count(),
        1,
        "the edit's compile said \"first run only\":\n{}",
        said()
    );
    assert!(said().contains("once for this version"), "{}", said());
    let exec = wasmjobs(
        home,
        &["exec", "--plugins", "plugins", "WatchGreet", r#"["world"]"#],
        QUICK,
    );
    assert!(printed(&exec).contains("howdy, world!"), "{}", printed(&exec));

    let built = builds(&said());
    std::fs::write(&source, format!("{original}\nthis is not rust\n")).expect("break it");
    wait("the broken build's error", BUILD, &|t| t.contains("build failed"));
    assert!(
        watch.try_wait().expect("try_wait").is_none(),
        "the watch goes on: {}",
        said()
    );
    assert_eq!(builds(&said()), built, "a failed build replaces nothing");
    std::fs::write(&source, original.replace("hello, ", "hi again, ")).expect("fix it");
    wait("a build of the fix", BUILD, &|t| builds(t) > built);
    let exec = wasmjobs(
        home,
        &["exec", "--plugins", "plugins", "WatchGreet", r#"["world"]"#],
        QUICK,
    );
    assert!(printed(&exec).contains("hi again, world!"), "{}", printed(&exec));
    let _ = watch.kill();
    let _ = watch.wait();
}

/// The Python edit loop a newcomer runs: `build --watch --dev` beside
/// `run --plugins plugins`. The first build makes the development loader
/// (componentize-py, once); an edit then builds with neither
/// componentize-py nor a native compile, the running runner reloads it,
/// and the next job runs the edit, its traceback quoting the edited line.
/// An edit that imports a module the loader lacks builds a new loader.
#[test]
fn a_python_dev_build_runs_each_edit_without_componentize_or_compile() {
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path();
    let new = wasmjobs(
        home,
        &["new", "python", "plugins/devloop", "--class", "DevGreet"],
        QUICK,
    );
    assert_success(&new, "wasmjobs new");
    let app = home.join("plugins/devloop/app.py");
    let original = std::fs::read_to_string(&app).expect("app.py");
    // Warm instances: one runs job after job, importing the app once.
    let manifest = home.join("plugins/devloop/wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("wasmjobs.toml");
    std::fs::write(&manifest, format!("{text}\n[instances]\nreuse = 100\n")).expect("wasmjobs.toml");

    // An edit is saved as many editors save, by renaming a hidden new file
    // over the old one: the watch never sees a half-written file.
    let save = |path: &Path, text: &str| {
        let name = path.file_name().expect("a file name").to_string_lossy();
        let temporary = path.with_file_name(format!(".{name}.new"));
        std::fs::write(&temporary, text).expect("write the edit");
        std::fs::rename(&temporary, path).expect("save the edit");
    };
    // The app's own module is there from the start: the edit below is one
    // save of app.py.
    std::fs::write(
        home.join("plugins/devloop/helpers.py"),
        "def shout(name):\n    return name.upper()\n",
    )
    .expect("write helpers.py");
    let spawn = |args: &[&str], name: &str| spawn_logged(home, args, name);
    let wait = wait_until;

    let (mut watch, watched) = spawn(&["build", "--watch", "--dev", "plugins/devloop"], "watch");
    wait("the first build", BUILD, &watched, &|t| builds(t) == 1);
    // The loader is built once per machine for these imports (this test
    // run again finds it built).
    assert!(
        (watched().contains("building the development loader for 2 import(s)")
            || watched().contains("loader for its 2 import(s) is built already"))
            && watched().contains("a development build)"),
        "{}",
        watched()
    );
    let (mut run, ran) = spawn(&["run", "--plugins", "plugins"], "run");
    let enqueue = |args: &str| {
        let out = wasmjobs(home, &["enqueue", "DevGreet", args], QUICK);
        assert_success(&out, "wasmjobs enqueue");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let jid = said.split("(jid ").nth(1).and_then(|rest| rest.split(')').next());
        jid.unwrap_or_else(|| panic!("no jid in {said}")).to_owned()
    };
    enqueue(r#"["one"]"#);
    wait("the first job", QUICK, &ran, &|t| t.contains("hello, one!"));
    assert!(ran().contains("a development build"), "the runner says so: {}", ran());

    // An edit that uses the app's own module.
    let edited = original
        .replace(
            "from wasmjobs_guest import",
            "from helpers import shout\nfrom wasmjobs_guest import",
        )
        .replace(
            r#"    log.info(f"hello, {name}! (job {info.jid})")"#,
            "    if name == \"boom\":\n        raise ValueError(\"kaboom \" + shout(name))\n    log.info(f\"howdy, {shout(name)}!\")",
        );
    assert_ne!(edited, original, "the scaffold changed: update this test");
    let first_len = watched().len();
    save(&app, &edited);
    wait("a build of the edit", BUILD, &watched, &|t| builds(t) >= 2);
    let second = watched();
    let second = &second[first_len..];
    assert!(
        !second.contains("componentize-py") && !second.contains("compiling"),
        "the edit ran componentize-py or compiled:\n{second}"
    );
    assert!(
        second.contains("loader for its 2 import(s) is built already"),
        "{second}"
    );
    // The runner reloads the new file (a job enqueued before that runs
    // the version it had).
    let replaced = |text: &str| text.matches("plugin replaced").count();
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 1);
    enqueue(r#"["two"]"#);
    wait("the edited job", QUICK, &ran, &|t| t.contains("howdy, TWO!"));
    enqueue(r#"["boom"]"#);
    wait("the edited job's traceback", QUICK, &ran, &|t| {
        t.contains(r#"raise ValueError("kaboom " + shout(name))"#)
    });
    assert!(ran().contains("/.wasmjobs/app/app.py"), "{}", ran());

    // A module the loader has not imported: a new loader.
    let built = builds(&watched());
    let before = watched().len();
    save(
        &app,
        &format!(
            "import csv\nimport io\n{}",
            edited.replace(
                r#"log.info(f"howdy, {shout(name)}!")"#,
                "row = io.StringIO()\n    csv.writer(row).writerow([name, shout(name)])\n    log.info(f\"csv row {row.getvalue().strip()}\")"
            )
        ),
    );
    wait("a build with a new import", BUILD, &watched, &|t| builds(t) > built);
    let third = watched();
    let third = &third[before..];
    assert!(
        third.contains("building the development loader for 4 import(s)")
            || third.contains("loader for its 4 import(s) is built already"),
        "csv and io make a loader of 4 imports: {third}"
    );
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 2);
    enqueue(r#"["three"]"#);
    wait("the job using csv", QUICK, &ran, &|t| t.contains("csv row three,THREE"));

    // An `async def` job in the plain world is dead with the reason on
    // an instance's first job too (where the app is imported).
    let built = builds(&watched());
    save(&app, &original.replace("def perform", "async def perform"));
    wait("a build of the async job", BUILD, &watched, &|t| builds(t) > built);
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 3);
    let four = enqueue(r#"["four"]"#);
    wait("the async job's outcome", QUICK, &ran, &|t| {
        t.lines()
            .any(|l| l.contains(&four) && l.contains("dead") && l.contains("is an async def"))
    });

    // An app whose import fails after its @job registered: each job on the
    // warm instance tries again and fails the same way.
    let built = builds(&watched());
    save(&app, &format!("{original}\nraise RuntimeError(\"broken at import\")\n"));
    wait("a build of the broken app", BUILD, &watched, &|t| builds(t) > built);
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 4);
    for args in [r#"["five"]"#, r#"["six"]"#] {
        let jid = enqueue(args);
        wait("the broken app's job", QUICK, &ran, &|t| {
            t.lines()
                .any(|l| l.contains(&jid) && l.contains("job failed") && l.contains("broken at import"))
        });
    }
    assert!(
        !ran().contains("already registered"),
        "the second import hid the error: {}",
        ran()
    );

    // Python's own urllib has no socket in a job: the failure names the
    // client that works (it said only `LookupError: unknown encoding:
    // idna`, then `[Errno -4]`).
    let built = builds(&watched());
    save(
        &app,
        &format!(
            "import urllib.request\n{}",
            original.replace(
                r#"    log.info(f"hello, {name}! (job {info.jid})")"#,
                "    urllib.request.urlopen(\"http://example.com/\", timeout=5).read()",
            )
        ),
    );
    wait("a build of the urllib job", BUILD, &watched, &|t| builds(t) > built);
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 5);
    assert!(!ran().contains("wasmjobs_guest.http"), "{}", ran());
    let nine = enqueue(r#"["nine"]"#);
    wait("the urllib job's failure", QUICK, &ran, &|t| {
        t.contains(&nine) && t.contains("wasmjobs_guest.http")
    });
    assert!(ran().contains("urlopen"), "the traceback names the call: {}", ran());

    // A syntax error fails the build, as a release build's does: the
    // runner keeps the last good component (it used to get the broken
    // file, and every job failed with SyntaxError).
    let built = builds(&watched());
    save(&app, &original);
    wait("a build of the repaired app", BUILD, &watched, &|t| builds(t) > built);
    wait("the runner's reload", QUICK, &ran, &|t| replaced(t) >= 6);
    enqueue(r#"["seven"]"#);
    wait("the repaired job", QUICK, &ran, &|t| t.contains("hello, seven!"));
    let failed = |text: &str| text.matches("build failed").count();
    let failures = failed(&watched());
    save(&app, &original.replace("def perform", "def perform(:"));
    wait("the build of the syntax error", BUILD, &watched, &|t| {
        failed(t) > failures
    });
    assert!(
        watched().contains("app.py:") && watched().contains("SyntaxError"),
        "{}",
        watched()
    );
    enqueue(r#"["eight"]"#);
    wait("a job on the last good build", QUICK, &ran, &|t| {
        t.contains("hello, eight!")
    });
    assert_eq!(replaced(&ran()), 6, "the broken build reached the runner: {}", ran());

    let _ = watch.kill();
    let _ = watch.wait();
    let stop = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("kill");
    assert!(stop.success());
    let stopped = run.wait().expect("the runner stops");
    assert!(stopped.success(), "{}", ran());
    assert_eq!(
        files(&home.join("plugins/devloop")),
        ["app.py", "helpers.py", "wasmjobs.toml", "devloop.wasm"]
            .into_iter()
            .map(str::to_owned)
            .collect(),
        "nothing but sources, the manifest and the component"
    );
}

/// Scaffolding a plugin beside a running runner logged an ERROR naming
/// `scripts/build-plugins.sh`, a script a user of the installed binary
/// does not have: a plugin not built yet now waits, and the runner says
/// which command builds it. The runner's data directory is found from
/// `--plugins` given from another directory (a new `.wasmjobs` was made
/// wherever the command ran).
#[test]
fn a_scaffolded_plugin_waits_for_its_build_without_an_error() {
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path();
    let project = home.join("app");
    std::fs::create_dir_all(project.join("plugins")).expect("plugins dir");
    std::fs::create_dir_all(project.join(".wasmjobs")).expect("the project's data dir");
    let elsewhere = home.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("another dir");
    let plugins = project.join("plugins");
    let plugins = plugins.to_str().expect("a UTF-8 path");
    let (mut run, ran) = spawn_logged(&elsewhere, &["run", "--plugins", plugins], "run");
    wait_until("the runner", QUICK, &ran, &|t| t.contains("running"));
    assert!(
        !elsewhere.join(".wasmjobs").exists(),
        "a data directory was made where the command ran:\n{}",
        ran()
    );
    assert!(project.join(".wasmjobs/redis").is_dir(), "{}", ran());
    let new = wasmjobs(
        &project,
        &["new", "python", "plugins/late", "--class", "LateJob"],
        QUICK,
    );
    assert_success(&new, "wasmjobs new");
    wait_until("the waiting plugin", QUICK, &ran, &|t| t.contains("plugin waiting"));
    let log = ran();
    assert!(
        log.contains("wasmjobs build ") && log.contains("is not built yet"),
        "{log}"
    );
    assert!(!log.contains("ERROR") && !log.contains("build-plugins.sh"), "{log}");
    let stop = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("kill");
    assert!(stop.success());
    assert!(run.wait().expect("the runner stops").success(), "{}", ran());
}

/// The children of process `pid`, with their command names.
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map(|(_, n)| n.to_owned()).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) && fields.first() != Some(&"Z") {
            found.push((child, name));
        }
    }
    found
}

/// Stopping `build --watch` in the middle of a build left componentize-py
/// running and its 19 MB temporary component in the plugin directory: the
/// tools are now killed with the build and the temporary removed.
#[test]
fn stopping_a_watch_mid_build_leaves_no_tool_and_no_temporary_file() {
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path();
    let new = wasmjobs(home, &["new", "python", "plugins/stopped", "--class", "StopJob"], QUICK);
    assert_success(&new, "wasmjobs new");
    let (mut watch, said) = spawn_logged(home, &["build", "--watch", "plugins/stopped"], "watch");
    let deadline = std::time::Instant::now() + BUILD;
    let tool = loop {
        if let Some(tool) = children(watch.id())
            .into_iter()
            .find(|(_, name)| name.starts_with("componentize"))
        {
            break tool;
        }
        assert!(
            watch.try_wait().expect("try_wait").is_none(),
            "the watch ended: {}",
            said()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no componentize-py started: {}",
            said()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stop = Command::new("kill")
        .args(["-TERM", &watch.id().to_string()])
        .status()
        .expect("kill");
    assert!(stop.success());
    let status = watch.wait().expect("the watch stops");
    assert_eq!(status.code(), Some(143), "{}", said());
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(tool.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "{} ({}) still runs after the watch stopped",
            tool.1,
            tool.0
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<String> = files(&home.join("plugins/stopped"))
        .into_iter()
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "left in the plugin directory: {left:?}");
}
