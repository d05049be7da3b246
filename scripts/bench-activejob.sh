#!/usr/bin/env bash
# ActiveJob against plain Sidekiq jobs, wasmjobs and Ruby Sidekiq side by
# side in one run (benches/activejob/bench.rb): N noop jobs pushed as plain
# Sidekiq jobs and as the wrappers Rails' ActiveJob adapter writes, drained
# by `wasmjobs run` and by Debian's Sidekiq (native and through ActiveJob),
# rounds alternating. Prints a Markdown table of jobs/s and ratios.
#
# Usage: scripts/bench-activejob.sh [N (100000)] [ROUNDS (3)] [SIDEKIQ_CONCURRENCY (10)]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh test
bash scripts/build-plugins.sh
cargo build --release --locked -p wasmjobs --bin wasmjobs
exec ruby benches/activejob/bench.rb target/release/wasmjobs ./plugins "${1:-100000}" "${2:-3}" "${3:-10}"
