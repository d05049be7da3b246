#!/usr/bin/env bash
# Times a plugin's edit loop: a one-line edit to its source, then
# `wasmjobs build DIR`, with each binary given in turn, ROUNDS times
# (alternating, so a noisy machine weighs on each alike). Prints the
# build's wall time and the part of it spent compiling to native code
# (the build's "compiled ... in N s" line); the rest is the toolchain
# (cargo, componentize-py or componentize-js). The source is restored at
# the end. Each WASMJOBS may carry `build` options after the binary
# ("target/release/wasmjobs --dev").
#
#   scripts/edit-loop.sh DIR ROUNDS WASMJOBS [WASMJOBS...]
#
# e.g. old against new, and a release build against a development build:
#   scripts/edit-loop.sh plugins/greet 3 /tmp/wasmjobs-old target/release/wasmjobs
#   scripts/edit-loop.sh plugins/greet 3 target/release/wasmjobs "target/release/wasmjobs --dev"
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 DIR ROUNDS WASMJOBS [WASMJOBS...]" >&2
    exit 2
fi
dir=$1
rounds=$2
shift 2

if [ -f "$dir/app.py" ]; then
    source="$dir/app.py"
    edit() { printf 'EDITED = "%s"\n' "$1"; }
elif [ -f "$dir/job.js" ]; then
    source="$dir/job.js"
    edit() { printf 'globalThis.edited = "%s";\n' "$1"; }
elif [ -f "$dir/src/lib.rs" ]; then
    source="$dir/src/lib.rs"
    edit() { printf 'pub const EDITED: &str = "%s";\n' "$1"; }
else
    echo "$dir: no app.py, job.js or src/lib.rs" >&2
    exit 2
fi
original=$(mktemp)
cp "$source" "$original"
trap 'cp "$original" "$source"; rm -f "$original"' EXIT

log=$(mktemp)
printf '%-6s %-40s %8s %10s\n' round binary "wall s" "compile s"
for round in $(seq "$rounds"); do
    for bin in "$@"; do
        read -r -a command <<< "$bin"
        # The same one-line change each time, with new text, so every
        # build has a component the cache has not seen.
        { cat "$original"; edit "round $round, $bin, $(date +%s%N)"; } > "$source"
        start=$(date +%s%N)
        "${command[0]}" build "${command[@]:1}" "$dir" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
        wall=$(( ($(date +%s%N) - start) / 1000000 ))
        compile=$(sed -n 's/.*compiled .* in \([0-9.]*\) s.*/\1/p' "$log" | tail -1)
        printf '%-6s %-40s %8s %10s\n' "$round" "$bin" "$(awk -v ms="$wall" 'BEGIN { printf "%.2f", ms / 1000 }')" "${compile:--}"
    done
done
rm -f "$log"
