//! What a failed job's message adds when the failure looks like a file
//! its plugin was not granted.
//!
//! A guest resolves every path against its preopened directories inside
//! its own libc: a path outside them never reaches the host, and the guest
//! sees a bare WASI errno — Rust prints `No such file or directory (os
//! error 44)`, Python `[Errno 44] No such file or directory: '/etc/x'`,
//! JavaScript `ENOENT`, and a write under a read-only grant `Operation not
//! permitted (os error 63)` or `Read-only file system`. The host cannot
//! see the attempt, so it reads the message: when it carries one of those
//! errors, [`note`] names the path that is outside the grants (or the
//! read-only grant it fell in) and the `[[files]]` grant that would allow
//! it, as the HTTP denial names the `[http] allow` entry; without a path in
//! the message, it lists what the plugin may use. A pure function of the
//! message and the grants, so the executor appends it to the failure (and
//! so to the host's log line, the retry's `error_message` and `exec`).

use std::path::Path;

use super::files::{Mode, Preopen};

/// How the guests' libcs print the errors of a path outside the preopens
/// or a write to a read-only one.
const MARKERS: &[&str] = &[
    "os error 44",
    "os error 63",
    "os error 69",
    "Errno 44",
    "Errno 63",
    "Errno 69",
    "ENOENT",
    "EPERM",
    "ENOTCAPABLE",
    "EROFS",
    "No such file or directory",
    "Operation not permitted",
    "Read-only file system",
    "not permitted",
];

/// Whether `message` reports a write refused (rather than a missing path).
fn refused_write(message: &str) -> bool {
    [
        "os error 63",
        "os error 69",
        "Errno 63",
        "Errno 69",
        "EPERM",
        "EROFS",
        "not permitted",
        "Read-only",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// The absolute paths `message` names (quoted or not), first to last.
fn paths(message: &str) -> Vec<&str> {
    message
        .split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '(' | ')' | ',' | ';' | '[' | ']'))
        .filter(|word| word.starts_with('/') && word.len() > 1)
        .map(|word| word.trim_end_matches([':', '.']))
        .collect()
}

/// Whether guest path `path` lies in the granted directory `guest`.
fn inside(path: &str, guest: &str) -> bool {
    Path::new(path).starts_with(Path::new(guest))
}

