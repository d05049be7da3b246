#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of this kind (Debian 12, rustup).
# Installs what the tests use (redis-server, ruby-sidekiq; the tests start
# their own servers), builds the guest components (installing the wasm
# toolchain if needed), then runs every host test in release mode (Cranelift
# compiles guests ~10x faster optimised, and it is the build the benchmarks use).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh test
bash scripts/build-plugins.sh
# The guests are fresh: tests need not rebuild them.
export WASMJOBS_SKIP_GUEST_BUILD=1
# The suite runs in a session of its own, so that whatever it started and
# left running (a redis-server, a PostgreSQL, a wasmjobs, a chromedriver)
# is found afterwards by its session id, whatever became of its parent;
# the run fails if anything is still there 15 s after the tests end.
sid_file=$(mktemp)
status=0
setsid bash -c 'echo $$ >"$0"; exec "$@"' "$sid_file" cargo test --release --workspace "$@" &
suite=$!
# The new session has no terminal: pass a Ctrl-C on.
trap 'kill -INT -- "-$(cat "$sid_file")" 2>/dev/null' INT TERM
wait "$suite" || status=$?
trap - INT TERM
sid=$(cat "$sid_file")
rm -f "$sid_file"
left=""
for _ in $(seq 15); do
  left=$(pgrep -s "$sid" || true)
  [ -z "$left" ] && break
  sleep 1
done
if [ -n "$left" ]; then
  echo "test.sh: processes the test suite left running (session $sid):" >&2
  ps -o pid,ppid,etime,args -p "$(echo $left | tr ' ' ,)" >&2 || true
  kill -9 $left 2>/dev/null || true
  [ "$status" -eq 0 ] && status=1
fi
[ "$status" -eq 0 ] || exit "$status"
# The guest SDK's pure logic (args decoding, errors, SQL values; with its
# property tests) builds natively too; its workspace (plugins/) is not the
# host's. Debug: the guest release profile's LTO would only slow the build.
cargo test --manifest-path guest-sdk/Cargo.toml
