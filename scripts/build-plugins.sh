#!/usr/bin/env bash
# Build every guest (the example plugins in plugins/ and the test guests in
# tests/guests/) for wasm32-wasip2 in release mode, and copy each component
# next to its wasmjobs.toml, under the name the manifest's `component` gives.
# Plugins written in Python (app.py) or JavaScript (job.js) are built by
# scripts/build-polyglot.sh (componentize-py / componentize-js), sourced at
# the end.
#
# Usage: scripts/build-plugins.sh
#
# Toolchains (WASMJOBS_GUEST_TOOLCHAIN):
#   auto    (default) recipe A, falling back to recipe B when the rustup
#           target can't be had.
#   rustup  recipe A only: rustup's wasm32-wasip2 target (installed on demand).
#   debian  recipe B only: Debian's rustc-web with -Zbuild-std, for machines
#           where rustup can't fetch the target. Installs the apt packages it
#           lacks (rustc-web conflicts with Debian's old `rustc`/`cargo`).
# Both recipes leave global configuration alone: recipe B's settings are passed
# on the command line and it has its own target dir (plugins/target/debian).
#
# Safe to run while tests load the components: each one is replaced
# atomically (copy to a temporary name in the same directory, then rename), and
# only when it changed. A second run with nothing changed is a no-op build.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKSPACE=$ROOT/plugins
TARGET=wasm32-wasip2
TOOLCHAIN=${WASMJOBS_GUEST_TOOLCHAIN:-auto}
# Recipe B's own target dir; inside plugins/target so that it is git-ignored.
DEBIAN_TARGET_DIR=$WORKSPACE/target/debian
DEBIAN_PACKAGES=(rustc-web cargo-web rust-web-src wasi-libc)
WASI_LIBC_DIR=/usr/lib/wasm32-wasi
# Source paths embedded in guests (panic locations) are relative to the repo,
# so a component's bytes, and its version id, do not depend on the checkout.
REMAP="--remap-path-prefix=$ROOT=."

log() { printf 'build-plugins: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# --- recipe A: rustup's wasm32-wasip2 target -------------------------------

rustup_target_ready() {
    command -v rustup >/dev/null 2>&1 || {
        log "rustup not found"
        return 1
    }
    if rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
        return 0
    fi
    log "installing the $TARGET target with rustup (up to 5 minutes)"
    if timeout 300 rustup target add "$TARGET"; then
        return 0
    fi
    log "rustup target add $TARGET failed"
    return 1
}

build_rustup() {
    log "recipe A: cargo build --release --target $TARGET"
    (cd "$WORKSPACE" && cargo build --release --target "$TARGET" \
        --config "target.$TARGET.rustflags=[\"$REMAP\"]")
    OUT_DIR=$WORKSPACE/target/$TARGET/release
}

# --- recipe B: Debian's rustc-web + -Zbuild-std -----------------------------

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi

apt_updated=false
apt_update_once() {
    $apt_updated && return 0
    command -v apt-get >/dev/null 2>&1 || {
        log "apt-get not found (recipe B needs Debian packages)"
        return 1
    }
    log "apt-get update"
    "${SUDO[@]}" apt-get update -qq >&2 || return 1
    apt_updated=true
}

apt_install_missing() {
    local missing=() package
    for package in "$@"; do
        if ! dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$package")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    apt_update_once || return 1
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

newest_installed_wasm_ld() {
    local candidate
    for candidate in /usr/lib/llvm-*/bin/wasm-ld; do
        [ -x "$candidate" ] && printf '%s\n' "$candidate"
    done | sort -V | tail -n 1
}

# The newest wasm-ld from an installed lld-NN package, installing the newest
# one apt offers if there is none.
find_wasm_ld() {
    local found
    found=$(newest_installed_wasm_ld)
    if [ -z "$found" ]; then
        local package
        apt_update_once || return 1
        package=$(apt-cache search --names-only '^lld-[0-9]+$' 2>/dev/null | awk '{print $1}' | sort -V | tail -n 1)
        [ -n "$package" ] || {
            log "no lld-NN package found (run apt-get update?)"
            return 1
        }
        apt_install_missing "$package" || return 1
        found=$(newest_installed_wasm_ld)
    fi
    [ -n "$found" ] || return 1
    printf '%s\n' "$found"
}

# wasm-component-ld: rustup's host toolchain ships one even when the wasm
# target is missing; otherwise build it with cargo into recipe B's target dir.
find_component_ld() {
    local rustup_rustc sysroot host candidate
    for rustup_rustc in "$HOME/.cargo/bin/rustc" "$(command -v rustc 2>/dev/null || true)"; do
        [ -x "$rustup_rustc" ] || continue
        sysroot=$("$rustup_rustc" --print sysroot 2>/dev/null) || continue
        host=$("$rustup_rustc" -vV 2>/dev/null | sed -n 's/^host: //p')
        candidate=$sysroot/lib/rustlib/$host/bin/wasm-component-ld
        if [ -x "$candidate" ]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    if command -v wasm-component-ld >/dev/null 2>&1; then
        command -v wasm-component-ld
        return 0
    fi
    candidate=$DEBIAN_TARGET_DIR/tools/bin/wasm-component-ld
    if [ ! -x "$candidate" ]; then
        log "building wasm-component-ld (cargo install, ~2 minutes)"
        PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc cargo install --locked --quiet \
            --root "$DEBIAN_TARGET_DIR/tools" wasm-component-ld >&2 || return 1
    fi
    printf '%s\n' "$candidate"
}

debian_toolchain_ready() {
    apt_install_missing "${DEBIAN_PACKAGES[@]}" || return 1
    [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] || {
        log "/usr/bin/rustc or /usr/bin/cargo missing after installing ${DEBIAN_PACKAGES[*]}"
        return 1
    }
    WASM_LD=$(find_wasm_ld) || {
        log "no wasm-ld available"
        return 1
    }
    COMPONENT_LD=$(find_component_ld) || {
        log "no wasm-component-ld available"
        return 1
    }
}

build_debian() {
    log "recipe B: $(/usr/bin/rustc --version) with -Zbuild-std"
    log "  linker $COMPONENT_LD, wasm-ld $WASM_LD"
    # /usr/bin first and RUSTC set: rustup's rustc (first on a usual PATH)
    # can't compile Debian's newer library source.
    (
        cd "$WORKSPACE"
        export PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
        export CARGO_TARGET_DIR=$DEBIAN_TARGET_DIR
        cargo build --release --target "$TARGET" -Zbuild-std=std,panic_abort \
            --config "target.$TARGET.linker=\"$COMPONENT_LD\"" \
            --config "target.$TARGET.rustflags=[\"-Clink-arg=--wasm-ld-path=$WASM_LD\", \"-Lnative=$WASI_LIBC_DIR\", \"$REMAP\"]"
    )
    OUT_DIR=$DEBIAN_TARGET_DIR/$TARGET/release
}

# --- pick a recipe and build ------------------------------------------------

case "$TOOLCHAIN" in
auto)
    if rustup_target_ready; then
        build_rustup
    else
        log "falling back to recipe B (Debian rustc-web)"
        debian_toolchain_ready ||
            die "cannot build guests: neither rustup's $TARGET target (recipe A) nor Debian's rustc-web toolchain (recipe B) is available; see the messages above"
        build_debian
    fi
    ;;
rustup)
    rustup_target_ready || die "cannot build guests: rustup's $TARGET target is not available"
    build_rustup
    ;;
