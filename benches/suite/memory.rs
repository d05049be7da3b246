//! A worker's memory as Linux accounts it: RSS (`VmRSS` of
//! `/proc/PID/status`), PSS (`Pss:` of `/proc/PID/smaps_rollup`: each
//! resident page divided by the number of mappings of it), and the
//! mappings of `/proc/PID/smaps` grouped by [`Kind`], which says what to
//! shrink.
//!
//! The kinds are told apart by the shape of the address space, as
//! Wasmtime's pooling allocator and the allocators lay it out ([`classify`]):
//! linear memories are the pieces of the pool's multi-GiB reservations;
//! data images are the compiled component's (`.cwasm`, or a memfd)
//! copy-on-write mappings inside them; stacks are a 4 KiB guard followed
//! by a read-write mapping, the fiber stacks being the one long run of
//! them (longer than the process has threads); the table pool is the one
//! read-write anonymous mapping over 1 GiB that is not a whole number of
//! GiB (mimalloc reserves its arenas in whole GiB).

use anyhow::{Context, Result};
use serde::Serialize;

/// RSS and PSS of a process at one moment, KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Resident set size (`VmRSS`).
    pub rss_kb: u64,
    /// Proportional set size (`Pss` of `smaps_rollup`).
    pub pss_kb: u64,
}

/// Reads `pid`'s RSS and PSS now.
pub fn read(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
    Ok(Memory {
        rss_kb: field(&status, "VmRSS").context("no VmRSS in /proc/PID/status")?,
        pss_kb: field(&rollup, "Pss").context("no Pss in /proc/PID/smaps_rollup")?,
    })
}

/// The number of a `Name:   1234 kB` (or `Name:\t12`) line.
pub fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// What a memory case measured of one worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Held {
    /// Jobs in flight when it was read: the case's C, every one held open
    /// by the HTTP server.
    pub in_flight: u64,
    /// Seconds from the first job pushed until the server held them all.
    pub fill_s: f64,
    /// Before any job was fetched (right after the worker logged " running").
    pub idle: Memory,
    /// With every job in flight.
    pub held: Memory,
    /// The held moment's mappings by kind.
    pub breakdown: Breakdown,
}

impl Held {
    /// (held − idle) ÷ jobs in flight, KiB: (RSS, PSS).
    pub fn per_job_kb(&self) -> (f64, f64) {
        let per_job = |held: u64, idle: u64| (held as f64 - idle as f64) / self.in_flight.max(1) as f64;
        (
            per_job(self.held.rss_kb, self.idle.rss_kb),
            per_job(self.held.pss_kb, self.idle.pss_kb),
        )
    }
}

/// One mapping of `/proc/PID/smaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `rw-p` and the like.
    pub perms: String,
    /// The file, `[heap]`, `[stack]`, … ("" for anonymous memory).
    pub path: String,
    /// Resident, KiB.
    pub rss_kb: u64,
    /// Proportional, KiB.
    pub pss_kb: u64,
}

impl Mapping {
    /// Virtual size, KiB.
    pub fn size_kb(&self) -> u64 {
        (self.end - self.start) / 1024
    }

    fn anonymous(&self) -> bool {
        self.path.is_empty() || self.path.starts_with("[anon:")
    }
}

/// Parses `/proc/PID/smaps`.
pub fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        if let Some(mapping) = header(line) {
            mappings.push(mapping);
            continue;
        }
        let Some(last) = mappings.last_mut() else {
            continue;
        };
        if let Some(kb) = field(line, "Rss") {
            last.rss_kb = kb;
        } else if let Some(kb) = field(line, "Pss") {
            last.pss_kb = kb;
        }
    }
    mappings
}

/// `start-end perms offset dev inode [path]`, or `None` for a field line.
fn header(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?.to_owned();
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim().to_owned();
    Some(Mapping {
        start,
        end,
        perms,
        path,
        rss_kb: 0,
        pss_kb: 0,
    })
}

