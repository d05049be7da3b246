//! `wasmjobs build --dev DIR`: a Python plugin as a development build,
//! for the edit loop.
//!
//! A release build runs componentize-py on the app, which snapshots the
//! interpreter after importing it (~8 s) and gives a component the host
//! compiles again (~2 s): every edit pays both. A development build keeps
//! the interpreter apart from the app:
//!
//! 1. The app's `.py` files are read, and the modules they import at
//!    module level (what the snapshot of a release build would hold) are
//!    listed by Python's own parser ([`SCAN`]), leaving out the app's own.
//! 2. A *loader* is componentized for that list, the SDK and the world, and
//!    kept under the toolchains directory by a digest of all of them
//!    ([`loader`]): it imports those modules into its snapshot and, on an
//!    instance's first job, the app from `/.wasmjobs/app`
//!    (`wasmjobs_guest/_dev.py`).
//! 3. The component is the loader with the app's files appended as a
//!    custom section (`plugin::dev_sources`), which the engine does not
//!    compile: the compile cache has the loader already, and the runner
//!    unpacks the files and grants them read-only.
//!
//! So an edit that imports nothing new costs reading the sources, one
//! parse and one copy; an edit that imports a new module builds a new
//! loader, as slow as a release build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::sdk::{self, Sdk};
use crate::plugin::dev_sources::{self, DevSources};

/// How many loaders the toolchains directory keeps (those used last; ~19 MB each).
const LOADERS_KEPT: usize = 6;

/// Lists the modules the sources given on stdin import at module level
/// (not in a function body, which runs only in a job, when a release build
/// would not have the module either), leaving out the app's own, and the
/// files this Python cannot parse: `{"imports": [...], "errors": [...]}`.
/// A file with a syntax error fails the build (a release build fails on
/// it too, in componentize-py), so `--watch` keeps the last good component
/// instead of handing the runner one whose every job fails.
const SCAN: &str = r#"
import ast, importlib.util, json, sys

request = json.load(sys.stdin)
local = set(request["local"])
sys.path[:0] = request["path"]
found = set()

def submodule(package, name):
    try:
        spec = importlib.util.find_spec(package)
    except Exception:
        return True
    if spec is None:
        return True
    places = spec.submodule_search_locations or []
    import os
    return any(os.path.exists(os.path.join(p, name + ".py")) or os.path.isdir(os.path.join(p, name)) for p in places) or f"{package}.{name}" in sys.builtin_module_names

def add(name):
    if name.split(".")[0] not in local:
        found.add(name)

