#!/usr/bin/env bash
# Builds wasmjobs and the example plugins, then runs a sample of jobs through
# the sandboxed executor: one of each example class, with the outcome and
# duration of each. Needs nothing but this repository and rustup.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build-plugins.sh
cargo build --release -p wasmjobs
wasmjobs=target/release/wasmjobs

echo
"$wasmjobs" plugins --plugins ./plugins

# A local HTTP server for HttpGetJob (the machine may have no internet).
www=$(mktemp -d)
echo "hello from the demo server" > "$www/index.html"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$www" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$www"' EXIT
for _ in $(seq 50); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.1)" 2>/dev/null && break
  sleep 0.1
done

run() {
  echo
  echo "\$ wasmjobs exec $*"
  "$wasmjobs" exec --plugins ./plugins "$@" || true
}
run NoopJob
run FibJob '[25]'
run EchoJob '["hello", {"from": "the demo"}]'
run FileAppendJob '["demo.txt", 42]'
run HttpGetJob "[\"http://127.0.0.1:$port/\"]"
run HttpGetJob "[\"http://127.0.0.1:$port/missing\"]"
run FibJob '["not a number"]'
echo
echo "plugins/file-append/data/demo.txt now ends with: $(tail -n 1 plugins/file-append/data/demo.txt)"
