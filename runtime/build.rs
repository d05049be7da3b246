//! Packs the guest SDK and the WIT contract into the binary, so that
//! `wasmjobs new` and `wasmjobs build` work on any machine with this
//! binary alone (see `src/cli/sdk.rs`, which writes them out on first use).
//!
//! Writes `$OUT_DIR/sdk_files.rs`: `SDK_FILES`, every file as
//! `(path under the SDK root, include_bytes!(…))`, and `SDK_DIGEST`, a
//! digest of them all that names the directory they are written to. The
//! layout is the published crate's: `Cargo.toml`, `src/`, `wit/` (the
//! repository's `wit/`), plus `python/` and `js/` (their sources only:
//! no `node_modules`, caches or build output).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.join("..");
    let sdk = root.join("guest-sdk");
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for name in ["Cargo.toml", "README.md"] {
        files.push((name.into(), sdk.join(name)));
    }
    for (dir, under, keep) in [
        (sdk.join("src"), "src", &["rs"][..]),
        (root.join("wit"), "wit", &["wit"][..]),
        (sdk.join("python"), "python", &["py", "md", "toml", "typed"][..]),
    ] {
        println!("cargo::rerun-if-changed={}", dir.display());
        walk(&dir, &dir, under, keep, &mut files);
    }
    for name in [
        "wasmjobs-guest.js",
        "wasmjobs-guest.d.ts",
        "build.mjs",
        "package.json",
        "package-lock.json",
        "README.md",
    ] {
        files.push((format!("js/{name}"), sdk.join("js").join(name)));
    }
    for (_, path) in &files {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    files.sort();

    // FNV-1a over every path and content: names the unpacked copy, so a
    // binary with other SDK files never uses this one's.
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    let mut code = String::from("pub(crate) static SDK_FILES: &[(&str, &[u8])] = &[\n");
    for (name, path) in &files {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        for byte in name.bytes().chain([0]).chain(bytes.iter().copied()) {
            digest = (digest ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        let path = path
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        writeln!(
            code,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .expect("write");
    }
    code.push_str("];\n");
    writeln!(code, "pub(crate) const SDK_DIGEST: &str = \"{digest:016x}\";").expect("write");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("sdk_files.rs");
    std::fs::write(&out, code).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// Adds the files under `dir` whose extension is in `keep` to `files`, as
/// `under/<path relative to base>`, leaving out caches and build output.
fn walk(base: &Path, dir: &Path, under: &str, keep: &[&str], files: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') || matches!(name, "__pycache__" | "node_modules" | "target" | "dist" | "build") {
            continue;
        }
        if path.is_dir() {
            walk(base, &path, under, keep, files);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| keep.contains(&e))
        {
            let relative = path.strip_prefix(base).expect("under base");
            let relative: Vec<_> = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect();
            files.push((format!("{under}/{}", relative.join("/")), path));
        }
    }
}
