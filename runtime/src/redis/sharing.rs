//! Queues that wasmjobs and a Ruby Sidekiq process both fetch, read from
//! the processes' heartbeats (each publishes its `queues` in its `info`).
//!
//! A shared queue means each side takes jobs the other serves: Ruby fails
//! a Wasm class with a `NameError`, a runner hands a Ruby class back (see
//! `runner::neighbours`). The runner warns about its own queues; the
//! dashboard shows every shared queue of the cluster. Pure: the processes
//! come from [`super::api::processes`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::api::ProcessInfo;

impl ProcessInfo {
    /// Whether this is a wasmjobs process (its heartbeat's `version` says
    /// so), not a Ruby Sidekiq one.
    pub fn is_wasmjobs(&self) -> bool {
        self.version.as_deref().is_some_and(|v| v.starts_with("wasmjobs"))
    }

    /// Whether this is a Ruby Sidekiq process fetching `queue` at `now`:
    /// not quiet (a quiet process fetches nothing), and beating (its last
    /// beat at most [`LIVE_FOR`] old: a record anyone can write, or one a
    /// dead process left without an expiry, is not a process).
    fn sidekiq_fetching(&self, queue: &str, now: f64) -> bool {
        !self.is_wasmjobs() && !self.quiet && now - self.beat <= LIVE_FOR && self.queues.iter().any(|q| q == queue)
    }
}

/// How old a Ruby process's last beat may be (Sidekiq beats every 5 to
/// 10 s; its process record expires after 60 s).
pub const LIVE_FOR: f64 = 60.0;

/// For each of `queues` that a live Ruby Sidekiq process fetches too at
/// `now` (epoch seconds), those processes.
pub fn sidekiq_sharing<'a>(
    processes: &'a [ProcessInfo],
    queues: &[String],
    now: f64,
) -> BTreeMap<String, Vec<&'a ProcessInfo>> {
    queues
        .iter()
        .filter_map(|queue| {
            let sharers: Vec<&ProcessInfo> = processes.iter().filter(|p| p.sidekiq_fetching(queue, now)).collect();
            (!sharers.is_empty()).then(|| (queue.clone(), sharers))
        })
        .collect()
}

/// One queue both kinds of process fetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharedQueue {
    /// The queue.
    pub queue: String,
    /// The wasmjobs processes fetching it (identities).
    pub wasmjobs: Vec<String>,
    /// The Ruby Sidekiq processes fetching it (identities).
    pub sidekiq: Vec<String>,
}

/// Every queue of the cluster that a wasmjobs process and a live Ruby
/// Sidekiq process both fetch at `now`, by name.
pub fn shared_queues(processes: &[ProcessInfo], now: f64) -> Vec<SharedQueue> {
    let mut ours: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for process in processes.iter().filter(|p| p.is_wasmjobs()) {
        for queue in &process.queues {
            let fetching = ours.entry(queue).or_default();
            if !fetching.contains(&process.identity) {
                fetching.push(process.identity.clone());
            }
        }
    }
    let queues: Vec<String> = ours.keys().map(|q| (*q).to_owned()).collect();
    sidekiq_sharing(processes, &queues, now)
        .into_iter()
        .map(|(queue, sharers)| SharedQueue {
            wasmjobs: ours.get(queue.as_str()).cloned().unwrap_or_default(),
            sidekiq: sharers.iter().map(|p| p.identity.clone()).collect(),
            queue,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 1_800_000_000.0;

    fn process(identity: &str, version: Option<&str>, queues: &[&str], quiet: bool) -> ProcessInfo {
        ProcessInfo {
            identity: identity.into(),
            version: version.map(str::to_owned),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            quiet,
            beat: NOW - 5.0,
            ..ProcessInfo::default()
        }
    }

    #[test]
    fn a_queue_is_shared_when_a_live_ruby_process_fetches_it() {
        let processes = [
            process("w1", Some("wasmjobs 0.1.0"), &["wasm", "default"], false),
            process("w2", Some("wasmjobs 0.1.0"), &["default"], false),
            process("r1", Some("6.4.1"), &["default", "default", "mailers"], false),
            process("r2", None, &["wasm"], true),
            process("r3", None, &["mailers"], false),
            // A record nobody updates any more (or anyone could write).
            ProcessInfo {
                beat: NOW - LIVE_FOR - 1.0,
                ..process("stale", None, &["wasm", "default"], false)
            },
        ];
        let ours = ["wasm".to_owned(), "default".to_owned(), "other".to_owned()];
        let sharing = sidekiq_sharing(&processes, &ours, NOW);
        assert_eq!(sharing.keys().collect::<Vec<_>>(), ["default"]);
        assert_eq!(
            sharing["default"]
                .iter()
                .map(|p| p.identity.as_str())
                .collect::<Vec<_>>(),
            ["r1"]
        );
        assert_eq!(
            shared_queues(&processes, NOW),
            [SharedQueue {
                queue: "default".into(),
                wasmjobs: vec!["w1".into(), "w2".into()],
                sidekiq: vec!["r1".into()],
            }]
        );
        assert!(shared_queues(&processes[..2], NOW).is_empty());
    }
}