/// Whether guest path `path`, inside `grant`, leads out of it: through
/// `..` past the grant's top, or on the host through a symlink to
/// somewhere else. WASI refuses both (`Operation not permitted`), which
/// reads like a write under a read-only grant and is nothing of the kind.
fn escapes(path: &str, grant: &Preopen) -> bool {
    let Ok(rest) = Path::new(path).strip_prefix(Path::new(&grant.guest)) else {
        return false;
    };
    let mut depth = 0usize;
    for part in rest.components() {
        match part {
            std::path::Component::ParentDir if depth == 0 => return true,
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    match (grant.host.join(rest).canonicalize(), grant.host.canonicalize()) {
        (Ok(target), Ok(top)) => !target.starts_with(top),
        _ => false,
    }
}

/// The directory a grant for `path` would name: the one it lies in (a
/// top-level path names itself).
fn directory_of(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match Path::new(trimmed).parent() {
        Some(parent) if parent != Path::new("/") => parent.display().to_string(),
        _ => trimmed.to_owned(),
    }
}

/// The grants as the note lists them: `/data (rw), /config (ro)`.
fn listed(grants: &[Preopen]) -> String {
    grants
        .iter()
        .map(|g| {
            let mode = match g.mode {
                Mode::ReadOnly => "ro",
                Mode::ReadWrite => "rw",
            };
            format!("{} ({mode})", g.guest)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The note for a failure `message` of a plugin granted `grants`, if the
/// message carries a file error.
pub(crate) fn note(message: &str, grants: &[Preopen]) -> Option<String> {
    if !MARKERS.iter().any(|m| message.contains(m)) {
        return None;
    }
    let named = paths(message);
    if let Some(path) = named.iter().find(|p| !grants.iter().any(|g| inside(p, &g.guest))) {
        let dir = directory_of(path);
        let granted = if grants.is_empty() {
            "this plugin has no [[files]] grants".to_owned()
        } else {
            format!("this plugin may use only {}", listed(grants))
        };
        return Some(format!(
            "files: {path} is not granted ({granted}); a path outside the grants reads as missing to the job; add a [[files]] grant for {dir} (guest = \"{dir}\") to its wasmjobs.toml"
        ));
    }
    if let Some((path, grant)) = named.iter().find_map(|p| {
        grants
            .iter()
            .find(|g| inside(p, &g.guest) && escapes(p, g))
            .map(|g| (p, g))
    }) {
        return Some(format!(
            "files: {path} leads out of the grant {} (through `..` or a symlink), so it is refused whatever the grant's mode; a job may reach only what lies inside its grants",
            grant.guest
        ));
    }
    if refused_write(message)
        && let Some(grant) = named
            .iter()
            .find_map(|p| grants.iter().find(|g| inside(p, &g.guest) && g.mode == Mode::ReadOnly))
    {
        return Some(format!(
            "files: {} is granted read-only; to let jobs write there, set mode = \"rw\" on its [[files]] grant",
            grant.guest
        ));
    }
    if named.is_empty() {
        return Some(if grants.is_empty() {
            "files: this plugin has no [[files]] grants, so every path reads as missing to the job; add a [[files]] grant for the directory it needs".to_owned()
        } else {
            format!(
                "files: if the path is outside {}, it is not granted and reads as missing to the job; add a [[files]] grant for its directory",
                listed(grants)
            )
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn grant(guest: &str, mode: Mode) -> Preopen {
        Preopen {
            host: PathBuf::from("/p/x").join(guest.trim_start_matches('/')),
            guest: guest.into(),
            mode,
            outside: false,
        }
    }

    #[test]
    fn a_path_outside_the_grants_is_named_with_the_grant_that_would_allow_it() {
        let grants = [grant("/data", Mode::ReadWrite)];
        let python = "FileNotFoundError: [Errno 44] No such file or directory: '/etc/passwd'";
        let note = note(python, &grants).expect("a note");
        assert!(note.contains("/etc/passwd is not granted"), "{note}");
        assert!(note.contains("only /data (rw)"), "{note}");
        assert!(note.contains("add a [[files]] grant for /etc"), "{note}");
        let rust = "reading /srv/reports: No such file or directory (os error 44)";
        assert!(
            note_of(rust, &grants).contains("grant for /srv (guest"),
            "the directory it lies in"
        );
        let none = note_of("open /etc/hosts: ENOENT", &[]);
        assert!(none.contains("no [[files]] grants"), "{none}");
    }

    fn note_of(message: &str, grants: &[Preopen]) -> String {
        note(message, grants).expect("a note")
    }

    #[test]
    fn a_write_under_a_read_only_grant_names_the_mode() {
        let grants = [grant("/config", Mode::ReadOnly), grant("/data", Mode::ReadWrite)];
        let note = note_of("writing /config/x.json: Operation not permitted (os error 63)", &grants);
        assert!(note.contains("/config is granted read-only"), "{note}");
        assert!(note.contains("mode = \"rw\""), "{note}");
    }

    /// A read through a symlink (or `..`) out of a read-only grant was
    /// told to "set mode = \"rw\"", which would not help.
    #[test]
    fn a_path_leading_out_of_its_grant_is_named_as_such_not_as_a_mode() {
        let top = tempfile::tempdir().unwrap();
        let config = top.path().join("config");
        std::fs::create_dir(&config).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", config.join("link")).unwrap();
        let grants = [Preopen {
            host: config.clone(),
            guest: "/config".into(),
            mode: Mode::ReadOnly,
            outside: false,
        }];
        for message in [
            "PermissionError: [Errno 63] Operation not permitted: '/config/link'",
            "reading /config/../etc/passwd: Operation not permitted (os error 63)",
        ] {
            let note = note_of(message, &grants);
            assert!(note.contains("leads out of the grant /config"), "{note}");
            assert!(!note.contains("mode = \"rw\""), "{note}");
        }
        std::fs::write(config.join("app.json"), "{}").unwrap();
        let write = note_of(
            "writing /config/app.json: Operation not permitted (os error 63)",
            &grants,
        );
        assert!(
            write.contains("mode = \"rw\""),
            "a real write still gets the mode: {write}"
        );
    }

    #[test]
    fn without_a_path_the_grants_are_listed_and_other_failures_get_nothing() {
        let grants = [grant("/data", Mode::ReadWrite)];
        let note = note_of("No such file or directory (os error 44)", &grants);
        assert!(note.contains("outside /data (rw)"), "{note}");
        assert_eq!(super::note("boom: connection refused", &grants), None);
        assert_eq!(
            super::note("[Errno 44] No such file or directory: '/data/missing.txt'", &grants),
            None,
            "a missing file inside a grant is just missing"
        );
    }
}
