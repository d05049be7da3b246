//! What the suite runs: the seed report's workloads
//! (`../shared/reference/seeds/000_49d14a81a23d6fa0.txt`) as a list of
//! [`Case`]s, in full or reduced (`--quick`), plus issue 15's HTTP/2
//! cases and its memory-per-in-flight-job cases (`http-held`,
//! `http2-held`: C jobs held open by the server while the worker's RSS and
//! PSS are read), each also as an async job (`http-async`, `http2-async`,
//! `http-async-held`, `http2-async-held`: `AsyncHttpGetJob`, a hundred jobs
//! to an instance). Every noop and HTTP case runs twice, back to back: through
//! wasmjobs, then through the native baseline (`wasmjobs-native`, see
//! `benches/native/main.rs`), so each figure has its ratio to the design's
//! physical limit from the same run.

use std::time::Duration;

use serde::Serialize;

/// One of the seed's job kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `NoopJob`: does nothing; measures the engine's own cost per job.
    Noop,
    /// `HttpGetJob` against a local endpoint that sleeps 200 ms, over HTTP/1.1.
    Http,
    /// The same against an HTTP/2-only server (prior knowledge): the
    /// plugin's rule says `h2 = true`, the native twin speaks HTTP/2 too.
    Http2,
    /// Memory per in-flight job over HTTP/1.1: C `HttpGetJob`s on a route
    /// the server holds open until the suite has read the worker's memory.
    HttpHeld,
    /// The same over HTTP/2.
    Http2Held,
    /// `Http`'s GET as the Rust SDK's `AsyncJob` (`AsyncHttpGetJob`,
    /// `plugins/http-get-async`): up to 100 jobs at once in one instance
    /// (`[instances] concurrent = 100`) instead of a fresh instance each.
    AsyncHttp,
    /// The same over HTTP/2.
    AsyncHttp2,
    /// `HttpHeld` with `AsyncHttpGetJob`.
    AsyncHttpHeld,
    /// `Http2Held` with `AsyncHttpGetJob`.
    AsyncHttp2Held,
    /// `PgSleepJob`: `SELECT pg_sleep(0.1)` on a real PostgreSQL.
    PgSleep,
    /// `FileAppendJob`: appends its id to one file in its preopened dir.
    FileAppend,
    /// `FibJob(25)`: recursive Fibonacci, CPU only.
    Fib,
    /// No jobs: what the runner costs while waiting.
    Idle,
}

impl Workload {
    /// Every workload, in the order the suite runs them.
    pub const ALL: [Workload; 13] = [
        Workload::Noop,
        Workload::Http,
        Workload::Http2,
        Workload::HttpHeld,
        Workload::Http2Held,
        Workload::AsyncHttp,
        Workload::AsyncHttp2,
        Workload::AsyncHttpHeld,
        Workload::AsyncHttp2Held,
        Workload::PgSleep,
        Workload::FileAppend,
        Workload::Fib,
        Workload::Idle,
    ];