debian)
    debian_toolchain_ready || die "cannot build guests: Debian's rustc-web toolchain is not available"
    build_debian
    ;;
*)
    die "WASMJOBS_GUEST_TOOLCHAIN must be auto, rustup or debian (got '$TOOLCHAIN')"
    ;;
esac

# --- copy each component next to its manifest --------------------------------

# The component-model binary header: magic, version 0x0d, layer 1.
COMPONENT_HEADER="0061736d0d000100"

# The `component = "..."` file name of manifest $1 (dies if there is none).
component_of() {
    local name
    name=$(sed -n 's/^component[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$1" | head -n 1)
    [ -n "$name" ] || die "${1#"$ROOT"/}: no component = \"...\" line"
    printf '%s\n' "$name"
}

copied=0
for manifest in "$ROOT"/plugins/*/wasmjobs.toml "$ROOT"/tests/guests/*/wasmjobs.toml; do
    [ -f "$manifest" ] || continue
    dir=$(dirname "$manifest")
    # Python (app.py) and JavaScript (job.js) plugins are built below.
    [ -f "$dir/app.py" ] || [ -f "$dir/job.js" ] && continue
    component=$(component_of "$manifest")
    # A cdylib's artifact is named after its lib name (underscores), a bin's
    # after the package (hyphens).
    artifact=
    for candidate in "$component" "${component//_/-}"; do
        if [ -f "$OUT_DIR/$candidate" ]; then
            artifact=$OUT_DIR/$candidate
            break
        fi
    done
    [ -n "$artifact" ] || die "${manifest#"$ROOT"/}: cargo produced no $component in $OUT_DIR (is the crate a member of plugins/Cargo.toml?)"
    header=$(head -c 8 "$artifact" | od -An -tx1 | tr -d ' \n')
    [ "$header" = "$COMPONENT_HEADER" ] ||
        die "$artifact is not a component (header $header); was it linked by wasm-component-ld?"

    destination=$dir/$component
    if ! cmp -s "$artifact" "$destination"; then
        temporary=$dir/.${component%.wasm}.$$.tmp.wasm
        cp "$artifact" "$temporary"
        mv -f "$temporary" "$destination"
    fi
    printf '%-44s %8s bytes\n' "${destination#"$ROOT"/}" "$(wc -c <"$destination" | tr -d ' ')"
    copied=$((copied + 1))
done
[ "$copied" -gt 0 ] || die "no wasmjobs.toml found under plugins/ or tests/guests/"

# --- Python and JavaScript plugins ------------------------------------------

# shellcheck source=scripts/build-polyglot.sh
source "$ROOT/scripts/build-polyglot.sh"
