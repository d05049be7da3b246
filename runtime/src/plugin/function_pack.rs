//! The compile cache's second level: each plugin's compiled functions, so
//! that compiling its next version recompiles only what changed.
//!
//! When a component is not in the artifact cache (`plugin::cache`), it is
//! compiled in a session of Cranelift's incremental cache
//! (`sandbox::function_cache`) given the functions of that plugin's last
//! compile, read from `<plugin hash>-<engine hash>.functions` in the cache
//! directory; the functions this compile used are then written back in its
//! place. A one-line edit to a Python job thus recompiles 5–10% of its
//! functions (`docs/polyglot.md`, *The edit loop*). A pack holds one version's
//! functions: 28 MB for a Python plugin, 38 MB for a JavaScript one, less for a
//! Rust one; like artifacts, packs unused for a week are pruned.
//!
//! A pack is machine code, so it gets the artifact cache's trust checks: it
//! is read only from the private cache directory, opened without following
//! symlinks, and must be a regular file of this user that nobody else can
//! write. It is written through a temporary file renamed into place. A pack
//! that fails any check, or whose checksum does not match, is ignored (the
//! plugin is compiled in full) and replaced; failing to write one costs
//! only the next compile's speed. Never an error for the plugin.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::private_files::{open_own, replace};
use crate::sandbox::function_cache::{self, Functions, Reuse};

/// Packs larger than this are not read (a Python plugin's is ~40 MB).
const LARGEST: u64 = 1 << 30;

/// Compiles `bytes` for `engine`, reusing the functions of the last compile
/// of the plugin `label` kept in the pack at `path` (in the private cache
/// directory), and keeps this compile's functions there for the next one.
pub(super) fn compile(engine: &Engine, bytes: &[u8], path: &Path, label: &str) -> Result<(Component, Reuse)> {
    let dir = path.parent().context("a pack's path names its directory")?;
    let known = read(path).unwrap_or_else(|err| {
        tracing::warn!(path = %path.display(), "compiling {label} in full, its last compile's functions are unusable: {err:#}");
        Functions::new()
    });
    let session = function_cache::sessions().begin(known);
    let component = Component::new(engine, bytes).map_err(anyhow::Error::from)?;
    let (used, reuse) = session.finish();
    if let Err(err) = replace(dir, path, &function_cache::encode(&used)) {
        tracing::warn!(dir = %dir.display(), "cannot keep {label}'s compiled functions for its next compile: {err:#}");
    }
    Ok((component, reuse))
}

/// The functions in the pack at `path`; none if there is no pack.
fn read(path: &Path) -> Result<Functions> {
    let Some(file) = open_own(path)? else {
        return Ok(Functions::new());
    };
    let mut bytes = Vec::new();
    file.take(LARGEST + 1)
        .read_to_end(&mut bytes)
        .context("cannot read it")?;
    anyhow::ensure!(bytes.len() as u64 <= LARGEST, "larger than {} MiB", LARGEST >> 20);
    function_cache::decode(&bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::sandbox::engine::{self, EngineConfig};

    /// A component of 41 functions, one of which returns `answer`.
    fn component(answer: u32) -> Vec<u8> {
        let functions: String = (0..40)
            .map(|n| format!("(func (export \"f{n}\") (param i32) (result i32) local.get 0 i32.const {n} i32.mul i32.const 7 i32.add)"))
            .collect();
        wat::parse_str(format!(
            "(component (core module {functions} (func (export \"answer\") (result i32) i32.const {answer})))"
        ))
        .expect("a component")
    }

    #[test]
    fn an_edit_recompiles_only_what_changed_and_a_bad_pack_only_costs_speed() {
        let engine = engine::build(&EngineConfig {
            concurrency: 1,
            ..EngineConfig::default()
        })
        .expect("engine");
        let dir = tempfile::tempdir().expect("tempdir");
        let dir = dir.path();
        let pack = dir.join("edited.functions");
        let compile = |answer, path: &Path| {
            compile(&engine, &component(answer), path, "Edited")
                .expect("compiles")
                .1
        };

        let first = compile(1, &pack);
        assert_eq!(first.reused, 0, "nothing to reuse the first time");
        assert!(first.compiled >= 41, "{first:?}");
        let edited = compile(2, &pack);
        // The edited function, and a few more: the functions Wasmtime
        // generates per compile do not always hash alike (1 to 3 of these
        // ~45 were compiled again in runs beside the other unit tests).
        assert!(edited.compiled <= 5, "only the edited function and a few: {edited:?}");
        assert!(edited.reused >= first.compiled - 5, "{edited:?} after {first:?}");

        let mut bytes = std::fs::read(&pack).expect("pack");
        bytes[40] ^= 1;
        std::fs::write(&pack, &bytes).expect("damage the pack");
        assert_eq!(compile(3, &pack).reused, 0, "a damaged pack is not used");
        assert!(compile(3, &pack).reused > 0, "and is replaced by a good one");

        std::fs::set_permissions(&pack, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert_eq!(compile(3, &pack).reused, 0, "a pack others could write is not used");
        std::fs::remove_file(&pack).expect("remove");
        std::os::unix::fs::symlink(dir.join("elsewhere"), &pack).expect("symlink");
        assert_eq!(compile(3, &pack).reused, 0, "nor is a symlink");
        assert!(compile(3, &pack).reused > 0, "each is replaced by a pack of this user");
        let meta = std::fs::symlink_metadata(&pack).expect("pack");
        assert!(meta.is_file() && meta.permissions().mode() & 0o077 == 0, "{meta:?}");
    }
}