    /// The name used by `--only` and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Noop => "noop",
            Workload::Http => "http",
            Workload::Http2 => "http2",
            Workload::HttpHeld => "http-held",
            Workload::Http2Held => "http2-held",
            Workload::AsyncHttp => "http-async",
            Workload::AsyncHttp2 => "http2-async",
            Workload::AsyncHttpHeld => "http-async-held",
            Workload::AsyncHttp2Held => "http2-async-held",
            Workload::PgSleep => "pg-sleep",
            Workload::FileAppend => "file-append",
            Workload::Fib => "fib",
            Workload::Idle => "idle",
        }
    }

    /// Its example plugin's directory under `plugins/`.
    pub fn plugin(self) -> &'static str {
        match self {
            Workload::Noop | Workload::Idle => "noop",
            Workload::Http | Workload::Http2 | Workload::HttpHeld | Workload::Http2Held => "http-get",
            Workload::AsyncHttp | Workload::AsyncHttp2 | Workload::AsyncHttpHeld | Workload::AsyncHttp2Held => {
                "http-get-async"
            }
            Workload::PgSleep => "pg-sleep",
            Workload::FileAppend => "file-append",
            Workload::Fib => "fib",
        }
    }

    /// The job class it pushes.
    pub fn class(self) -> &'static str {
        match self {
            Workload::Noop | Workload::Idle => "NoopJob",
            Workload::Http | Workload::Http2 | Workload::HttpHeld | Workload::Http2Held => "HttpGetJob",
            Workload::AsyncHttp | Workload::AsyncHttp2 | Workload::AsyncHttpHeld | Workload::AsyncHttp2Held => {
                "AsyncHttpGetJob"
            }
            Workload::PgSleep => "PgSleepJob",
            Workload::FileAppend => "FileAppendJob",
            Workload::Fib => "FibJob",
        }
    }

    /// Whether its jobs GET the suite's HTTP server.
    pub fn http(self) -> bool {
        matches!(
            self,
            Workload::Http
                | Workload::Http2
                | Workload::HttpHeld
                | Workload::Http2Held
                | Workload::AsyncHttp
                | Workload::AsyncHttp2
                | Workload::AsyncHttpHeld
                | Workload::AsyncHttp2Held
        )
    }

    /// Whether it speaks HTTP/2 (to the suite's HTTP/2-only server).
    pub fn h2(self) -> bool {
        matches!(
            self,
            Workload::Http2 | Workload::Http2Held | Workload::AsyncHttp2 | Workload::AsyncHttp2Held
        )
    }

    /// Whether the server holds every request open until the suite has
    /// read the worker's memory (then the jobs finish).
    pub fn held(self) -> bool {
        matches!(
            self,
            Workload::HttpHeld | Workload::Http2Held | Workload::AsyncHttpHeld | Workload::AsyncHttp2Held
        )
    }

    /// How long one job waits on IO, for the efficiency floor
    /// (N × wait / C); `None` for workloads that are not IO-bound.
    pub fn io_wait(self) -> Option<Duration> {
        match self {
            Workload::Http | Workload::Http2 | Workload::AsyncHttp | Workload::AsyncHttp2 => {
                Some(Duration::from_millis(200))
            }
            Workload::PgSleep => Some(Duration::from_millis(100)),
            _ => None,
        }
    }
}

/// How the runner takes jobs off the queue (`--fetch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fetch {
    /// At-least-once: each job is held in a per-process list until acked.
    Reliable,
    /// At-most-once: a plain pop, as Sidekiq's default `BasicFetch`.
    Basic,
}

impl Fetch {
    /// The `--fetch` value.
    pub fn flag(self) -> &'static str {
        match self {
            Fetch::Reliable => "reliable",
            Fetch::Basic => "basic",
        }
    }
}

/// What takes the jobs off the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Processor {
    /// `wasmjobs run`: each job a fresh WebAssembly instance.
    Wasmjobs,
    /// `wasmjobs-native`: the same fetch protocol, the same work in plain
    /// Rust, no Wasm.
    Native,
}

impl Processor {
    /// The name in progress lines.
    pub fn name(self) -> &'static str {
        match self {
            Processor::Wasmjobs => "wasmjobs",
            Processor::Native => "native",
        }
    }
}

/// One measured run: a processor, a workload, a fetch mode, a concurrency
/// and a job count (or, for [`Workload::Idle`], a duration).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// wasmjobs or the native baseline.
    pub processor: Processor,
    /// What the jobs do.
    pub workload: Workload,
    /// `--fetch`.
    pub fetch: Fetch,
    /// `--concurrency`.
    pub concurrency: u32,
    /// Jobs pushed before the runner starts (0 for idle).
    pub jobs: u64,
    /// How long an idle case watches the runner.
    pub idle: Duration,
}

impl Case {
    fn new(workload: Workload, fetch: Fetch, concurrency: u32, jobs: u64) -> Self {
        Self {
            processor: Processor::Wasmjobs,
            workload,
            fetch,
            concurrency,
            jobs,
            idle: Duration::ZERO,
        }
    }
}

/// Jobs in flight at once in the memory cases (the C=10,000).
pub const HELD_CONCURRENCY: u32 = 10_000;

