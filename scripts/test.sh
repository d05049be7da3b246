#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of this kind (Debian 12, rustup).
# Builds the guest components first (installing the wasm toolchain if needed),
# then every host test in release mode (Cranelift compiles guests ~10x faster
# optimised, and the release build is the one the benchmarks use).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build-plugins.sh
# The guests are fresh: tests need not rebuild them.
export WASMJOBS_SKIP_GUEST_BUILD=1
cargo test --release --workspace "$@"