/// Reads and parses `/proc/PID/smaps`.
pub fn smaps(pid: u32) -> Result<Vec<Mapping>> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/smaps")).with_context(|| format!("reading /proc/{pid}/smaps"))?;
    Ok(parse_smaps(&text))
}

/// What a mapping holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Anonymous memory of the allocators: mimalloc's arenas, glibc's
    /// arenas, `[heap]`: instance state, hyper, the runner's own tables.
    Heap,
    /// Wasmtime's pool of linear memories: the anonymous pieces of each
    /// slot (the guest's stack and heap pages) and the reservations.
    LinearMemory,
    /// Each instance's data image, mapped copy-on-write from the compiled
    /// component (`.cwasm`) or a memfd: clean pages are shared.
    DataImage,
    /// Wasmtime's table pool (funcref tables).
    Tables,
    /// Wasmtime's pool of fiber stacks (one per slot) and their guards.
    FiberStacks,
    /// The threads' stacks and signal stacks.
    ThreadStacks,
    /// Other file mappings: the binary, libraries, compiled code.
    File,
    /// Everything else: `[vdso]`, guards and reservations with nothing resident.
    Other,
}

impl Kind {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Heap => "anon heap (mimalloc/glibc arenas, [heap])",
            Kind::LinearMemory => "wasm linear memories (pool)",
            Kind::DataImage => "wasm data images (CoW from .cwasm/memfd)",
            Kind::Tables => "wasm tables (pool)",
            Kind::FiberStacks => "wasm fiber stacks (pool)",
            Kind::ThreadStacks => "thread and signal stacks",
            Kind::File => "file-backed (binary, libraries, code)",
            Kind::Other => "other (vdso, guards, reservations)",
        }
    }

    /// A short name, for lists.
    pub fn short(self) -> &'static str {
        match self {
            Kind::Heap => "heap",
            Kind::LinearMemory => "linear memory",
            Kind::DataImage => "data image",
            Kind::Tables => "tables",
            Kind::FiberStacks => "fiber stacks",
            Kind::ThreadStacks => "thread stacks",
            Kind::File => "file",
            Kind::Other => "other",
        }
    }
}

const GIB_KB: u64 = 1 << 20;
/// A guard page below a stack.
const GUARD_KB: u64 = 4;
/// The largest mapping taken for a stack.
const MAX_STACK_KB: u64 = 64 << 10;

/// The kind of each of `mappings` (in address order, as smaps lists
/// them), for a process with `threads` threads.
pub fn classify(mappings: &[Mapping], threads: usize) -> Vec<Kind> {
    let mut kinds: Vec<Option<Kind>> = mappings.iter().map(named).collect();
    let adjacent = |a: usize, b: usize| mappings[a].end == mappings[b].start;
    // The memory pool: its reservations, and the anonymous pieces beside
    // them or beside a data image.
    for (i, m) in mappings.iter().enumerate() {
        if m.anonymous() && m.perms.starts_with("---") && m.size_kb() >= GIB_KB {
            kinds[i] = Some(Kind::LinearMemory);
        }
    }
    let pool_or_image = |kind: Option<Kind>| matches!(kind, Some(Kind::DataImage | Kind::LinearMemory));
    let pieces: Vec<usize> = (0..mappings.len())
        .filter(|&i| kinds[i].is_none() && mappings[i].anonymous())
        .filter(|&i| {
            let before = i > 0 && adjacent(i - 1, i) && pool_or_image(kinds[i - 1]);
            let after = i + 1 < mappings.len() && adjacent(i, i + 1) && pool_or_image(kinds[i + 1]);
            before || after
        })
        .collect();
    for i in pieces {
        kinds[i] = Some(Kind::LinearMemory);
    }
    // Stacks: runs of guard + stack pairs of one size, each pair right
    // above the last.
    let is_pair = |i: usize, kinds: &[Option<Kind>]| {
        let (guard, stack) = (&mappings[i], mappings.get(i + 1));
        kinds[i].is_none()
            && guard.anonymous()
            && guard.perms.starts_with("---")
            && guard.size_kb() == GUARD_KB
            && stack.is_some_and(|s| {
                s.anonymous() && s.perms.starts_with("rw") && s.size_kb() <= MAX_STACK_KB && guard.end == s.start
            })
    };
    let mut i = 0;
    while i < mappings.len() {
        if !is_pair(i, &kinds) {
            i += 1;
            continue;
        }
        let size = mappings[i + 1].size_kb();
        let mut end = i + 2;
        while end + 1 < mappings.len()
            && is_pair(end, &kinds)
            && adjacent(end - 1, end)
            && mappings[end + 1].size_kb() == size
        {
            end += 2;
        }
        let kind = if (end - i) / 2 > threads {
            Kind::FiberStacks
        } else {
            Kind::ThreadStacks
        };
        for k in &mut kinds[i..end] {
            *k = Some(kind);
        }
        i = end;
    }
    mappings
        .iter()
        .zip(kinds)
        .map(|(m, kind)| {
            kind.unwrap_or(if m.perms.starts_with("---") {
                Kind::Other
            } else if m.size_kb() > GIB_KB && m.size_kb() % GIB_KB != 0 {
                Kind::Tables
            } else {
                Kind::Heap
            })
        })
        .collect()
}

