//! Every package a user depends on is ready to publish under its
//! ecosystem's conventions, at the version of the `wasmjobs` binary:
//! `cargo publish --dry-run` for the guest SDK (`wasmjobs-guest`, with its
//! WIT inside) and the producer crate (`wasmjobs-client`), a wheel of the
//! Python SDK, `npm pack` of the JavaScript SDK with its TypeScript types.
//! The package registries are reached (the dry runs resolve and build
//! against crates.io; the wheel's build backend comes from PyPI).

use std::path::Path;
use std::process::{Command, Output};

use wasmjobs_e2e::{assert_success, repo_root};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn run(command: &mut Command, what: &str) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    assert_success(&output, what);
    output
}

/// `cargo publish --dry-run` of `package` in the workspace of `manifest`,
/// building in a directory of its own (the test run holds `target/`).
fn publish_dry_run(manifest: &Path, package: &str) -> String {
    let target = tempfile::tempdir().expect("tempdir");
    let list = run(
        Command::new("cargo")
            .args(["package", "--list", "--allow-dirty", "-p", package, "--manifest-path"])
            .arg(manifest)
            .env("CARGO_TARGET_DIR", target.path()),
        "cargo package --list",
    );
    run(
        Command::new("cargo")
            .args([
                "publish",
                "--dry-run",
                "--allow-dirty",
                "-p",
                package,
                "--manifest-path",
            ])
            .arg(manifest)
            .env("CARGO_TARGET_DIR", target.path()),
        "cargo publish --dry-run",
    );
    String::from_utf8_lossy(&list.stdout).into_owned()
}

#[test]
fn the_rust_guest_sdk_publishes_with_its_wit_at_the_binarys_version() {
    let root = repo_root();
    let files = publish_dry_run(&root.join("plugins/Cargo.toml"), "wasmjobs-guest");
    for needed in [
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "wit/job.wit",
        "wit/deps/http/package.wit",
    ] {
        assert!(files.lines().any(|f| f == needed), "{needed} is not packaged:\n{files}");
    }
    assert!(!files.contains("node_modules") && !files.contains("python/"), "{files}");
    let manifest = std::fs::read_to_string(root.join("guest-sdk/Cargo.toml")).expect("guest-sdk/Cargo.toml");
    assert!(
        manifest.contains(&format!("\nversion = \"{VERSION}\"\n")),
        "the guest SDK's version is not the binary's {VERSION}"
    );
}

#[test]
fn the_client_crate_publishes() {
    let files = publish_dry_run(&repo_root().join("Cargo.toml"), "wasmjobs-client");
    assert!(files.lines().any(|f| f == "src/lib.rs"), "{files}");
}

#[test]
fn the_python_sdk_builds_as_a_wheel() {
    // From a copy: an in-tree build would leave build/ and *.egg-info in
    // the checkout.
    let copy = tempfile::tempdir().expect("tempdir");
    let source = copy.path().join("python");
    copy_sources(&repo_root().join("guest-sdk/python"), &source);
    let wheels = copy.path().join("dist");
    // A virtualenv's pip (the machine's python3 may have none; venv it has:
    // componentize-py is installed into one).
    let venv = copy.path().join("venv");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(venv.join("bin/pip"))
            .args(["wheel", "--no-deps", "--disable-pip-version-check", "--quiet", "-w"])
            .arg(&wheels)
            .arg(&source),
        "pip wheel",
    );
    let wheel = wheels.join(format!("wasmjobs_guest-{VERSION}-py3-none-any.whl"));
    assert!(wheel.is_file(), "no {}", wheel.display());
    let listing = run(
        Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
            ])
            .arg(&wheel),
        "list the wheel",
    );
    let listing = String::from_utf8_lossy(&listing.stdout);
    for module in ["__init__", "activejob", "http", "log", "sql"] {
        assert!(
            listing.contains(&format!("wasmjobs_guest/{module}.py")),
            "{module}.py missing:\n{listing}"
        );
    }
}

#[test]
fn the_javascript_sdk_packs_with_its_types() {
    let js = repo_root().join("guest-sdk/js");
    let packed = run(
        Command::new("npm")
            .args(["pack", "--dry-run", "--json", "--loglevel=error"])
            .current_dir(&js),
        "npm pack --dry-run",
    );
    let packed: serde_json::Value = serde_json::from_slice(&packed.stdout).expect("npm pack's JSON");
    let package = &packed[0];
    assert_eq!(package["name"], "wasmjobs-guest");
    assert_eq!(package["version"], VERSION);
    let files: Vec<&str> = package["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for needed in [
        "wasmjobs-guest.js",
        "wasmjobs-guest.d.ts",
        "build.mjs",
        "README.md",
        "package.json",
    ] {
        assert!(files.contains(&needed), "{needed} is not packed: {files:?}");
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(js.join("package.json")).expect("package.json"))
            .expect("package.json is JSON");
    assert_eq!(manifest["exports"]["."]["types"], "./wasmjobs-guest.d.ts");
    // The build tools are not what a plugin depends on.
    assert!(manifest.get("dependencies").is_none(), "{manifest}");
}

/// Copies `from` to `to`, leaving out caches.
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("read a directory") {
        let entry = entry.expect("an entry");
        let name = entry.file_name();
        if name == "__pycache__" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).expect("copy a file");
        }
    }
}
