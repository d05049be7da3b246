//! The `wasmjobs` binary, run as a user would.

#[path = "../../tests/src/guests.rs"]
mod guests;

use std::process::{Command, Output};

fn wasmjobs(args: &[&str]) -> Output {
    let data_dir = guests::repo_root().join("target/wasmjobs-test-data");
    Command::new(env!("CARGO_BIN_EXE_wasmjobs"))
        .arg("--data-dir")
        .arg(&data_dir)
        .args(args)
        .output()
        .expect("run wasmjobs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn exec_prints_logs_and_outcome_and_exits_zero_on_success() {
    let plugins = guests::plugins_dir();
    let output = wasmjobs(&[
        "exec",
        "--plugins",
        plugins.to_str().expect("utf-8 path"),
        "FibJob",
        "[20]",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", text(&output));
    assert!(stdout.contains("[info ] fib(20) = 10946"), "{stdout}");
    assert!(stdout.contains("FibJob ok (fib@"), "{stdout}");
    assert!(stdout.contains(" ms"), "{stdout}");
}

#[test]
fn exec_exits_non_zero_on_a_failed_job() {
    let guests = guests::test_guests_dir();
    let output = wasmjobs(&[
        "exec",
        "--plugins",
        guests.join("chaos").to_str().expect("utf-8"),
        "ChaosJob",
        r#"["retry", "later please"]"#,
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("ChaosJob retry: later please"),
        "{}",
        text(&output)
    );

    let output = wasmjobs(&[
        "exec",
        "--plugins",
        guests.join("chaos").to_str().expect("utf-8"),
        "ChaosJob",
        r#"["panic", "kaboom"]"#,
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("kaboom"),
        "{}",
        text(&output)
    );
}

#[test]
fn exec_reports_unknown_classes_and_bad_args_clearly() {
    let plugins = guests::plugins_dir();
    let plugins = plugins.to_str().expect("utf-8");
    let output = wasmjobs(&["exec", "--plugins", plugins, "NoSuchJob"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no plugin") && stderr.contains("NoSuchJob") && stderr.contains("FibJob"),
        "{stderr}"
    );

    let output = wasmjobs(&["exec", "--plugins", plugins, "FibJob", "{\"n\": 1}"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("must be a JSON array"),
        "{}",
        text(&output)
    );
}

#[test]
fn plugins_lists_the_examples_and_flags_broken_ones() {
    let plugins = guests::plugins_dir();
    let output = wasmjobs(&["plugins", "--plugins", plugins.to_str().expect("utf-8")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", text(&output));
    for class in [
        "NoopJob",
        "FibJob",
        "HttpGetJob",
        "FileAppendJob",
        "EchoJob",
        "SqlJob",
        "PgSleepJob",
    ] {
        assert!(stdout.contains(class), "{class} missing from:\n{stdout}");
    }
    assert!(
        stdout.contains("13 plugin(s) implement wasmjobs:job/plugin@0.1.0"),
        "{stdout}"
    );

    let guests = guests::test_guests_dir();
    let output = wasmjobs(&[
        "plugins",
        "--plugins",
        guests.join("not-a-job").to_str().expect("utf-8"),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("1 broken plugin(s)") && stdout.contains("does not implement"),
        "{stdout}"
    );
}
