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
cargo test --release --workspace "$@"
# The guest SDK's pure logic (args decoding, errors, SQL values; with its
# property tests) builds natively too; its workspace (plugins/) is not the
# host's. Debug: the guest release profile's LTO would only slow the build.
cargo test --manifest-path guest-sdk/Cargo.toml
