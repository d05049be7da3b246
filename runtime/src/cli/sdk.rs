//! Where the guest SDKs and the WIT package are, and the pinned toolchains
//! that build plugins (`wasmjobs new`, `wasmjobs build`).
//!
//! The SDK is the repository's `guest-sdk/` (the Rust crate, `python/`,
//! `js/`) beside `wit/`; by default the one this binary was built from,
//! else `--sdk PATH` or `WASMJOBS_SDK`. Toolchains that are not the
//! machine's own (componentize-py in a virtualenv) live under
//! `WASMJOBS_TOOLCHAINS`, else `$XDG_CACHE_HOME/wasmjobs`, else
//! `~/.cache/wasmjobs`, and are installed on first use, pinned to the
//! versions `scripts/build-plugins.sh` uses.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The componentize-py release the Python SDK is built and tested with.
pub(crate) const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// A located guest SDK.
#[derive(Debug, Clone)]
pub(crate) struct Sdk {
    root: PathBuf,
}

impl Sdk {
    /// The SDK at `explicit`, or the one this binary was built from.
    pub(crate) fn locate(explicit: Option<&Path>) -> Result<Self> {
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
        let root = explicit.map(Path::to_path_buf).unwrap_or(built_from);
        let root = root.canonicalize().with_context(|| {
            format!(
                "no guest SDK at {} (pass --sdk PATH to a wasmjobs checkout's guest-sdk directory)",
                root.display()
            )
        })?;
        let sdk = Self { root };
        for needed in [
            sdk.root.join("Cargo.toml"),
            sdk.python().join("wasmjobs_guest/__init__.py"),
            sdk.js().join("wasmjobs-guest.js"),
            sdk.wit().join("job.wit"),
        ] {
            if !needed.is_file() {
                bail!(
                    "{} is not a wasmjobs guest SDK: {} is missing (pass --sdk PATH to a checkout's guest-sdk directory)",
                    sdk.root.display(),
                    needed.display()
                );
            }
        }
        Ok(sdk)
    }

    /// The Rust SDK crate (`wasmjobs-guest`).
    pub(crate) fn rust_crate(&self) -> PathBuf {
        self.root.clone()
    }

    /// The Python SDK's package directory (holding `wasmjobs_guest/`).
    pub(crate) fn python(&self) -> PathBuf {
        self.root.join("python")
    }

    /// The JavaScript SDK (`wasmjobs-guest.js`, `build.mjs`).
    pub(crate) fn js(&self) -> PathBuf {
        self.root.join("js")
    }

    /// The WIT package (`job.wit` and its WASI dependencies).
    pub(crate) fn wit(&self) -> PathBuf {
        self.root.join("../wit")
    }
}

/// Where toolchains that wasmjobs installs live.
pub(crate) fn toolchains_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("WASMJOBS_TOOLCHAINS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(cache).join("wasmjobs"));
    }
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .context("neither WASMJOBS_TOOLCHAINS, XDG_CACHE_HOME nor HOME is set: where should toolchains go?")?;
    Ok(PathBuf::from(home).join(".cache/wasmjobs"))
}

/// The pinned componentize-py, installed into a virtualenv on first use.
pub(crate) fn componentize_py() -> Result<PathBuf> {
    let venv = toolchains_dir()?.join("python");
    let tool = venv.join("bin/componentize-py");
    let wanted = format!("componentize-py {COMPONENTIZE_PY_VERSION}");
    let installed = Command::new(&tool)
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted);
    if installed {
        return Ok(tool);
    }
    eprintln!(
        "installing componentize-py {COMPONENTIZE_PY_VERSION} from PyPI into {} (first Python build only)",
        venv.display()
    );
    run_quietly(
        Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv),
        "python3 -m venv (Python 3 with venv is needed: on Debian, apt-get install python3-venv)",
    )?;
    run_quietly(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("componentize-py=={COMPONENTIZE_PY_VERSION}")),
        "pip install componentize-py",
    )?;
    Ok(tool)
}

/// Node.js ≥ 20 and componentize-js (`npm ci` in the JS SDK on first use).
pub(crate) fn componentize_js(sdk: &Sdk) -> Result<()> {
    let version = Command::new("node").arg("--version").output().context(
        "JavaScript plugins need Node.js ≥ 20 (`node` is not on PATH; on Debian, apt-get install nodejs npm)",
    )?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 20 {
        bail!("componentize-js needs Node.js ≥ 20, found {version}");
    }
    if sdk.js().join("node_modules/@bytecodealliance/componentize-js").is_dir() {
        return Ok(());
    }
    eprintln!(
        "installing componentize-js (npm ci in {}, first JavaScript build only)",
        sdk.js().display()
    );
    run_quietly(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(sdk.js()),
        "npm ci (npm is needed: on Debian, apt-get install npm)",
    )
}

/// Runs `command`, showing its output only if it fails.
pub(crate) fn run_quietly(command: &mut Command, what: &str) -> Result<()> {
    let output = command.output().with_context(|| format!("cannot start {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
