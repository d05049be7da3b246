//! What in a plugin directory is a source: what `build` stages and what
//! `build --watch` watches.

/// Whether a file or directory of a plugin is build output or a cache
/// (`__pycache__`, `target`, `node_modules`, `.git`, `*.wasm`), not a
/// source.
pub(super) fn not_a_source(entry: &walkdir::DirEntry) -> bool {
    let name = entry.file_name().to_string_lossy();
    matches!(name.as_ref(), "__pycache__" | "target" | "node_modules" | ".git") || name.ends_with(".wasm")
}