/// The kind a mapping's name alone gives (`None` for anonymous memory).
fn named(m: &Mapping) -> Option<Kind> {
    if m.anonymous() {
        return None;
    }
    Some(match m.path.as_str() {
        "[heap]" => Kind::Heap,
        "[stack]" => Kind::ThreadStacks,
        path if path.starts_with('[') => Kind::Other,
        path if path.starts_with("/memfd:") => Kind::DataImage,
        // The compiled component's code is read-only; its data images are
        // the private writable mappings of it.
        path if path.ends_with(".cwasm") && m.perms.starts_with("rw") => Kind::DataImage,
        _ => Kind::File,
    })
}

/// One kind's mappings, added up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindTotal {
    /// The kind.
    pub kind: Kind,
    /// How many mappings.
    pub mappings: u64,
    /// Virtual size, KiB.
    pub size_kb: u64,
    /// Resident, KiB.
    pub rss_kb: u64,
    /// Proportional, KiB.
    pub pss_kb: u64,
}

/// One of the largest mappings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Largest {
    /// Its kind.
    pub kind: Kind,
    /// `rw-p` and the like.
    pub perms: String,
    /// The file (file name only), or "" for anonymous memory.
    pub name: String,
    /// Virtual size, KiB.
    pub size_kb: u64,
    /// Resident, KiB.
    pub rss_kb: u64,
    /// Proportional, KiB.
    pub pss_kb: u64,
}

/// The mappings by kind (largest RSS first), and the largest single ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Every kind present, largest RSS first.
    pub kinds: Vec<KindTotal>,
    /// The mappings with the most RSS, largest first.
    pub largest: Vec<Largest>,
}

/// Adds up `mappings` by kind and keeps the `top` largest by RSS.
pub fn breakdown(mappings: &[Mapping], threads: usize, top: usize) -> Breakdown {
    let kinds = classify(mappings, threads);
    let mut totals: Vec<KindTotal> = Vec::new();
    for (m, &kind) in mappings.iter().zip(&kinds) {
        let index = match totals.iter().position(|t| t.kind == kind) {
            Some(index) => index,
            None => {
                totals.push(KindTotal {
                    kind,
                    mappings: 0,
                    size_kb: 0,
                    rss_kb: 0,
                    pss_kb: 0,
                });
                totals.len() - 1
            }
        };
        let total = &mut totals[index];
        total.mappings += 1;
        total.size_kb += m.size_kb();
        total.rss_kb += m.rss_kb;
        total.pss_kb += m.pss_kb;
    }
    totals.sort_by(|a, b| b.rss_kb.cmp(&a.rss_kb).then(a.kind.cmp(&b.kind)));
    let mut order: Vec<usize> = (0..mappings.len()).collect();
    order.sort_by(|&a, &b| mappings[b].rss_kb.cmp(&mappings[a].rss_kb).then(a.cmp(&b)));
    let largest = order
        .into_iter()
        .take(top)
        .filter(|&i| mappings[i].rss_kb > 0)
        .map(|i| {
            let m = &mappings[i];
            Largest {
                kind: kinds[i],
                perms: m.perms.clone(),
                name: m.path.rsplit('/').next().unwrap_or("").to_owned(),
                size_kb: m.size_kb(),
                rss_kb: m.rss_kb,
                pss_kb: m.pss_kb,
            }
        })
        .collect();
    Breakdown { kinds: totals, largest }
}

