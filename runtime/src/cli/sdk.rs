//! Where the guest SDKs and the WIT package are, and the pinned toolchains
//! that build plugins (`wasmjobs new`, `wasmjobs build`).
//!
//! The binary carries the SDK it was built with (`build.rs` packs the Rust
//! crate `wasmjobs-guest`, its `wit/`, the Python package and the
//! JavaScript module), so a plugin builds on any machine with the same
//! `wasmjobs` and nothing else of the repository. On first use it is
//! written out under the toolchains directory, in a directory named by
//! the binary's version and a digest of the files
//! (`sdk/0.1.0-<digest>/`), never changed afterwards; `--sdk PATH` or
//! `WASMJOBS_SDK` points at another one instead (a checkout's
//! `guest-sdk/`, while working on the SDK itself).
//!
//! Toolchains that are not the machine's own (componentize-py in a
//! virtualenv, componentize-js's `node_modules`, the Rust build output)
//! live under `WASMJOBS_TOOLCHAINS`, else `$XDG_CACHE_HOME/wasmjobs`, else
//! `~/.cache/wasmjobs`, and are installed on first use, pinned to the
//! versions `scripts/build-plugins.sh` uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The componentize-py release the Python SDK is built and tested with.
pub(crate) const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// The SDK's version: the binary's (the guest SDK crate's, a test checks).
pub(crate) const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

mod packed {
    include!(concat!(env!("OUT_DIR"), "/sdk_files.rs"));
}

/// Written last into an unpacked SDK: the copy is whole.
const COMPLETE: &str = ".complete";

/// A located guest SDK.
#[derive(Debug, Clone)]
pub(crate) struct Sdk {
    root: PathBuf,
}

