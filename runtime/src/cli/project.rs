//! Which data directory a command uses — and with it which embedded Redis
//! and which compilation cache — wherever in a project it is run.
//!
//! As git finds `.git`, wasmjobs looks for a `.wasmjobs` directory in the
//! current directory and then in each parent: `wasmjobs stats` in
//! `app/plugins/greet/` talks to the Redis `wasmjobs run --plugins
//! ./plugins` started in `app/`. When there is none, the command makes
//! `./.wasmjobs` — a new, empty Redis and cache — and says so
//! ([`DataDir::notice`]). `--data-dir` / `WASMJOBS_DATA_DIR` choose one
//! outright. `wasmjobs env` prints what was found, as the `REDIS_URL`
//! another program (a Ruby app, a Rust producer) should use.

use std::path::{Path, PathBuf};

/// The name of the directory a project's state lives in.
pub(crate) const NAME: &str = ".wasmjobs";

/// How the data directory was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Chosen {
    /// `--data-dir` / `WASMJOBS_DATA_DIR`.
    #[default]
    Given,
    /// Found in the current directory or a parent.
    Found,
    /// None found: a new one in the current directory.
    New,
}

/// A command's data directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct DataDir {
    /// Absolute.
    pub(crate) path: PathBuf,
    pub(crate) chosen: Chosen,
}

impl DataDir {
    /// The data directory for a command run in `cwd`: `given`, else the
    /// nearest `.wasmjobs` in `cwd` or a parent, else `cwd/.wasmjobs`.
    pub(crate) fn resolve(given: Option<&Path>, cwd: &Path) -> DataDir {
        Self::resolve_below(given, cwd, Path::new("/"))
    }

    /// [`DataDir::resolve`], looking in no parent above `ceiling` (the
    /// tests' own temporary directory: a `.wasmjobs` someone left in
    /// `/tmp` must not decide them).
    fn resolve_below(given: Option<&Path>, cwd: &Path, ceiling: &Path) -> DataDir {
        if let Some(given) = given.filter(|g| !g.as_os_str().is_empty()) {
            return DataDir {
                path: cwd.join(given),
                chosen: Chosen::Given,
            };
        }
        let found = cwd
            .ancestors()
            .take_while(|dir| dir.starts_with(ceiling))
            .map(|dir| dir.join(NAME))
            .find(|dir| dir.is_dir());
        match found {
            Some(path) => DataDir {
                path,
                chosen: Chosen::Found,
            },
            None => DataDir {
                path: cwd.join(NAME),
                chosen: Chosen::New,
            },
        }
    }

    /// What to tell a person whose command is about to make a new data
    /// directory (`None` when it uses one that exists or was given);
    /// `embedded_redis` when the command would start its Redis there.
    pub(crate) fn notice(&self, embedded_redis: bool) -> Option<String> {
        if self.chosen != Chosen::New {
            return None;
        }
        let what = if embedded_redis {
            "a new, empty embedded Redis and compilation cache"
        } else {
            "a new compilation cache"
        };
        Some(format!(
            "wasmjobs: no {NAME} directory here or in any parent directory: starting {what} in {}. \
             To use an existing project's, run from its directory (or below it), or pass --data-dir DIR{}",
            self.path.display(),
            if embedded_redis { " or --redis URL" } else { "" }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_data_directory_up_the_tree_is_the_projects() {
        let root = tempfile::tempdir().unwrap();
        let ceiling = root.path();
        let project = root.path().join("app");
        let deep = project.join("plugins/greet/src");
        std::fs::create_dir_all(&deep).unwrap();

        let fresh = DataDir::resolve_below(None, &deep, ceiling);
        assert_eq!(
            (fresh.path.clone(), fresh.chosen.clone()),
            (deep.join(NAME), Chosen::New)
        );
        assert!(fresh.notice(true).unwrap().contains("new, empty embedded Redis"));
        assert!(!fresh.notice(false).unwrap().contains("Redis"));
        // Nothing above the ceiling is looked at.
        std::fs::create_dir(root.path().join(NAME)).unwrap();
        assert_eq!(DataDir::resolve_below(None, &deep, &project).chosen, Chosen::New);
        assert_eq!(
            DataDir::resolve_below(None, &deep, ceiling).path,
            root.path().join(NAME)
        );
        std::fs::remove_dir(root.path().join(NAME)).unwrap();

        std::fs::create_dir(project.join(NAME)).unwrap();
        for cwd in [&project, &deep, &project.join("plugins")] {
            let found = DataDir::resolve_below(None, cwd, ceiling);
            assert_eq!(found.path, project.join(NAME), "from {}", cwd.display());
            assert_eq!(found.chosen, Chosen::Found);
            assert_eq!(found.notice(true), None);
        }
        // A file of that name is not a data directory.
        std::fs::write(deep.join(NAME), "").unwrap();
        assert_eq!(DataDir::resolve_below(None, &deep, ceiling).path, project.join(NAME));

        let given = DataDir::resolve_below(Some(Path::new("state")), &deep, ceiling);
        assert_eq!((given.path, given.chosen), (deep.join("state"), Chosen::Given));
        let absolute = DataDir::resolve_below(Some(Path::new("/srv/jobs")), &deep, ceiling);
        assert_eq!(absolute.path, Path::new("/srv/jobs"));
        assert_eq!(
            DataDir::resolve_below(Some(Path::new("")), &deep, ceiling).chosen,
            Chosen::Found
        );
    }
}