/// `pid`'s mappings by kind now (`/proc/PID/smaps`, and its thread count
/// from `/proc/PID/status`).
pub fn read_breakdown(pid: u32, top: usize) -> Result<Breakdown> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let threads = field(&status, "Threads").context("no Threads in /proc/PID/status")?;
    Ok(breakdown(&smaps(pid)?, threads as usize, top))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One smaps entry (with a few of the fields the kernel prints).
    fn entry(start: u64, kb: u64, perms: &str, path: &str, rss: u64, pss: u64) -> String {
        let end = start + kb * 1024;
        format!(
            "{start:x}-{end:x} {perms} 00000000 00:00 0                          {path}\n\
             Size:           {kb:>8} kB\nKernelPageSize:        4 kB\nRss:            {rss:>8} kB\n\
             Pss:            {pss:>8} kB\nPss_Dirty:             0 kB\nAnonymous:      {rss:>8} kB\n\
             VmFlags: rd wr mr mw me nr \n"
        )
    }

    /// A worker's address space at the held moment, in the shape a
    /// `wasmjobs run -c 2` had at C=10,000 (fewer slots).
    fn layout() -> String {
        let mut text = String::new();
        let mut at = 0x200_0000_0000u64;
        let mut push = |kb: u64, perms: &str, path: &str, rss: u64, pss: u64, gap: bool| {
            if gap {
                at += 1 << 30;
            }
            text.push_str(&entry(at, kb, perms, path, rss, pss));
            at += kb * 1024;
        };
        push(GIB_KB, "rw-p", "", 1_000, 1_000, false); // a mimalloc arena
        push(32 << 10, "---p", "", 0, 0, true); // the memory pool's guard
        for _ in 0..2 {
            push(1024, "rw-p", "", 4, 4, false); // the guest's stack
            push(36, "rw-p", "/data/cache/abc.cwasm", 36, 6, false);
            push(28, "rw-p", "", 4, 4, false); // the guest's heap
            push(4 * GIB_KB + 1, "---p", "", 0, 0, false);
        }
        push(3, "r-xp", "/usr/bin/wasmjobs", 300, 300, true);
        push(132, "rw-p", "[heap]", 8, 8, true);
        for i in 0..5 {
            push(GUARD_KB, "---p", "", 0, 0, i == 0); // fiber stacks
            push(2048, "rw-p", "", 8, 8, false);
        }
        push(6 * GIB_KB + 7, "rw-p", "", 80, 80, false); // the table pool
        push(GUARD_KB, "---p", "", 0, 0, true); // a thread's stack
        push(2048, "rw-p", "", 12, 12, false);
        push(GUARD_KB, "---p", "", 0, 0, false); // its signal stack
        push(8, "rw-p", "", 0, 0, false);
        push(8, "r-xp", "[vdso]", 4, 4, true);
        push(4, "rw-p", "/memfd:wasm-memory-image (deleted)", 4, 1, true);
        push(132, "rw-p", "[stack]", 60, 60, true);
        text
    }

    #[test]
    fn per_job_memory_is_the_growth_over_idle_divided_by_the_jobs_in_flight() {
        let held = Held {
            in_flight: 10_000,
            fill_s: 1.0,
            idle: Memory {
                rss_kb: 20_000,
                pss_kb: 18_000,
            },
            held: Memory {
                rss_kb: 420_000,
                pss_kb: 318_000,
            },
            breakdown: Breakdown::default(),
        };
        assert_eq!(held.per_job_kb(), (40.0, 30.0));
    }

    #[test]
    fn smaps_entries_parse_with_paths_holding_spaces() {
        let mappings = parse_smaps(&layout());
        assert_eq!(mappings.len(), 1 + 1 + 8 + 2 + 10 + 1 + 4 + 3);
        let memfd = mappings.iter().find(|m| m.path.starts_with("/memfd")).unwrap();
        assert_eq!(memfd.path, "/memfd:wasm-memory-image (deleted)");
        assert_eq!((memfd.rss_kb, memfd.pss_kb, memfd.size_kb()), (4, 1, 4));
        assert_eq!(mappings[0].perms, "rw-p");
        assert_eq!(mappings[0].size_kb(), GIB_KB);
    }

    #[test]
    fn status_and_rollup_fields_are_read() {
        let status = "Name:\twasmjobs\nThreads:\t12\nVmHWM:\t  90000 kB\nVmRSS:\t   81234 kB\n";
        assert_eq!(field(status, "VmRSS"), Some(81_234));
        assert_eq!(field(status, "Threads"), Some(12));
        let rollup =
            "00400000-7ffc [rollup]\nRss:              81234 kB\nPss:              60001 kB\nPss_Dirty:  5 kB\n";
        assert_eq!(field(rollup, "Pss"), Some(60_001), "not Pss_Dirty");
        assert_eq!(field(rollup, "Swap"), None);
    }

    #[test]
    fn mappings_are_told_apart_by_the_shape_of_the_address_space() {
        let mappings = parse_smaps(&layout());
        let kinds = classify(&mappings, 3);
        let of = |kind: Kind| kinds.iter().filter(|&&k| k == kind).count();
        assert_eq!(kinds[0], Kind::Heap, "a whole-GiB arena is the allocator's");
        assert_eq!(kinds[1], Kind::Other, "the pool's leading guard holds nothing");
        assert_eq!(of(Kind::LinearMemory), 6, "{kinds:?}");
        assert_eq!(of(Kind::DataImage), 3);
        assert_eq!(of(Kind::FiberStacks), 10, "5 guard + stack pairs, more than 3 threads");
        assert_eq!(of(Kind::Tables), 1);
        assert_eq!(
            of(Kind::ThreadStacks),
            5,
            "a stack, a signal stack, each with its guard, and [stack]"
        );
        assert_eq!(of(Kind::File), 1);
        assert_eq!(of(Kind::Heap), 2);
        // With as many threads as stacks in the run, they are threads' stacks.
        let kinds = classify(&mappings, 5);
        assert!(!kinds.contains(&Kind::FiberStacks));
    }

    #[test]
    fn the_breakdown_adds_up_by_kind_and_names_the_largest() {
        let mappings = parse_smaps(&layout());
        let b = breakdown(&mappings, 3, 3);
        let rss: u64 = b.kinds.iter().map(|k| k.rss_kb).sum();
        let pss: u64 = b.kinds.iter().map(|k| k.pss_kb).sum();
        assert_eq!(rss, mappings.iter().map(|m| m.rss_kb).sum::<u64>());
        assert_eq!(pss, mappings.iter().map(|m| m.pss_kb).sum::<u64>());
        assert_eq!(b.kinds[0].kind, Kind::Heap);
        assert_eq!(b.kinds[0].rss_kb, 1_008);
        let images = b.kinds.iter().find(|k| k.kind == Kind::DataImage).unwrap();
        assert_eq!((images.mappings, images.rss_kb, images.pss_kb), (3, 76, 13));
        let names: Vec<(Kind, &str, u64)> = b.largest.iter().map(|l| (l.kind, l.name.as_str(), l.rss_kb)).collect();
        assert_eq!(
            names,
            [
                (Kind::Heap, "", 1_000),
                (Kind::File, "wasmjobs", 300),
                (Kind::Tables, "", 80)
            ]
        );
    }
}
