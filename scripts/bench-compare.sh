#!/usr/bin/env bash
# Compares two revisions' `wasmjobs` binaries on the same machine, in one
# run: builds each apart from this checkout's target/ (under
# target/compare/; each revision's binary is kept, so a second comparison
# against the same revision builds nothing), then alternates their drains (NoopJob at C=10 and C=100, with
# compact and with spaced JSON payloads, and HttpGetJob at C=1,000 against
# a 200 ms server; `--only http-c10k`: at C=10,000) on one Redis, and
# prints B ÷ A per case with the spread of the rounds, the Redis commands
# each sent per job and each runner's peak RSS.
#
# Usage: scripts/bench-compare.sh REV_A REV_B [--rounds N] [--only noop,noop-spaced,noop-c10,http,http-c10k] [--jobs N]
#   REV: anything `git rev-parse` takes (a commit, a branch, HEAD), or
#   `worktree` for the files as they are now (uncommitted changes too).
#
# The drains, servers, payloads and plugins come from this checkout's
# benchmark harness for both binaries, so only the runner differs. Run it
# on an otherwise idle machine; trust the ratios, not the absolute figures
# (the machine's speed drifts from day to day).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if [ $# -lt 2 ]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
rev_a=$1 rev_b=$2
shift 2

bash scripts/setup.sh test >/dev/null
bash scripts/build-plugins.sh >/dev/null

# Builds REV's wasmjobs binary; prints its path.
binary_of() {
  local rev=$1
  if [ "$rev" = worktree ]; then
    cargo build --release --locked -p wasmjobs --bin wasmjobs -p wasmjobs-benches --bin wasmjobs-bench >&2
    local out=target/compare/worktree
    mkdir -p "$out"
    cp target/release/wasmjobs "$out/wasmjobs"
    echo "$repo/$out/wasmjobs"
    return
  fi
  local sha
  sha=$(git rev-parse --verify "$rev^{commit}")
  local out=target/compare/$sha
  if [ ! -x "$out/wasmjobs" ]; then
    echo "building $rev ($sha) ..." >&2
    # One source tree and one target directory for every revision built
    # here, apart from this checkout's target/: dependencies are built
    # once, each revision recompiles only what it changed. `tar -m`: the
    # files get the time of extraction, so cargo sees them as changed.
    rm -rf target/compare/src
    mkdir -p target/compare/src "$out"
    git archive "$sha" | tar -x -m -C target/compare/src
    (cd target/compare/src &&
      CARGO_TARGET_DIR="$repo/target/compare/build" cargo build --release --locked -p wasmjobs --bin wasmjobs >&2)
    cp target/compare/build/release/wasmjobs "$out/wasmjobs"
  fi
  echo "$repo/$out/wasmjobs"
}

bin_a=$(binary_of "$rev_a")
bin_b=$(binary_of "$rev_b")
cargo build --release --locked -p wasmjobs-benches --bin wasmjobs-bench >&2
export WASMJOBS_SKIP_GUEST_BUILD=1
exec target/release/wasmjobs-bench compare --a "$bin_a" --b "$bin_b" \
  --names "$rev_a" "$rev_b" "$@"