/// The cases to run: the seed's full set, or the `--quick` subset (under
/// five minutes on a 2-core machine), restricted to `only` when given.
pub fn cases(quick: bool, only: &[Workload]) -> Vec<Case> {
    let mut cases = Vec::new();
    let io_concurrencies: &[u32] = if quick { &[100] } else { &[5, 10, 15, 50, 100] };
    for workload in Workload::ALL {
        if !only.is_empty() && !only.contains(&workload) {
            continue;
        }
        match workload {
            Workload::Noop => {
                let sizes: &[u64] = if quick { &[100_000] } else { &[100_000, 1_000_000] };
                let concurrencies: &[u32] = if quick { &[10, 100] } else { &[5, 10, 50, 100, 1_000] };
                for &jobs in sizes {
                    for fetch in [Fetch::Reliable, Fetch::Basic] {
                        for &c in concurrencies {
                            cases.push(Case::new(workload, fetch, c, jobs));
                        }
                    }
                }
            }
            Workload::Http => {
                for &c in io_concurrencies {
                    cases.push(Case::new(workload, Fetch::Reliable, c, 1_000));
                }
                cases.push(Case::new(workload, Fetch::Reliable, 1_000, 10_000));
                if !quick {
                    cases.push(Case::new(workload, Fetch::Reliable, 10_000, 100_000));
                }
            }
            Workload::Http2 | Workload::AsyncHttp | Workload::AsyncHttp2 => {
                cases.push(Case::new(workload, Fetch::Reliable, 1_000, 10_000));
                if !quick {
                    cases.push(Case::new(workload, Fetch::Reliable, 10_000, 100_000));
                }
            }
            Workload::HttpHeld | Workload::Http2Held | Workload::AsyncHttpHeld | Workload::AsyncHttp2Held => {
                // N = C: every job in flight at once. Short even in the
                // full set (the time is the fill-up), so the same in both.
                cases.push(Case::new(
                    workload,
                    Fetch::Reliable,
                    HELD_CONCURRENCY,
                    u64::from(HELD_CONCURRENCY),
                ));
            }
            Workload::PgSleep => {
                for &c in io_concurrencies {
                    cases.push(Case::new(workload, Fetch::Reliable, c, 1_000));
                }
            }
            Workload::FileAppend => {
                for &c in io_concurrencies {
                    cases.push(Case::new(workload, Fetch::Reliable, c, 50_000));
                }
            }
            Workload::Fib => {
                let concurrencies: &[u32] = if quick { &[5] } else { &[5, 10] };
                for &c in concurrencies {
                    cases.push(Case::new(workload, Fetch::Reliable, c, 100));
                }
            }
            Workload::Idle => {
                let concurrencies: &[u32] = if quick { &[100] } else { &[5, 10, 100, 1_000] };
                let idle = Duration::from_secs(if quick { 20 } else { 180 });
                for &c in concurrencies {
                    cases.push(Case {
                        idle,
                        ..Case::new(workload, Fetch::Reliable, c, 0)
                    });
                }
            }
        }
    }
    with_native_twins(cases)
}

/// `cases` with a native twin right after each noop and HTTP case.
fn with_native_twins(cases: Vec<Case>) -> Vec<Case> {
    let mut all = Vec::with_capacity(cases.len() * 2);
    for case in cases {
        all.push(case);
        if case.workload == Workload::Noop || case.workload.http() {
            all.push(Case {
                processor: Processor::Native,
                ..case
            });
        }
    }
    all
}

