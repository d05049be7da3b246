//! Development builds: a component that carries its Python sources.
//!
//! `wasmjobs build --dev` does not snapshot a Python app. It takes a
//! *loader* component, built once for the modules the app imports, and
//! appends the app's `.py` files to it as a custom section ([`SECTION`],
//! [`append`]). Nothing the engine compiles changes with the sources, so
//! an edit costs no componentize-py run and no native compile: the
//! compile cache is keyed by the component without the section
//! ([`split`]), and the runner's reloader sees a new file and loads it.
//!
//! When such a component loads, the host unpacks the files into a
//! directory of its own ([`unpack`], in the compile cache's directory,
//! named by the digest of the section) and grants it read-only at
//! [`GUEST_DIR`]; the loader imports the app from there when an instance
//! runs its first job, so tracebacks show the source lines.
//!
//! The section is hostile input like the rest of the component: every
//! name is checked to be a relative path of plain components ending in
//! `.py` ([`check_name`]), the files, the directories they make, their
//! depth and the total size are capped (the count while the JSON is
//! read), and the files are written by the host under a fresh directory
//! that is renamed into place whole, in a cache directory only this user
//! can write. The guest sees only what it carried, read only. Each load
//! touches its directory; one untouched for [`UNUSED_FOR`] is removed by
//! the next unpack ([`prune`]). (The custom section is one top-level section of the component
//! binary: an id byte `0`, a LEB128 size, the LEB128-prefixed name, the
//! data. Only top-level sections are looked at: a nested module's custom
//! sections are the toolchain's.)

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::cache::{UNUSED_FOR, sha256_hex};
use super::private_files::private_dir;

/// The name of the custom section holding the sources.
pub const SECTION: &str = "wasmjobs-dev-sources";

/// Where the guest sees the unpacked sources (read-only).
pub const GUEST_DIR: &str = "/.wasmjobs/app";

/// At most this many files in one component, and this many directories.
const MAX_FILES: usize = 10_000;
/// At most this many bytes of sources in one component.
const MAX_BYTES: usize = 64 << 20;
/// At most this many bytes of JSON in the section (escapes make the JSON
/// longer than the sources).
const MAX_SECTION: usize = 2 * MAX_BYTES;
/// At most this deep a path.
const MAX_DEPTH: usize = 16;

/// The section's content: the app's files by relative path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevSources {
    /// Format version: 1.
    pub version: u32,
    /// Each `.py` file's text, by its path relative to the plugin
    /// directory (`/`-separated).
    #[serde(deserialize_with = "at_most_max_files")]
    pub files: BTreeMap<String, String>,
}

/// Reads the files map, failing as soon as it has more than [`MAX_FILES`]
/// entries (not after building all of them).
fn at_most_max_files<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Files;
    impl<'de> serde::de::Visitor<'de> for Files {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a map of at most {MAX_FILES} file names to texts")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut files = BTreeMap::new();
            while let Some((name, text)) = map.next_entry::<String, String>()? {
                if files.len() == MAX_FILES {
                    return Err(serde::de::Error::custom(format!("more than {MAX_FILES} files")));
                }
                files.insert(name, text);
            }
            Ok(files)
        }
    }
    deserializer.deserialize_map(Files)
}

impl DevSources {
    /// The sources `files` (checked as the host will check them).
    pub fn new(files: BTreeMap<String, String>) -> Result<Self> {
        let sources = DevSources { version: 1, files };
        sources.check()?;
        Ok(sources)
    }

    /// Checks names, count and size.
    fn check(&self) -> Result<()> {
        if self.version != 1 {
            bail!("format version {} (this wasmjobs reads 1)", self.version);
        }
        if self.files.len() > MAX_FILES {
            bail!("{} files, more than {MAX_FILES}", self.files.len());
        }
        let bytes: usize = self.files.iter().map(|(name, text)| name.len() + text.len()).sum();
        if bytes > MAX_BYTES {
            bail!("{bytes} bytes of sources, more than {MAX_BYTES}");
        }
        for name in self.files.keys() {
            check_name(name)?;
        }
        let directories: std::collections::BTreeSet<&str> = self
            .files
            .keys()
            .flat_map(|name| name.match_indices('/').map(|(at, _)| &name[..at]))
            .collect();
        if directories.len() > MAX_FILES {
            bail!("{} directories, more than {MAX_FILES}", directories.len());
        }
        Ok(())
    }
}

