//! One Redis per project, whichever directory of it a command runs in.
//!
//! A newcomer's project outside the repository: `wasmjobs run --plugins
//! ./plugins` in it, then `stats`, `enqueue` and `env` from a plugin's
//! directory below, and a Ruby app's Sidekiq client pointed at the
//! `REDIS_URL` that `wasmjobs env` prints. Every command finds the
//! project's `.wasmjobs` up the tree (none is made below it), and a
//! command run where there is no project says it starts a new, empty
//! Redis.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use wasmjobs_e2e::cli::{command_in, printed};
use wasmjobs_e2e::runner::Runner;
use wasmjobs_e2e::sidekiq::ruby;
use wasmjobs_e2e::{assert_success, plugins_dir, repo_root};

const QUICK: Duration = Duration::from_secs(120);

/// Runs a command in `cwd` as the newcomer types it: none of the test
/// environment's Redis or data directory settings.
fn wasmjobs(cwd: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(wasmjobs_e2e::runner::wasmjobs_bin());
    command.env_remove("WASMJOBS_DATA_DIR").env_remove("REDIS_URL");
    let none: [(&str, &str); 0] = [];
    command_in(command, cwd, args, &none, QUICK)
}

/// Waits for `what` until `deadline`, panicking with `context()` then.
fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool, context: impl Fn() -> String) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `export NAME='value'` in `wasmjobs env`'s output.
fn exported(env: &str, name: &str) -> String {
    let prefix = format!("export {name}='");
    env.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no {name} in:\n{env}"))
        .to_owned()
}

#[test]
fn every_directory_of_a_project_uses_its_one_embedded_redis() {
    let home = tempfile::tempdir().expect("tempdir");
    let project = home.path().join("app");
    assert!(!project.starts_with(repo_root()));
    let noop = project.join("plugins/noop");
    std::fs::create_dir_all(&noop).expect("create the plugin directory");
    for file in ["wasmjobs.toml", "noop_job.wasm"] {
        std::fs::copy(plugins_dir().join("noop").join(file), noop.join(file)).expect("copy the noop plugin");
    }

    let mut run = Runner::start_as_user(&project, &["run", "--plugins", "./plugins"]);
    let socket = project.join(".wasmjobs/redis/redis.sock");
    run.wait_for_log("running identity=", QUICK);
    // The first command in a project makes its data directory, and says so.
    assert!(
        run.log().contains("starting a new, empty embedded Redis"),
        "{}",
        run.log()
    );

    // From the plugin's directory, two levels down: the project's Redis.
    let env = wasmjobs(&noop, &["env"]);
    assert_success(&env, "wasmjobs env");
    let env = String::from_utf8_lossy(&env.stdout).into_owned();
    let url = exported(&env, "REDIS_URL");
    assert_eq!(
        url,
        format!("unix://{}", socket.canonicalize().expect("the socket").display()),
        "{env}"
    );
    assert!(env.contains("running now"), "{env}");

    let enqueue = wasmjobs(&noop, &["enqueue", "NoopJob", "[1]"]);
    assert_success(&enqueue, "wasmjobs enqueue");
    // A Ruby app, pointed at the printed URL.
    let jid = ruby(
        &url,
        r#"puts Sidekiq::Client.push("class" => "NoopJob", "args" => [2])"#,
    );
    assert_eq!(jid.len(), 24, "{jid}");

    until(
        "both jobs to run",
        QUICK,
        || {
            let stats = wasmjobs(&noop, &["stats"]);
            printed(&stats).contains("processed 2 ")
        },
        || format!("{}\n{}", printed(&wasmjobs(&noop, &["stats"])), run.log()),
    );
    let stats = wasmjobs(&noop, &["stats"]);
    let said = printed(&stats);
    assert!(
        said.contains(&socket.canonicalize().expect("socket").display().to_string()),
        "{said}"
    );
    assert!(!said.contains("no .wasmjobs directory"), "{said}");
    for below in [project.join("plugins"), noop.clone()] {
        assert!(
            !below.join(".wasmjobs").exists(),
            "a data directory was made in {}",
            below.display()
        );
    }

    // Where there is no project, a command says it starts a new Redis.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let fresh = wasmjobs(elsewhere.path(), &["stats"]);
    assert_success(&fresh, "wasmjobs stats elsewhere");
    let said = String::from_utf8_lossy(&fresh.stderr);
    assert!(said.contains("starting a new, empty embedded Redis"), "{said}");
    assert!(
        said.contains(&elsewhere.path().join(".wasmjobs").display().to_string()),
        "{said}"
    );
    assert!(printed(&fresh).contains("processed 0 "), "{}", printed(&fresh));
}
