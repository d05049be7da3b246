//! Every code block of the README, the SDK READMEs and docs/activejob.md, compiled, built or
//! parsed the way a reader would use it, so a snippet cannot rot:
//!
//! - `rust`: a block with `export_job!` is a plugin's whole `src/lib.rs`,
//!   and so is one with `export_async_job!`, whose manifest gets
//!   `[instances] concurrent` (the async-plugin world runs only so); any
//!   other block is items added to one (`wasmjobs new rust`), then
//!   `wasmjobs build`;
//! - `python` / `js`: a plugin's `app.py` / `job.js`, built with `wasmjobs
//!   build` (componentize-py imports the module, componentize-js evaluates
//!   it); a Python `async def perform` gets `[instances] concurrent`, so it
//!   is built for the async-plugin world;
//! - `toml`: a plugin manifest, validated as the runner does;
//! - `sh`: every `wasmjobs ...` line parses as a command line of this
//!   binary, and every `./scripts/...` it names exists.
//!
//! Toolchains and the Rust target directory: [`toolchain_env`].

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use clap::Parser;
use wasmjobs::cli::Cli;
use wasmjobs::plugin::Manifest;
use wasmjobs_e2e::cli::{printed, toolchain_env, wasmjobs_in};
use wasmjobs_e2e::{assert_success, repo_root};

/// The documents whose snippets are checked.
const DOCUMENTS: [&str; 4] = [
    "README.md",
    "guest-sdk/python/README.md",
    "guest-sdk/js/README.md",
    "docs/activejob.md",
];

/// A fenced code block: its language, first line number and text.
#[derive(Debug)]
struct Block {
    language: String,
    at: String,
    code: String,
}

/// The fenced code blocks of `document` (relative to the repository).
fn blocks(document: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo_root().join(document)).expect("read document");
    let mut found = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(language)) => open = Some((language.trim().to_owned(), number + 2, String::new())),
            (Some(_), Some(_)) => {
                let (language, first, code) = open.take().expect("open block");
                found.push(Block {
                    language,
                    at: format!("{document}:{first}"),
                    code,
                });
            }
            (Some((_, _, code)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{document}: a code block is not closed");
    found
}

/// Every block in [`DOCUMENTS`] in `language`.
fn snippets(language: &str) -> Vec<Block> {
    DOCUMENTS
        .iter()
        .flat_map(|d| blocks(d))
        .filter(|b| b.language == language)
        .collect()
}

fn wasmjobs(home: &Path, args: &[&str]) -> Output {
    wasmjobs_in(home, args, &toolchain_env(), Duration::from_secs(900))
}

/// `wasmjobs new LANGUAGE DIR` in `home`; the plugin directory.
fn new_plugin(home: &Path, language: &str, name: &str) -> PathBuf {
    let new = wasmjobs(home, &["new", language, name, "--class", "Snippet"]);
    assert_success(&new, "wasmjobs new");
    home.join(name)
}

/// Builds `dir`, failing with the snippet's place when it does not build.
fn build(home: &Path, dir: &Path, snippet: &str) {
    let build = wasmjobs(home, &["build", dir.to_str().expect("utf-8 path")]);
    assert!(
        build.status.success(),
        "the snippet at {snippet} does not build:\n{}",
        printed(&build)
    );
}

#[test]
fn the_shell_lines_are_command_lines_of_this_wasmjobs() {
    let mut checked = 0;
    for block in snippets("sh") {
        for line in block.code.lines() {
            let words = shlex::split(line).unwrap_or_else(|| panic!("{}: cannot split {line:?}", block.at));
            let words: Vec<&str> = words.iter().map(String::as_str).filter(|w| *w != "&").collect();
            match words.first() {
                Some(&"wasmjobs") => {
                    if let Err(err) = Cli::try_parse_from(&words) {
                        panic!("{}: `{line}` is not a wasmjobs command line:\n{err}", block.at);
                    }
                    checked += 1;
                }
                Some(script) if script.starts_with("./scripts/") => {
                    let path = repo_root().join(script);
                    assert!(path.is_file(), "{}: {script} does not exist", block.at);
                    checked += 1;
                }
                _ => {}
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} command lines found: is the parser broken?"
    );
}

#[test]
fn the_manifests_are_valid() {
    let manifests = snippets("toml");
    assert!(!manifests.is_empty(), "the README shows a manifest");
    for block in manifests {
        let path = Path::new("/plugins/example/wasmjobs.toml");
        if let Err(err) = Manifest::parse(path, &block.code) {
            panic!("the manifest at {} is refused: {err:#}", block.at);
        }
    }
}

#[test]
fn the_rust_snippets_build() {
    let home = tempfile::tempdir().expect("tempdir");
    let rust = snippets("rust");
    assert!(rust.len() >= 2, "{rust:?}");
    // Fragments (items) go into the template's lib.rs, each in a module.
    let fragments = new_plugin(home.path(), "rust", "fragments");
    let lib = fragments.join("src/lib.rs");
    let mut with_fragments = std::fs::read_to_string(&lib).expect("read lib.rs");
    let mut places = Vec::new();
    for (i, block) in rust.iter().enumerate() {
        if block.code.contains("export_job!") || block.code.contains("export_async_job!") {
            let dir = new_plugin(home.path(), "rust", &format!("whole{i}"));
            std::fs::write(dir.join("src/lib.rs"), &block.code).expect("write lib.rs");
            if block.code.contains("export_async_job!") {
                run_concurrently(&dir);
            }
            build(home.path(), &dir, &block.at);
        } else {
            with_fragments.push_str(&format!(
                "\n// {}\n#[allow(dead_code)]\nmod snippet{i} {{\n{}}}\n",
                block.at, block.code
            ));
            places.push(block.at.clone());
        }
    }
    std::fs::write(&lib, with_fragments).expect("write lib.rs");
    build(home.path(), &fragments, &places.join(", "));
}

/// Adds `[instances] concurrent` to the manifest of the plugin in `dir`:
/// an async job runs only so.
fn run_concurrently(dir: &Path) {
    wasmjobs_e2e::append_to_manifest(dir, "[instances]\nconcurrent = 4");
}

/// Builds every `language` snippet as the `file` of its own plugin.
fn build_each(language: &str, new_as: &str, file: &str) {
    let home = tempfile::tempdir().expect("tempdir");
    let blocks = snippets(language);
    assert!(
        blocks.len() >= 2,
        "the README and the SDK README each show one: {blocks:?}"
    );
    for (i, block) in blocks.iter().enumerate() {
        let dir = new_plugin(home.path(), new_as, &format!("snippet{i}"));
        std::fs::write(dir.join(file), &block.code).expect("write the snippet");
        if language == "python" && block.code.contains("async def perform") {
            // An `async def` job runs in the async-plugin world, which
            // `wasmjobs build` picks from `[instances] concurrent`.
            run_concurrently(&dir);
        }
        build(home.path(), &dir, &block.at);
    }
}

#[test]
fn the_python_snippets_build() {
    build_each("python", "python", "app.py");
}

#[test]
fn the_javascript_snippets_build() {
    build_each("js", "js", "job.js");
}