impl Sdk {
    /// The SDK at `explicit`, or the one this binary carries.
    pub(crate) fn locate(explicit: Option<&Path>) -> Result<Self> {
        let root = match explicit {
            Some(root) => root.canonicalize().with_context(|| {
                format!(
                    "no guest SDK at {} (--sdk / WASMJOBS_SDK: a wasmjobs checkout's guest-sdk directory; leave it unset to use the SDK this wasmjobs carries)",
                    root.display()
                )
            })?,
            None => unpack()?,
        };
        let sdk = Self { root };
        for needed in [
            sdk.root.join("Cargo.toml"),
            sdk.python().join("wasmjobs_guest/__init__.py"),
            sdk.js().join("wasmjobs-guest.js"),
            sdk.wit().join("job.wit"),
        ] {
            if !needed.is_file() {
                bail!(
                    "{} is not a wasmjobs guest SDK: {} is missing (--sdk / WASMJOBS_SDK: a checkout's guest-sdk directory)",
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
        self.root.join("wit")
    }
}

/// The SDK this binary carries, written out under the toolchains
/// directory if it is not there yet; its root.
fn unpack() -> Result<PathBuf> {
    let dir = toolchains_dir()?
        .join("sdk")
        .join(format!("{SDK_VERSION}-{}", packed::SDK_DIGEST));
    if dir.join(COMPLETE).is_file() {
        return Ok(dir);
    }
    let parent = dir.parent().context("the SDK directory has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    // Written aside and renamed into place: a reader never sees half a
    // copy, and of two commands unpacking at once one copy wins.
    let stage = tempfile::Builder::new()
        .prefix(".unpacking-")
        .tempdir_in(parent)
        .with_context(|| format!("cannot write the guest SDK under {}", parent.display()))?;
    for (name, bytes) in packed::SDK_FILES {
        let target = stage.path().join(name);
        if let Some(folder) = target.parent() {
            std::fs::create_dir_all(folder).with_context(|| format!("cannot create {}", folder.display()))?;
        }
        let bytes = if *name == "Cargo.toml" {
            standalone_manifest(bytes).into_bytes()
        } else {
            bytes.to_vec()
        };
        std::fs::write(&target, bytes).with_context(|| format!("cannot write {}", target.display()))?;
    }
    std::fs::write(stage.path().join(COMPLETE), SDK_VERSION)
        .with_context(|| format!("cannot write the guest SDK under {}", parent.display()))?;
    let staged = stage.keep();
    if let Err(err) = std::fs::rename(&staged, &dir) {
        let _ = std::fs::remove_dir_all(&staged);
        if !dir.join(COMPLETE).is_file() {
            return Err(err).with_context(|| format!("cannot move the guest SDK to {}", dir.display()));
        }
    }
    Ok(dir)
}

/// The SDK crate's manifest as a crate of its own: without the line that
/// makes it a member of the repository's guest workspace.
fn standalone_manifest(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|line| !line.trim_start().starts_with("workspace ="))
        .map(|line| format!("{line}\n"))
        .collect()
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
    let modules = sdk.js().join("node_modules");
    let ready = |modules: &Path| {
        ["@bytecodealliance/componentize-js", "es-module-lexer"]
            .iter()
            .all(|package| modules.join(package).is_dir())
    };
    if ready(&modules) {
        return Ok(());
    }
    // Installed once per lock file under the toolchains directory and
    // linked into the SDK: every copy of the SDK with the same lock (each
    // wasmjobs version unpacks its own) shares one `node_modules`.
    let lock = std::fs::read(sdk.js().join("package-lock.json"))
        .with_context(|| format!("{}: no package-lock.json", sdk.js().display()))?;
    let digest = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&lock)[..8]);
    let shared = toolchains_dir()?.join("js").join(digest);
    if !ready(&shared.join("node_modules")) {
        eprintln!(
            "installing componentize-js (npm ci in {}, first JavaScript build only)",
            shared.display()
        );
        std::fs::create_dir_all(&shared).with_context(|| format!("cannot create {}", shared.display()))?;
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(sdk.js().join(file), shared.join(file))
                .with_context(|| format!("cannot copy {file} to {}", shared.display()))?;
        }
        run_quietly(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&shared),
            "npm ci (npm is needed: on Debian, apt-get install npm)",
        )?;
    }
    if modules.is_symlink() {
        let _ = std::fs::remove_file(&modules);
    }
    if let Err(err) = std::os::unix::fs::symlink(shared.join("node_modules"), &modules)
        && !ready(&modules)
    {
        return Err(err).with_context(|| format!("cannot link {}", modules.display()));
    }
    Ok(())
}

/// Runs `command`, showing its output only if it fails.
pub(crate) fn run_quietly(command: &mut Command, what: &str) -> Result<()> {
    let output = super::build_stop::output(command.stdout(Stdio::piped()).stderr(Stdio::piped()))
        .with_context(|| format!("cannot start {what}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_carries_a_whole_sdk_at_its_own_version() {
        let names: Vec<&str> = packed::SDK_FILES.iter().map(|(name, _)| *name).collect();
        for needed in [
            "Cargo.toml",
            "src/lib.rs",
            "wit/job.wit",
            "python/wasmjobs_guest/__init__.py",
            "js/wasmjobs-guest.js",
            "js/wasmjobs-guest.d.ts",
            "js/build.mjs",
            "js/package-lock.json",
        ] {
            assert!(names.contains(&needed), "{needed} is not packed: {names:?}");
        }
        assert!(
            names
                .iter()
                .all(|n| !n.contains("node_modules") && !n.contains("__pycache__")),
            "{names:?}"
        );
        let manifest = packed::SDK_FILES
            .iter()
            .find(|(name, _)| *name == "Cargo.toml")
            .map(|(_, bytes)| standalone_manifest(bytes))
            .expect("Cargo.toml");
        let parsed: toml::Table = manifest.parse().expect("the standalone manifest is TOML");
        assert_eq!(parsed["package"]["version"].as_str(), Some(SDK_VERSION));
        assert!(parsed["package"].get("workspace").is_none(), "{manifest}");
        assert!(
            !manifest.contains(".workspace = true"),
            "inherits from a workspace:\n{manifest}"
        );
    }
}
