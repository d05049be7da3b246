//! What in a plugin directory is a source: what `build` stages, what
//! `build --watch` watches and what a development build carries.

/// Whether a file or directory of a plugin is build output or a cache
/// (`__pycache__`, `target`, `node_modules`, `.git`, `*.wasm`), not a
/// source.
pub(super) fn not_a_source(entry: &walkdir::DirEntry) -> bool {
    let name = entry.file_name().to_string_lossy();
    matches!(name.as_ref(), "__pycache__" | "target" | "node_modules" | ".git") || name.ends_with(".wasm")
}

/// The entries under `dir` that `build --watch` watches and a development
/// build carries: sources ([`not_a_source`]), and no hidden file or
/// directory (an editor's swap file, the build's own temporary component).
pub(super) fn visible_sources(dir: &std::path::Path) -> impl Iterator<Item = walkdir::Result<walkdir::DirEntry>> {
    walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| !not_a_source(e) && !e.file_name().to_string_lossy().starts_with('.'))
}