def visit(body):
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                add(node.module)
                for alias in node.names:
                    if alias.name != "*" and node.module.split(".")[0] not in local and submodule(node.module, alias.name):
                        add(f"{node.module}.{alias.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                value = getattr(node, field, None)
                if isinstance(value, list):
                    visit(value)

errors = []
for name, text in request["files"].items():
    try:
        visit(ast.parse(text, filename=name).body)
    except SyntaxError as error:
        line = (error.text or "").rstrip("\n")
        errors.append(f"{name}:{error.lineno}:{error.offset or 0}: SyntaxError: {error.msg}" + (f"\n    {line}" if line.strip() else ""))

json.dump({"imports": sorted(found), "errors": errors, "python": sys.version.split()[0]}, sys.stdout)
"#;

/// Builds the plugin in `dir` for `world` as a development build at `out`.
pub(super) fn build(dir: &Path, sdk: &Sdk, world: &str, out: &Path) -> Result<()> {
    let files = read_sources(dir)?;
    let imports = scan(&files, &sdk.python())?;
    let loader = loader(sdk, world, &imports)?;
    let mut bytes = std::fs::read(&loader).with_context(|| format!("cannot read {}", loader.display()))?;
    let sources = DevSources::new(files).context("the plugin's sources cannot travel in a development build")?;
    dev_sources::append(&mut bytes, &sources)?;
    std::fs::write(out, &bytes).with_context(|| format!("cannot write {}", out.display()))
}

/// The plugin's `.py` files by path relative to `dir` (`/`-separated),
/// leaving out build output, caches and hidden files, as a release build's
/// staging and `--watch` do.
fn read_sources(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in super::sources::visible_sources(dir) {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        if !entry.file_type().is_file() || entry.path().extension().is_none_or(|e| e != "py") {
            continue;
        }
        let relative = entry.path().strip_prefix(dir).context("a path outside the plugin")?;
        let name = relative
            .to_str()
            .with_context(|| format!("{}: a file name that is not UTF-8", entry.path().display()))?
            .to_owned();
        let bytes = std::fs::read(entry.path()).with_context(|| format!("cannot read {}", entry.path().display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|e| anyhow::anyhow!("{}: not UTF-8 ({})", entry.path().display(), e.utf8_error()))?;
        files.insert(name, text);
    }
    if !files.contains_key("app.py") {
        bail!("{}: no app.py", dir.display());
    }
    Ok(files)
}

/// The top-level names of the app's own modules: its `.py` files and
/// package directories.
fn local_modules(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut local: Vec<String> = files
        .keys()
        .map(|name| match name.split_once('/') {
            Some((package, _)) => package.to_owned(),
            None => name.trim_end_matches(".py").to_owned(),
        })
        .collect();
    local.dedup();
    local
}

/// The modules the sources import at module level, by [`SCAN`] (which
/// finds submodules of the SDK at `sdk_python`, and of the standard
/// library, by where their files are).
fn scan(files: &BTreeMap<String, String>, sdk_python: &Path) -> Result<Vec<String>> {
    let request = serde_json::json!({
        "local": local_modules(files),
        "path": [sdk_python.to_string_lossy()],
        "files": files,
    });
    let mut child = super::build_stop::die_with_us(&mut Command::new("python3"))
        .args(["-I", "-B", "-c", SCAN])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot run python3 to read the app's imports")?;
    let mut stdin = child.stdin.take().context("python3 has no stdin")?;
    let text = request.to_string();
    // Written from a thread: python3 may start writing before it has read
    // everything, and a full pipe each way would block both.
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, text.as_bytes()));
    let output = child.wait_with_output().context("python3 failed")?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer to python3 panicked"))?
        .context("cannot send the sources to python3")?;
    if !output.status.success() {
        bail!("python3 could not read the app's imports ({})", output.status);
    }
    #[derive(serde::Deserialize)]
    struct Scanned {
        imports: Vec<String>,
        errors: Vec<String>,
        python: String,
    }
    let scanned: Scanned = serde_json::from_slice(&output.stdout).context("python3 answered something else")?;
    if !scanned.errors.is_empty() {
        bail!(
            "the app does not parse (python3 {}), so the last good build stays in place:\n{}\n(a release build, without --dev, takes syntax newer than this python3)",
            scanned.python,
            scanned.errors.join("\n")
        );
    }
    let names = scanned.imports;
    if let Some(bad) = names.iter().find(|n| !is_module_name(n)) {
        bail!("python3 listed {bad:?} as a module");
    }
    Ok(names)
}

/// A dotted Python identifier.
fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            part.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

