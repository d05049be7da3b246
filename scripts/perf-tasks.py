#!/usr/bin/env python3
"""Where a worker's CPU went, per job, by the task each sample belongs to.

Usage: scripts/perf-tasks.py PERF_DATA PID JOBS

PERF_DATA is a recording with call graphs of the whole machine or of the
process (`perf record -F 1999 --call-graph dwarf,12288 -a -o perf.data`
while the worker runs), PID the worker's process id (`wasmjobs run` or the
suite's native baseline, `wasmjobs-native`), JOBS how many jobs it ran in
the recording. Each sample is put in the first of the groups below that
one of its frames names (so an HTTP exchange polled inside the job's own
task, as the native worker does it, counts as the exchange), and each
group's CPU time (the samples' periods) is divided by JOBS.

Used for the tables of docs/performance.md; it needs `perf` and a build
with symbols (the release profile keeps line tables).
"""

import subprocess
import sys
from collections import Counter

# (group, substrings of a frame that put a sample in it), in priority order.
GROUPS = [
    ("HTTP connection: hyper's connection task, with the kernel's loopback send",
     ["hyper::proto::h1::dispatch", "hyper::proto::h2::", "UpgradeableConnection"]),
    ("HTTP exchange: hyper-util's send_request, the host's request building",
     ["send_request", "host::http::"]),
    ("sandbox: instance or lane, the guest's call, its host calls",
     ["wasmjobs::sandbox::", "wasmtime", "wasm[", "component-trampolines", "fiber_start"]),
    ("the job's task: processor, unit of work, in-flight table, cancel",
     ["runner::processor", "runner::unit", "runner::inflight", "runner::cancel",
      "wasmjobs_native::run::{{closure}}::{{closure}}"]),
    ("Redis client", ["redis::"]),
    ("outcome writer (acks)", ["runner::outcome", "write_acks"]),
    ("fetch loop", ["runner::fetch", "runner::manager", "runner::source", "wasmjobs_native::run"]),
    ("parked: epoll, timers, the IO driver", ["park_internal", "Driver::turn", "epoll_wait"]),
]
OTHER = "other: tokio's scheduling, start-up, frames that did not unwind"


def samples(data: str, pid: str):
    """Yields (period in ns, frames from leaf to root) for each sample of `pid`."""
    out = subprocess.run(
        ["perf", "script", "--no-inline", "-i", data, "--pid", pid, "-F", "pid,tid,period,ip,sym"],
        check=True, capture_output=True, text=True,
    ).stdout
    for block in out.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        period = int(lines[0].split()[-1])
        frames = [(line.split(None, 1) + [""])[1] for line in lines[1:]]
        yield period, frames


def group_of(frames) -> str:
    for name, keys in GROUPS:
        if any(key in frame for frame in frames for key in keys):
            return name
    # Guest code without symbols ends the unwinding at `[unknown]`.
    if any("[unknown]" in frame for frame in frames[:2]):
        return GROUPS[2][0]
    return OTHER


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2])
    data, pid, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    per_group = Counter()
    for period, frames in samples(data, pid):
        per_group[group_of(frames)] += period
    total = sum(per_group.values())
    print(f"{total / jobs / 1000:7.1f} µs per job in all")
    for name, ns in per_group.most_common():
        print(f"{ns / jobs / 1000:7.1f} µs  {100 * ns / total:4.1f}%  {name}")


if __name__ == "__main__":
    main()
