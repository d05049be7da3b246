//! The point of this crate: Rust programs enqueue jobs without linking the
//! WebAssembly runtime. `cargo tree` lists what a build of the crate links
//! (normal and build dependencies, every feature); none of it may be
//! Wasmtime (or any `wasm*` crate but this one).

use std::process::Command;

#[test]
fn wasmtime_is_not_in_the_dependency_tree() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args([
            "tree",
            "--offline",
            "--all-features",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .args(["--manifest-path", manifest, "-p", "wasmjobs-client"])
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(tree.lines().count() > 10, "an implausibly small tree:\n{tree}");
    assert!(tree.contains("redis v"), "{tree}");
    let wasm: Vec<&str> = tree
        .lines()
        .filter(|line| line.starts_with("wasm") && !line.starts_with("wasmjobs-client "))
        .collect();
    assert!(wasm.is_empty(), "the client links {wasm:?}");
}
