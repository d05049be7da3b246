//! `/plugins`: every plugin the live processes run, merged from the
//! reports their heartbeats publish ([`crate::redis::plugins`]): each
//! version with the processes running it (two during a rolling deploy),
//! its classes, world, grants, limits and schedules; the plugins refused
//! and why; and the recent loads and reloads of every process, newest
//! first. Read-only: nothing here changes a plugin.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use minijinja::context;
use serde::Serialize;

use super::{Failure, Web};
use crate::plugin::describe::{PluginView, Reload};
use crate::redis::api;
use crate::redis::plugins::{self, Report};

/// Most history rows shown (each process keeps its last 20).
const MAX_HISTORY: usize = 200;

pub(super) async fn page(State(web): State<Arc<Web>>) -> Result<Html<String>, Failure> {
    let mut conn = web.conn();
    let processes = api::processes(&mut conn).await?;
    let identities: Vec<String> = processes.into_iter().map(|p| p.identity).collect();
    let reports = plugins::reports(&mut conn, &identities).await?;
    let Merged {
        reporting,
        plugins,
        broken,
        history,
        unreadable,
    } = merge(reports);
    web.view.render(
        "plugins.html",
        context! { active => "/plugins", location => web.location, processes => identities.len(), reporting, plugins, broken, history, unreadable },
    )
}

/// Every process's report, merged.
#[derive(Debug, Default, Serialize)]
struct Merged {
    /// How many processes reported.
    reporting: usize,
    /// By plugin name.
    plugins: Vec<Named>,
    /// Load errors, one row per plugin and error.
    broken: Vec<Refused>,
    /// Loads and reloads of every process, newest first.
    history: Vec<Event>,
    /// Processes whose report could not be read, and why.
    unreadable: Vec<(String, String)>,
}

/// One plugin and the versions running.
#[derive(Debug, Serialize)]
struct Named {
    name: String,
    versions: Vec<Version>,
}

/// One version of a plugin (as the first process reporting it describes
/// it: same version, same component and manifest) and where it runs.
#[derive(Debug, Serialize)]
struct Version {
    view: PluginView,
    processes: Vec<Running>,
}

/// One process running a version, and how that process loaded it.
#[derive(Debug, Serialize)]
struct Running {
    identity: String,
    load: String,
    load_ms: u64,
}

/// One load error and the processes reporting it.
#[derive(Debug, Serialize)]
struct Refused {
    plugin: String,
    error: String,
    processes: Vec<String>,
}

/// One load or reload, and the process it happened in.
#[derive(Debug, Serialize)]
struct Event {
    identity: String,
    #[serde(flatten)]
    reload: Reload,
}

fn merge(reports: Vec<Report>) -> Merged {
    let mut merged = Merged::default();
    let mut by_name: BTreeMap<String, BTreeMap<String, Version>> = BTreeMap::new();
    let mut broken: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for report in reports {
        let described = match report.plugins {
            Ok(described) => described,
            Err(why) => {
                merged.unreadable.push((report.identity, why));
                continue;
            }
        };
        merged.reporting += 1;
        for view in described.plugins {
            let running = Running {
                identity: report.identity.clone(),
                load: view.load.clone(),
                load_ms: view.load_ms,
            };
            by_name
                .entry(view.name.clone())
                .or_default()
                .entry(view.version.clone())
                .or_insert_with(|| Version {
                    view,
                    processes: Vec::new(),
                })
                .processes
                .push(running);
        }
        for refused in described.broken {
            broken
                .entry((refused.plugin, refused.error))
                .or_default()
                .push(report.identity.clone());
        }
        merged.history.extend(described.history.into_iter().map(|reload| Event {
            identity: report.identity.clone(),
            reload,
        }));
    }
    merged.plugins = by_name
        .into_iter()
        .map(|(name, versions)| Named {
            name,
            versions: versions.into_values().collect(),
        })
        .collect();
    merged.broken = broken
        .into_iter()
        .map(|((plugin, error), processes)| Refused {
            plugin,
            error,
            processes,
        })
        .collect();
    merged.history.sort_by(|a, b| {
        b.reload
            .at
            .total_cmp(&a.reload.at)
            .then_with(|| a.identity.cmp(&b.identity))
    });
    merged.history.truncate(MAX_HISTORY);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::describe::{BrokenView, Described};

    static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

    fn view(name: &str, version: &str) -> PluginView {
        PluginView {
            name: name.into(),
            version: version.into(),
            load: "cached".into(),
            // Every process takes its own time to load.
            load_ms: LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..PluginView::default()
        }
    }

    fn identities(version: &Version) -> Vec<&str> {
        version.processes.iter().map(|p| p.identity.as_str()).collect()
    }

    fn reload(at: f64, plugin: &str) -> Reload {
        Reload {
            at,
            plugin: plugin.into(),
            event: "added".into(),
            ..Reload::default()
        }
    }

    #[test]
    fn versions_are_grouped_with_their_processes() {
        let a = Described {
            plugins: vec![view("echo", "v1"), view("fib", "f1")],
            broken: vec![BrokenView {
                plugin: "bad".into(),
                error: "no component".into(),
            }],
            history: vec![reload(10.0, "echo"), reload(30.0, "fib")],
        };
        let b = Described {
            plugins: vec![view("echo", "v2")],
            broken: a.broken.clone(),
            history: vec![reload(20.0, "echo")],
        };
        let c = Described {
            plugins: vec![view("echo", "v1")],
            ..Described::default()
        };
        let reports = vec![
            Report {
                identity: "a".into(),
                plugins: Ok(a),
            },
            Report {
                identity: "b".into(),
                plugins: Ok(b),
            },
            Report {
                identity: "c".into(),
                plugins: Ok(c),
            },
            Report {
                identity: "d".into(),
                plugins: Err("not a plugin report".into()),
            },
        ];
        let merged = merge(reports);
        assert_eq!(merged.reporting, 3);
        let names: Vec<&str> = merged.plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["echo", "fib"]);
        let echo = &merged.plugins[0].versions;
        assert_eq!(echo.len(), 2);
        // Each process loaded v1 in its own time: still one version.
        assert_eq!(
            (echo[0].view.version.as_str(), identities(&echo[0])),
            ("v1", vec!["a", "c"])
        );
        assert_eq!((echo[1].view.version.as_str(), identities(&echo[1])), ("v2", vec!["b"]));
        assert_ne!(echo[0].processes[0].load_ms, echo[0].processes[1].load_ms);
        assert_eq!(merged.broken.len(), 1);
        assert_eq!(merged.broken[0].processes, ["a", "b"]);
        let times: Vec<f64> = merged.history.iter().map(|e| e.reload.at).collect();
        assert_eq!(times, [30.0, 20.0, 10.0]);
        assert_eq!(merged.unreadable, [("d".to_owned(), "not a plugin report".to_owned())]);
    }
}