/// Parses `--only noop,http`.
pub fn parse_only(list: &str) -> anyhow::Result<Vec<Workload>> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            Workload::ALL.into_iter().find(|w| w.name() == name).ok_or_else(|| {
                let names: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
                anyhow::anyhow!("unknown workload {name:?} (expected one of {})", names.join(", "))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_set_matches_the_seed() {
        let cases = cases(false, &[]);
        let count = |w: Workload| {
            cases
                .iter()
                .filter(|c| c.workload == w && c.processor == Processor::Wasmjobs)
                .count()
        };
        assert_eq!(count(Workload::Noop), 20);
        assert_eq!(count(Workload::Http), 7);
        assert_eq!(count(Workload::Http2), 2);
        assert_eq!(count(Workload::HttpHeld), 1);
        assert_eq!(count(Workload::Http2Held), 1);
        assert_eq!(count(Workload::PgSleep), 5);
        assert_eq!(count(Workload::FileAppend), 5);
        assert_eq!(count(Workload::Fib), 2);
        assert_eq!(count(Workload::Idle), 4);
        assert!(
            cases
                .iter()
                .any(|c| c.workload == Workload::Http && c.concurrency == 10_000 && c.jobs == 100_000)
        );
    }

    #[test]
    fn noop_and_http_cases_have_a_native_twin_right_after() {
        let cases = cases(true, &[]);
        let natives: Vec<_> = cases
            .iter()
            .enumerate()
            .filter(|(_, c)| c.processor == Processor::Native)
            .collect();
        let twinned = cases
            .iter()
            .filter(|c| (c.workload == Workload::Noop || c.workload.http()) && c.processor == Processor::Wasmjobs)
            .count();
        assert_eq!(natives.len(), twinned);
        for (i, native) in natives {
            let wasm = &cases[i - 1];
            assert_eq!(wasm.processor, Processor::Wasmjobs);
            assert_eq!(
                (wasm.workload, wasm.fetch, wasm.concurrency, wasm.jobs),
                (native.workload, native.fetch, native.concurrency, native.jobs)
            );
        }
    }

    #[test]
    fn http2_runs_at_the_sizes_of_http_from_c_1000() {
        for quick in [true, false] {
            let sizes = |w: Workload| -> Vec<(u32, u64)> {
                cases(quick, &[w])
                    .iter()
                    .filter(|c| c.processor == Processor::Wasmjobs && c.concurrency >= 1_000)
                    .map(|c| (c.concurrency, c.jobs))
                    .collect()
            };
            let expected = if quick {
                vec![(1_000, 10_000)]
            } else {
                vec![(1_000, 10_000), (10_000, 100_000)]
            };
            assert_eq!(sizes(Workload::Http2), expected, "quick: {quick}");
            assert_eq!(sizes(Workload::Http), expected, "quick: {quick}");
        }
        assert!(Workload::Http2.h2() && Workload::Http2.http() && !Workload::Http.h2());
        assert_eq!(Workload::Http2.class(), Workload::Http.class());
    }

    #[test]
    fn the_memory_cases_hold_every_job_at_once_in_both_sets() {
        for quick in [true, false] {
            let held: Vec<Case> = cases(quick, &[]).into_iter().filter(|c| c.workload.held()).collect();
            // Four workloads (HTTP/1.1 and HTTP/2, fresh instances and
            // async jobs), each through wasmjobs and native.
            assert_eq!(held.len(), 8, "quick: {quick}");
            for case in held {
                assert_eq!((case.concurrency, case.jobs), (10_000, 10_000));
                assert!(case.workload.http() && case.workload.io_wait().is_none());
            }
        }
        assert!(Workload::Http2Held.h2() && !Workload::HttpHeld.h2());
        assert_eq!(parse_only("http-held,http2-held").unwrap().len(), 2);
        assert_eq!(
            parse_only("http-async,http2-async-held").unwrap(),
            [Workload::AsyncHttp, Workload::AsyncHttp2Held]
        );
        assert!(Workload::AsyncHttp2Held.h2() && Workload::AsyncHttp2Held.held());
        assert_eq!(Workload::AsyncHttp.class(), "AsyncHttpGetJob");
        assert_eq!(Workload::AsyncHttp.io_wait(), Workload::Http.io_wait());
    }

    #[test]
    fn only_filters_and_rejects_unknown_names() {
        let only = parse_only("http, idle").unwrap();
        assert!(cases(true, &only).iter().all(|c| only.contains(&c.workload)));
        assert!(parse_only("nope").unwrap_err().to_string().contains("unknown workload"));
    }
}
