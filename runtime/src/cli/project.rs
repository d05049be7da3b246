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
    /// The data directory for a command run in `cwd` that loads the
    /// plugins directory `plugins` (if any): `given`, else the nearest
    /// `.wasmjobs` in `plugins` or a parent, else in `cwd` or a parent,
    /// else a new one beside `plugins` (in `cwd` without it).
    pub(crate) fn resolve(given: Option<&Path>, cwd: &Path, plugins: Option<&Path>) -> DataDir {
        Self::resolve_below(given, cwd, plugins, Path::new("/"))
    }

    /// [`DataDir::resolve`], looking in no parent above `ceiling` (the
    /// tests' own temporary directory: a `.wasmjobs` someone left in
    /// `/tmp` must not decide them).
    fn resolve_below(given: Option<&Path>, cwd: &Path, plugins: Option<&Path>, ceiling: &Path) -> DataDir {
        if let Some(given) = given.filter(|g| !g.as_os_str().is_empty()) {
            return DataDir {
                path: cwd.join(given),
                chosen: Chosen::Given,
            };
        }
        // `./plugins` as `cwd/plugins`, without `.` and `..` parts.
        let plugins = plugins
            .filter(|p| !p.as_os_str().is_empty())
            .and_then(|p| std::path::absolute(cwd.join(p)).ok())
            .map(|p| normalized(&p));
        let nearest = |from: &Path| {
            from.ancestors()
                .take_while(|dir| dir.starts_with(ceiling))
                .map(|dir| dir.join(NAME))
                .find(|dir| dir.is_dir())
        };
        let found = plugins.as_deref().and_then(nearest).or_else(|| nearest(cwd));
        match found {
            Some(path) => DataDir {
                path,
                chosen: Chosen::Found,
            },
            None => DataDir {
                path: plugins.as_deref().and_then(Path::parent).unwrap_or(cwd).join(NAME),
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

/// `path` with its `..` parts applied lexically (`a/b/../c` is `a/c`).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exec --plugins <project>/plugins` run from another directory made
    /// a new `.wasmjobs` there and compiled every plugin again.
    #[test]
    fn a_plugins_directory_finds_its_projects_data_directory_from_anywhere() {
        let root = tempfile::tempdir().unwrap();
        let ceiling = root.path();
        let project = root.path().join("app");
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir_all(project.join("plugins")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let plugins = project.join("plugins");

        // None yet: made beside the plugins directory, not in cwd.
        let fresh = DataDir::resolve_below(None, &elsewhere, Some(&plugins), ceiling);
        assert_eq!((fresh.path, fresh.chosen), (project.join(NAME), Chosen::New));
        let relative = DataDir::resolve_below(None, &elsewhere, Some(Path::new("../app/plugins")), ceiling);
        assert_eq!(relative.path, project.join(NAME));

        std::fs::create_dir(project.join(NAME)).unwrap();
        std::fs::create_dir(elsewhere.join(NAME)).unwrap();
        for given in [
            plugins.clone(),
            PathBuf::from("../app/plugins"),
            PathBuf::from("../app/./plugins/"),
        ] {
            let found = DataDir::resolve_below(None, &elsewhere, Some(&given), ceiling);
            assert_eq!(
                (found.path, found.chosen),
                (project.join(NAME), Chosen::Found),
                "--plugins {}",
                given.display()
            );
        }
        // `./plugins` from the project: the project's, as before.
        let here = DataDir::resolve_below(None, &project, Some(Path::new("./plugins")), ceiling);
        assert_eq!(here.path, project.join(NAME));
        // A plugins directory in no project: the current directory's.
        std::fs::create_dir(root.path().join("loose")).unwrap();
        let loose = DataDir::resolve_below(None, &elsewhere, Some(&root.path().join("loose")), ceiling);
        assert_eq!((loose.path, loose.chosen), (elsewhere.join(NAME), Chosen::Found));
    }

    #[test]
    fn the_nearest_data_directory_up_the_tree_is_the_projects() {
        let root = tempfile::tempdir().unwrap();
        let ceiling = root.path();
        let project = root.path().join("app");
        let deep = project.join("plugins/greet/src");
        std::fs::create_dir_all(&deep).unwrap();

        let fresh = DataDir::resolve_below(None, &deep, None, ceiling);
        assert_eq!(
            (fresh.path.clone(), fresh.chosen.clone()),
            (deep.join(NAME), Chosen::New)
        );
        assert!(fresh.notice(true).unwrap().contains("new, empty embedded Redis"));
        assert!(!fresh.notice(false).unwrap().contains("Redis"));
        // Nothing above the ceiling is looked at.
        std::fs::create_dir(root.path().join(NAME)).unwrap();
        assert_eq!(DataDir::resolve_below(None, &deep, None, &project).chosen, Chosen::New);
        assert_eq!(
            DataDir::resolve_below(None, &deep, None, ceiling).path,
            root.path().join(NAME)
        );
        std::fs::remove_dir(root.path().join(NAME)).unwrap();

        std::fs::create_dir(project.join(NAME)).unwrap();
        for cwd in [&project, &deep, &project.join("plugins")] {
            let found = DataDir::resolve_below(None, cwd, None, ceiling);
            assert_eq!(found.path, project.join(NAME), "from {}", cwd.display());
            assert_eq!(found.chosen, Chosen::Found);
            assert_eq!(found.notice(true), None);
        }
        // A file of that name is not a data directory.
        std::fs::write(deep.join(NAME), "").unwrap();
        assert_eq!(
            DataDir::resolve_below(None, &deep, None, ceiling).path,
            project.join(NAME)
        );

        let given = DataDir::resolve_below(Some(Path::new("state")), &deep, None, ceiling);
        assert_eq!((given.path, given.chosen), (deep.join("state"), Chosen::Given));
        let absolute = DataDir::resolve_below(Some(Path::new("/srv/jobs")), &deep, None, ceiling);
        assert_eq!(absolute.path, Path::new("/srv/jobs"));
        assert_eq!(
            DataDir::resolve_below(Some(Path::new("")), &deep, None, ceiling).chosen,
            Chosen::Found
        );
    }
}