/// Refuses a file name that is not a relative path of plain components
/// ending in `.py`: no `..`, no `.`, no root, no empty or hidden
/// component, no NUL, not too deep.
fn check_name(name: &str) -> Result<()> {
    let refuse = |why: &str| -> Result<()> { bail!("file name {name:?}: {why}") };
    if !name.ends_with(".py") {
        return refuse("not a .py file");
    }
    if name.contains('\0') || name.contains('\\') {
        return refuse("a NUL or a backslash");
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() > MAX_DEPTH {
        return refuse("too deep");
    }
    for part in &parts {
        if part.is_empty() || part.starts_with('.') || part.len() > 255 {
            return refuse("an empty, hidden, `.`/`..` or over-long component");
        }
        if !matches!(Path::new(part).components().next(), Some(Component::Normal(_))) {
            return refuse("not a plain name");
        }
    }
    Ok(())
}

/// Appends the sources to `component` as the [`SECTION`] custom section.
pub fn append(component: &mut Vec<u8>, sources: &DevSources) -> Result<()> {
    sources.check()?;
    let data = serde_json::to_vec(sources).context("cannot encode the sources")?;
    let mut payload = Vec::with_capacity(SECTION.len() + data.len() + 5);
    leb128(&mut payload, SECTION.len());
    payload.extend_from_slice(SECTION.as_bytes());
    payload.extend_from_slice(&data);
    component.push(0);
    leb128(component, payload.len());
    component.extend_from_slice(&payload);
    Ok(())
}

fn leb128(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads an unsigned LEB128 u32 at `*at`, advancing it.
fn read_u32(bytes: &[u8], at: &mut usize) -> Result<usize> {
    let mut value: u64 = 0;
    for shift in (0..35).step_by(7) {
        let Some(&byte) = bytes.get(*at) else {
            bail!("truncated at byte {at}");
        };
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return u32::try_from(value)
                .map(|v| v as usize)
                .map_err(|_| anyhow::anyhow!("a size over 4 GiB"));
        }
    }
    bail!("a size of more than 5 bytes at byte {at}")
}

/// Splits a component binary into the bytes the engine compiles (without
/// the [`SECTION`] section) and the sources that section holds, if any.
/// A malformed section, or two of them, is an error.
pub fn split(bytes: &[u8]) -> Result<(std::borrow::Cow<'_, [u8]>, Option<DevSources>)> {
    let mut found: Option<(std::ops::Range<usize>, &[u8])> = None;
    let mut at = 8;
    while at < bytes.len() {
        let start = at;
        let id = bytes[at];
        at += 1;
        let size = read_u32(bytes, &mut at).context("a malformed component")?;
        let end = at
            .checked_add(size)
            .filter(|end| *end <= bytes.len())
            .context("a malformed component: a section runs past its end")?;
        if id == 0 {
            let mut name_at = at;
            let name_len = read_u32(bytes, &mut name_at).context("a malformed custom section")?;
            let name_end = name_at
                .checked_add(name_len)
                .filter(|e| *e <= end)
                .context("a malformed custom section")?;
            if &bytes[name_at..name_end] == SECTION.as_bytes() {
                if found.is_some() {
                    bail!("two {SECTION} sections");
                }
                found = Some((start..end, &bytes[name_end..end]));
            }
        }
        at = end;
    }
    let Some((range, data)) = found else {
        return Ok((std::borrow::Cow::Borrowed(bytes), None));
    };
    if data.len() > MAX_SECTION {
        bail!(
            "the {SECTION} section is refused: {} bytes, more than {MAX_SECTION}",
            data.len()
        );
    }
    let sources: DevSources =
        serde_json::from_slice(data).with_context(|| format!("the {SECTION} section is not what wasmjobs writes"))?;
    sources
        .check()
        .with_context(|| format!("the {SECTION} section is refused"))?;
    let mut stripped = Vec::with_capacity(bytes.len() - range.len());
    stripped.extend_from_slice(&bytes[..range.start]);
    stripped.extend_from_slice(&bytes[range.end..]);
    Ok((std::borrow::Cow::Owned(stripped), Some(sources)))
}

/// A loaded version's hold on its unpacked sources: a shared lock on
/// their directory, kept as long as the version is loaded (in any process
/// sharing the cache), so [`prune`] never removes sources that a new
/// instance of a loaded version would import.
#[derive(Debug)]
pub struct InUse {
    _dir: std::fs::File,
}

/// Writes `sources` under `dev-sources/<digest>` in the cache directory
/// `cache` (once: an existing directory of that digest is reused, and
/// touched) and returns that directory, held ([`InUse`]) for the caller.
/// The cache directory must be private to this user, as for compiled
/// code; the files are written under a temporary name renamed into place
/// whole, so a directory of that name is complete.
pub fn unpack(cache: &Path, sources: &DevSources) -> Result<(PathBuf, InUse)> {
    // A prune elsewhere may remove the directory between its unpack and
    // its lock: then it is unpacked again.
    for _ in 0..3 {
        let dir = unpack_once(cache, sources)?;
        if let Some(held) = hold(&dir)? {
            prune(dir.parent().unwrap_or(cache), std::time::SystemTime::now());
            return Ok((dir, held));
        }
    }
    bail!("the unpacked sources under {} keep being removed", cache.display())
}

/// A shared lock on `dir`, if it is still there once locked.
fn hold(dir: &Path) -> Result<Option<InUse>> {
    use std::os::unix::fs::MetadataExt;
    let file = match std::fs::File::open(dir) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("cannot open {}", dir.display())),
    };
    file.lock_shared()
        .with_context(|| format!("cannot lock {}", dir.display()))?;
    let linked = file.metadata().map(|meta| meta.nlink() > 0).unwrap_or(false);
    Ok(linked.then_some(InUse { _dir: file }))
}

