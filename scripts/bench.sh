#!/usr/bin/env bash
# The benchmark suite: every workload of the seed report (noop, HTTP, pg
# sleep, file append, fib, idle), plus HTTP over HTTP/2, through Redis and
# `wasmjobs run --exit-when-empty`, with its own redis-server, PostgreSQL
# and 200 ms HTTP servers (HTTP/1.1 and HTTP/2) on loopback. Writes benches/results/<date>-<host>[-quick].md, the
# JSON beside it and three SVG charts.
#
# Usage: scripts/bench.sh [--quick] [--only noop,http,http2,http-held,http2-held,http-async,http2-async,http-async-held,http2-async-held,pg-sleep,file-append,fib,idle,pg-store,redis-cost]
#   --quick  a reduced set, under 5 minutes on a 2-core machine
#   (default) the full set, about 25 minutes on a 2-core machine
#   pg-store the PostgreSQL job store against the Redis one in the same run
#            (benches/pg_store.rs: noop drains, enqueue rate, commit → start,
#            idle cost, soak); part of the full set, ~2 min more with --quick
#   redis-cost what a job costs the Redis server, by command (benches/
#            redis_cost.rs: the shard model's input); part of the full set,
#            ~1 min
#
# Run it on an otherwise idle machine: every figure is sensitive to other load.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server and PostgreSQL's binaries (the suite starts its own servers).
bash scripts/setup.sh test
bash scripts/build-plugins.sh
cargo build --release --locked -p wasmjobs --bin wasmjobs -p wasmjobs-benches --bin wasmjobs-bench --bin wasmjobs-native
export WASMJOBS_SKIP_GUEST_BUILD=1

# `pg-store` and `redis-cost` are benchmarks of their own; the rest of
# --only goes to the suite.
quick=""
only=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; args+=("$1") ;;
    --only) only="$2"; shift ;;
    --only=*) only="${1#--only=}" ;;
    *) args+=("$1") ;;
  esac
  shift
done
own() {
  if [ -n "$quick" ]; then
    BENCH_QUICK=1 cargo bench --locked -p wasmjobs-benches --bench "$1"
  else
    cargo bench --locked -p wasmjobs-benches --bench "$1"
  fi
}
if [ -z "$only" ]; then
  target/release/wasmjobs-bench --wasmjobs target/release/wasmjobs "${args[@]}"
  own pg_store
  own redis_cost
  exit 0
fi
rest=$(echo ",$only," | sed 's/,pg-store,/,/g; s/,redis-cost,/,/g; s/^,*//; s/,*$//')
if [ -n "$rest" ]; then
  target/release/wasmjobs-bench --wasmjobs target/release/wasmjobs "${args[@]}" --only "$rest"
fi
case ",$only," in *,pg-store,*) own pg_store ;; esac
case ",$only," in *,redis-cost,*) own redis_cost ;; esac