/// The loader's Python module: pre-imports `imports`, then arms the import
/// of the app.
fn loader_module(imports: &[String]) -> Result<String> {
    let list = serde_json::to_string(imports).context("cannot encode the imports")?;
    Ok(format!(
        r#""""A wasmjobs development loader, written by `wasmjobs build --dev`: the
snapshot holds the modules below; the app is imported on an instance's first
job from the sources the component carries."""

from wasmjobs_guest import WitWorld, _dev  # noqa: F401 (WitWorld is the component's export)

_dev.preimport({list})
_dev.arm({guest:?}, "app")
"#,
        guest = dev_sources::GUEST_DIR
    ))
}

/// The loader component for `imports`, `world` and this SDK: built with
/// componentize-py the first time, then kept under the toolchains
/// directory by a digest of everything that goes into it.
fn loader(sdk: &Sdk, world: &str, imports: &[String]) -> Result<PathBuf> {
    let module = loader_module(imports)?;
    let mut digest = Sha256::new();
    digest.update(format!(
        "componentize-py {}\n{world}\n{module}\n",
        sdk::COMPONENTIZE_PY_VERSION
    ));
    for root in [sdk.python(), sdk.wit()] {
        let walk = walkdir::WalkDir::new(&root)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| !super::sources::not_a_source(e));
        for entry in walk {
            let entry = entry.with_context(|| format!("cannot read {}", root.display()))?;
            if entry.file_type().is_file() {
                let name = entry
                    .path()
                    .strip_prefix(&root)
                    .unwrap_or(entry.path())
                    .to_string_lossy()
                    .into_owned();
                let text =
                    std::fs::read(entry.path()).with_context(|| format!("cannot read {}", entry.path().display()))?;
                // Each part with its length: no two lists of files hash alike.
                for part in [name.as_bytes(), &text] {
                    digest.update((part.len() as u64).to_le_bytes());
                    digest.update(part);
                }
            }
        }
    }
    let key = hex::encode(&digest.finalize()[..16]);
    let dir = sdk::toolchains_dir()?.join("dev-loaders");
    let path = dir.join(format!("{key}.wasm"));
    if path.is_file() {
        eprintln!(
            "development build: the loader for its {} import(s) is built already",
            imports.len()
        );
        // Used now: the prune keeps the loaders used last.
        if let Err(err) = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        {
            eprintln!("cannot mark {} used: {err}", path.display());
        }
        return Ok(path);
    }
    eprintln!(
        "componentize-py: building the development loader for {} import(s) (~10 s, again only when the imports change)",
        imports.len()
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stage = tempfile::tempdir().context("cannot create a staging directory")?;
    std::fs::write(stage.path().join("wasmjobs_dev_loader.py"), module).context("cannot write the loader")?;
    let temporary = tempfile::Builder::new()
        .prefix(".loader")
        .suffix(".wasm")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    super::build::componentize_py(sdk, world, stage.path(), "wasmjobs_dev_loader", temporary.path())?;
    temporary
        .persist(&path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    prune(&dir, &path);
    Ok(path)
}

/// Keeps the [`LOADERS_KEPT`] loaders in `dir` used last (and `just_built`).
fn prune(dir: &Path, just_built: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut loaders: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| {
            e.file_name().to_string_lossy().ends_with(".wasm") && !e.file_name().to_string_lossy().starts_with('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    loaders.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, old) in loaders.into_iter().skip(LOADERS_KEPT) {
        if old != just_built {
            let _ = std::fs::remove_file(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter().map(|(n, t)| ((*n).to_owned(), (*t).to_owned())).collect()
    }

    #[test]
    fn module_level_imports_are_found_and_the_apps_own_modules_left_out() {
        let app = r#"
import json, os.path
from urllib import parse
from datetime import datetime
from wasmjobs_guest import job, log
from helpers import shout
from . import sibling
import pkg.inner
try:
    import csv
except ImportError:
    csv = None
class Config:
    import decimal
def perform(info):
    import fractions
    return lambda: __import__("zlib")
"#;
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk/python");
        let found = scan(
            &files(&[
                ("app.py", app),
                ("helpers.py", "import string\n"),
                ("pkg/__init__.py", ""),
                ("pkg/inner.py", "from collections import OrderedDict\n"),
            ]),
            &sdk,
        )
        .unwrap();
        for wanted in [
            "json",
            "os.path",
            "urllib",
            "urllib.parse",
            "datetime",
            "wasmjobs_guest",
            "wasmjobs_guest.log",
            "csv",
            "decimal",
            "string",
            "collections",
        ] {
            assert!(found.iter().any(|f| f == wanted), "{wanted} missing from {found:?}");
        }
        for unwanted in [
            "fractions",
            "zlib",
            "helpers",
            "pkg",
            "pkg.inner",
            "sibling",
            "datetime.datetime",
            "collections.OrderedDict",
            "wasmjobs_guest.job",
        ] {
            assert!(!found.iter().any(|f| f == unwanted), "{unwanted} in {found:?}");
        }
    }

    /// A development build used to read a file with a syntax error line
    /// by line and deploy it: every job then failed with `SyntaxError`.
    #[test]
    fn a_file_python_cannot_parse_fails_the_build_naming_the_line() {
        let err = scan(
            &files(&[
                ("app.py", "import csv\nfrom helpers import x\n"),
                ("helpers.py", "import zlib\ndef broken(:\n    pass\n"),
            ]),
            Path::new("/nonexistent"),
        )
        .expect_err("a syntax error fails the build");
        let message = format!("{err:#}");
        assert!(
            message.contains("helpers.py:2:") && message.contains("SyntaxError") && message.contains("def broken(:"),
            "{message}"
        );
    }

    #[test]
    fn the_loader_names_only_identifiers() {
        assert!(is_module_name("os.path") && is_module_name("_x1") && is_module_name("café"));
        for bad in ["", "os..path", "1x", "a-b", "x\")\nimport os", "a b"] {
            assert!(!is_module_name(bad), "{bad:?}");
        }
        let module = loader_module(&["csv".to_owned()]).unwrap();
        assert!(
            module.contains(r#"_dev.preimport(["csv"])"#) && module.contains(r#"_dev.arm("/.wasmjobs/app", "app")"#)
        );
    }
}