fn unpack_once(cache: &Path, sources: &DevSources) -> Result<PathBuf> {
    private_dir(cache)?;
    let root = cache.join("dev-sources");
    private_dir(&root)?;
    let digest = sha256_hex(&serde_json::to_vec(sources).context("cannot encode the sources")?);
    let dir = root.join(&digest[..32]);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {
            private_dir(&dir)?;
            touch(&dir);
            return Ok(dir);
        }
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot inspect {}", dir.display())),
    }
    let staging = tempfile::Builder::new()
        .prefix(".tmp")
        .tempdir_in(&root)
        .with_context(|| format!("cannot create a directory in {}", root.display()))?;
    for (name, text) in &sources.files {
        let path = staging.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let staged = staging.keep();
    if let Err(err) = std::fs::rename(&staged, &dir) {
        let _ = std::fs::remove_dir_all(&staged);
        // Another process unpacked the same sources first.
        if !dir.is_dir() {
            return Err(err).with_context(|| format!("cannot move the sources to {}", dir.display()));
        }
    }
    Ok(dir)
}

/// Marks `dir` used now (its modification time), so [`prune`] keeps it.
fn touch(dir: &Path) {
    if let Err(err) = std::fs::File::open(dir).and_then(|d| d.set_modified(std::time::SystemTime::now())) {
        tracing::warn!(dir = %dir.display(), "cannot mark the unpacked sources used: {err}");
    }
}

