#!/usr/bin/env bash
# The main job on embedded defaults: builds wasmjobs and the example plugins,
# lists them with `wasmjobs plugins` (which compiles each component once into
# the cache under ./.wasmjobs that every command shares), starts `wasmjobs run
# --plugins ./plugins` (which starts its own private redis-server there),
# waits until the runner is ready, enqueues a sample of jobs of every example
# class, waits until they are done, stops the runner (it prints its summary:
# start-up on a line of its own, then the jobs) and shows `wasmjobs stats`.
# Needs this repository, rustup and apt.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh run
bash scripts/build-plugins.sh
cargo build --release -p wasmjobs
wasmjobs=target/release/wasmjobs
export WASMJOBS_DATA_DIR=./.wasmjobs
unset REDIS_URL

"$wasmjobs" plugins --plugins ./plugins

# A local HTTP server for HttpGetJob (the machine may have no internet).
www=$(mktemp -d)
echo "hello from the demo server" > "$www/index.html"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Python's http.server, with a listen backlog of 128 instead of socketserver's
# 5: the demo's 20 concurrent requests would otherwise overflow it, and each
# dropped connect is retried by the kernel only after a second.
python3 - "$port" "$www" >/dev/null 2>&1 <<'PY' &
import functools, http.server, sys
http.server.ThreadingHTTPServer.request_queue_size = 128
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
PY
server=$!

"$wasmjobs" run --plugins ./plugins --concurrency 50 &
runner=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  kill -TERM "$runner" 2>/dev/null && wait "$runner" 2>/dev/null || true
  rm -rf "$www"
}
trap cleanup EXIT

# Enqueue only once the runner is ready (registered in Redis, i.e. plugins
# loaded): jobs pushed while it starts would wait out its start-up, and their
# queue latency would measure that instead of the runner.
echo "waiting for wasmjobs run to start..."
deadline=$((SECONDS + 600))
until "$wasmjobs" stats --json 2>/dev/null | python3 -c '
import json, sys
sys.exit(0 if any(p["pid"] == int(sys.argv[1]) for p in json.load(sys.stdin)["processes"]) else 1)
' "$runner"; do
  kill -0 "$runner" 2>/dev/null || { echo "wasmjobs run exited before it was ready" >&2; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "wasmjobs run was not ready within 600 s" >&2; exit 1; }
  sleep 0.05
done

before=$("$wasmjobs" stats --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["processed"])')
"$wasmjobs" enqueue --count 10000 NoopJob
"$wasmjobs" enqueue --count 10 FibJob '[25]'
"$wasmjobs" enqueue EchoJob '["hello", {"from": "the demo"}]'
"$wasmjobs" enqueue --count 100 FileAppendJob '["demo.txt", 42]'
"$wasmjobs" enqueue --count 20 HttpGetJob "[\"http://127.0.0.1:$port/\"]"
"$wasmjobs" enqueue HttpGetJob "[\"http://127.0.0.1:$port/missing\"]"   # 404: goes to the retry set
"$wasmjobs" enqueue FibJob '["not a number"]'                            # bad args: goes to the dead set
# Python jobs that await their request: they run at once, in one instance.
"$wasmjobs" enqueue --count 50 PyAsyncHttpGetJob "[\"http://127.0.0.1:$port/\"]"
total=10183

echo "waiting for $total jobs..."
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
  done_now=$("$wasmjobs" stats --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["processed"])')
  [ $((done_now - before)) -ge $total ] && break
  sleep 0.05
done

kill -TERM "$runner"
wait "$runner" || true
"$wasmjobs" stats