/// Removes the unpacked sources in `root` that no load has touched for
/// [`UNUSED_FOR`] and no loaded version holds ([`InUse`], in any process),
/// and staging directories a crash left behind for as long.
fn prune(root: &Path, now: std::time::SystemTime) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let age = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok());
        if age.is_none_or(|age| age <= UNUSED_FOR) {
            continue;
        }
        // Held by a loaded version: kept, however old.
        let Ok(dir) = std::fs::File::open(entry.path()) else {
            continue;
        };
        if dir.try_lock().is_err() {
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!(dir = %entry.path().display(), "cannot remove unused unpacked sources: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: the header alone.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files.iter().map(|(n, t)| ((*n).to_owned(), (*t).to_owned())).collect()
    }

    fn with_section(name: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = EMPTY_COMPONENT.to_vec();
        let mut payload = Vec::new();
        leb128(&mut payload, name.len());
        payload.extend_from_slice(name.as_bytes());
        payload.extend_from_slice(data);
        bytes.push(0);
        leb128(&mut bytes, payload.len());
        bytes.extend_from_slice(&payload);
        bytes
    }

    #[test]
    fn appended_sources_split_back_off_leaving_the_component_as_it_was() {
        // Another custom section before ours stays.
        let mut component = with_section("producers", b"x");
        let original = component.clone();
        let files = DevSources::new(sources(&[("app.py", "x = 1\n"), ("lib/util.py", "é = 2\n")])).unwrap();
        append(&mut component, &files).unwrap();
        assert_ne!(component, original);
        let (stripped, found) = split(&component).unwrap();
        assert_eq!(&*stripped, original.as_slice());
        assert_eq!(found, Some(files));
        let (same, none) = split(&original).unwrap();
        assert!(matches!(same, std::borrow::Cow::Borrowed(_)) && none.is_none());
    }

    #[test]
    fn hostile_names_are_refused() {
        for name in [
            "../app.py",
            "/etc/app.py",
            "a/../../b.py",
            "./app.py",
            "a//b.py",
            ".hidden.py",
            "a/.git/x.py",
            "app.txt",
            "a\0b.py",
            "a\\..\\b.py",
            "",
        ] {
            let err = DevSources::new(sources(&[(name, "")])).unwrap_err();
            assert!(err.to_string().contains("file name"), "{name:?}: {err}");
        }
        let deep = format!("{}x.py", "d/".repeat(MAX_DEPTH));
        assert!(DevSources::new(sources(&[(&deep, "")])).is_err());
        // Few files, many directories.
        let spread: Vec<(String, String)> = (0..MAX_FILES / 4)
            .map(|i| (format!("a{i}/b/c/d/e/x.py"), String::new()))
            .collect();
        let spread: BTreeMap<String, String> = spread.into_iter().collect();
        let err = DevSources::new(spread).unwrap_err();
        assert!(err.to_string().contains("directories"), "{err}");
        // A hostile section is refused when read, not only when written.
        let data = br#"{"version":1,"files":{"../../x.py":"boom"}}"#;
        let err = split(&with_section(SECTION, data)).unwrap_err();
        assert!(format!("{err:#}").contains("refused"), "{err:#}");
    }

    #[test]
    fn malformed_sections_are_errors_not_panics() {
        for bytes in [
            with_section(SECTION, b"not json"),
            with_section(SECTION, br#"{"version":2,"files":{}}"#),
            with_section(SECTION, br#"{"version":1,"files":{},"more":1}"#),
            [EMPTY_COMPONENT, &[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]].concat(),
            [EMPTY_COMPONENT, &[0, 10, 3]].concat(),
            [EMPTY_COMPONENT, &[0, 2, 9, b'a']].concat(),
        ] {
            assert!(split(&bytes).is_err(), "{bytes:?}");
        }
        let mut twice = with_section(SECTION, br#"{"version":1,"files":{}}"#);
        twice.extend_from_slice(&with_section(SECTION, br#"{"version":1,"files":{}}"#)[8..]);
        assert!(format!("{:#}", split(&twice).unwrap_err()).contains("two"));
        let many: BTreeMap<String, String> = (0..=MAX_FILES).map(|i| (format!("m{i}.py"), String::new())).collect();
        assert!(DevSources::new(many.clone()).is_err());
        // Refused while reading, with the count.
        let json = serde_json::json!({ "version": 1, "files": many }).to_string();
        let err = split(&with_section(SECTION, json.as_bytes())).unwrap_err();
        assert!(format!("{err:#}").contains("more than 10000 files"), "{err:#}");
    }

    #[test]
    fn unpacking_writes_the_files_once_under_their_digest() {
        let cache = tempfile::tempdir().unwrap();
        let files = DevSources::new(sources(&[("app.py", "x = 1\n"), ("pkg/__init__.py", "")])).unwrap();
        let (dir, _held) = unpack(cache.path(), &files).unwrap();
        assert!(dir.starts_with(cache.path().join("dev-sources")));
        assert_eq!(std::fs::read_to_string(dir.join("app.py")).unwrap(), "x = 1\n");
        assert!(dir.join("pkg/__init__.py").is_file());
        assert_eq!(unpack(cache.path(), &files).unwrap().0, dir);
        let other = DevSources::new(sources(&[("app.py", "x = 2\n")])).unwrap();
        assert_ne!(unpack(cache.path(), &other).unwrap().0, dir);
        // A directory of that name that is not a directory is refused.
        let planted = DevSources::new(sources(&[("app.py", "x = 3\n")])).unwrap();
        let digest = sha256_hex(&serde_json::to_vec(&planted).unwrap());
        let at = cache.path().join("dev-sources").join(&digest[..32]);
        std::os::unix::fs::symlink(cache.path(), &at).unwrap();
        assert!(unpack(cache.path(), &planted).is_err(), "a symlink in its place");
        std::fs::remove_file(&at).unwrap();
        let left: Vec<_> = std::fs::read_dir(cache.path().join("dev-sources"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(left.is_empty(), "no staging directory is left behind");
    }

    #[test]
    fn unpacked_sources_untouched_for_a_week_are_pruned_and_a_load_touches_them() {
        let cache = tempfile::tempdir().unwrap();
        let old = DevSources::new(sources(&[("app.py", "old = 1\n")])).unwrap();
        let kept = DevSources::new(sources(&[("app.py", "kept = 1\n")])).unwrap();
        let (old_dir, kept_dir) = (
            unpack(cache.path(), &old).unwrap().0,
            unpack(cache.path(), &kept).unwrap().0,
        );
        let long_ago = std::time::SystemTime::now() - UNUSED_FOR - std::time::Duration::from_secs(60);
        for dir in [&old_dir, &kept_dir] {
            std::fs::File::open(dir).unwrap().set_modified(long_ago).unwrap();
        }
        // Loading `kept` again touches it; the next new unpack prunes `old`.
        assert_eq!(unpack(cache.path(), &kept).unwrap().0, kept_dir);
        let new = DevSources::new(sources(&[("app.py", "new = 1\n")])).unwrap();
        let new_dir = unpack(cache.path(), &new).unwrap().0;
        assert!(!old_dir.exists() && kept_dir.is_dir() && new_dir.is_dir());
    }

    /// A version still loaded (here or in another process sharing the
    /// cache) holds its sources: however long since they were unpacked,
    /// they are not pruned while it is loaded, and are once it is not.
    /// (Before, a week after its load, another plugin's unpack removed
    /// them under it and its new instances failed to import the app.)
    #[test]
    fn sources_a_loaded_version_holds_are_never_pruned() {
        let cache = tempfile::tempdir().unwrap();
        let loaded = DevSources::new(sources(&[("app.py", "loaded = 1\n")])).unwrap();
        let (dir, held) = unpack(cache.path(), &loaded).unwrap();
        let long_ago = std::time::SystemTime::now() - UNUSED_FOR - std::time::Duration::from_secs(60);
        std::fs::File::open(&dir).unwrap().set_modified(long_ago).unwrap();
        let other = DevSources::new(sources(&[("app.py", "other = 1\n")])).unwrap();
        let _other = unpack(cache.path(), &other).unwrap();
        assert!(dir.join("app.py").is_file(), "a loaded version's sources were pruned");
        drop(held);
        std::fs::File::open(&dir).unwrap().set_modified(long_ago).unwrap();
        let third = DevSources::new(sources(&[("app.py", "third = 1\n")])).unwrap();
        let _third = unpack(cache.path(), &third).unwrap();
        assert!(!dir.exists(), "unloaded and untouched for a week: pruned");
    }
}
