# Sourced by scripts/build-plugins.sh (uses its ROOT, WORKSPACE, log, die,
# apt_install_missing, component_of): builds the plugins written in Python
# (a directory with app.py, built with componentize-py against the guest SDK in
# guest-sdk/python) and JavaScript (job.js, built with componentize-js by
# guest-sdk/js/build.mjs), each to the component its manifest names.
#
# The toolchains are pinned and installed on first use: componentize-py in a
# virtualenv under plugins/target/python, componentize-js with `npm ci` in
# guest-sdk/js (Node >= 20). A component is rebuilt only when its sources,
# the SDK or the WIT package changed since it was built.

COMPONENTIZE_PY_VERSION=0.25.1
PY_VENV=$WORKSPACE/target/python
JS_SDK=$ROOT/guest-sdk/js

python_toolchain_ready() {
    local tool=$PY_VENV/bin/componentize-py
    if [ -x "$tool" ] && [ "$("$tool" --version 2>/dev/null)" = "componentize-py $COMPONENTIZE_PY_VERSION" ]; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || apt_install_missing python3 || return 1
    if ! python3 -m venv --clear "$PY_VENV" >/dev/null 2>&1; then
        apt_install_missing python3-venv || return 1
        python3 -m venv --clear "$PY_VENV" >&2 || return 1
    fi
    log "installing componentize-py $COMPONENTIZE_PY_VERSION (PyPI) into ${PY_VENV#"$ROOT"/}"
    "$PY_VENV/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION" >&2
}

js_toolchain_ready() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        apt_install_missing nodejs npm || return 1
    fi
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || {
        log "componentize-js needs Node.js >= 20 (found $(node --version))"
        return 1
    }
    [ -d "$JS_SDK/node_modules/@bytecodealliance/componentize-js" ] && return 0
    log "installing componentize-js (npm ci in ${JS_SDK#"$ROOT"/})"
    (cd "$JS_SDK" && npm ci --no-audit --no-fund --loglevel=error >&2)
}

# Whether $1 (a component) is missing or older than any of the other paths'
# files (sources, SDK, WIT).
stale() {
    local component=$1
    shift
    [ -f "$component" ] || return 0
    [ -n "$(find "$@" -type f \( -name '*.py' -o -name '*.js' -o -name '*.mjs' -o -name '*.wit' -o -name 'package-lock.json' \) \
        -not -path '*/node_modules/*' -not -path '*/__pycache__/*' -newer "$component" -print -quit 2>/dev/null)" ]
}

# Builds plugin directory $1 with command "$2 ..." writing to a temporary
# file given as the last argument, then moves it into place.
build_polyglot() {
    local dir=$1 kind=$2 component destination temporary world
    component=$(component_of "$dir/wasmjobs.toml")
    destination=$dir/$component
    temporary=$dir/.${component%.wasm}.$$.tmp.wasm
    case "$kind" in
    python)
        if stale "$destination" "$dir" "$ROOT/guest-sdk/python" "$ROOT/wit"; then
            log "componentize-py: ${dir#"$ROOT"/}"
            # `[instances] concurrent` plugins target the async world.
            world=plugin
            grep -Eq '^[[:space:]]*concurrent[[:space:]]*=' "$dir/wasmjobs.toml" && world=async-plugin
            PYTHONDONTWRITEBYTECODE=1 "$PY_VENV/bin/componentize-py" -d "$ROOT/wit" -w "$world" componentize \
                -p "$dir" -p "$ROOT/guest-sdk/python" app -o "$temporary" >/dev/null ||
                die "componentize-py failed for ${dir#"$ROOT"/}"
            mv -f "$temporary" "$destination"
            # componentize-py imports app.py to snapshot it and writes
            # __pycache__/ whatever PYTHONDONTWRITEBYTECODE says.
            rm -rf "$dir/__pycache__" "$ROOT/guest-sdk/python/wasmjobs_guest/__pycache__"
        fi
        ;;
    js)
        if stale "$destination" "$dir" "$JS_SDK/wasmjobs-guest.js" "$JS_SDK/build.mjs" "$JS_SDK/package-lock.json" "$ROOT/wit"; then
            log "componentize-js: ${dir#"$ROOT"/}"
            node "$JS_SDK/build.mjs" "$dir" "$temporary" "$ROOT/wit" || die "componentize-js failed for ${dir#"$ROOT"/}"
            mv -f "$temporary" "$destination"
        fi
        ;;
    esac
    printf '%-44s %8s bytes\n' "${destination#"$ROOT"/}" "$(wc -c <"$destination" | tr -d ' ')"
}

python_plugins=()
js_plugins=()
for manifest in "$ROOT"/plugins/*/wasmjobs.toml "$ROOT"/tests/guests/*/wasmjobs.toml; do
    [ -f "$manifest" ] || continue
    dir=$(dirname "$manifest")
    if [ -f "$dir/app.py" ]; then
        python_plugins+=("$dir")
    elif [ -f "$dir/job.js" ]; then
        js_plugins+=("$dir")
    fi
done
if [ ${#python_plugins[@]} -gt 0 ]; then
    python_toolchain_ready || die "cannot build the Python plugins: componentize-py $COMPONENTIZE_PY_VERSION could not be installed"
    for dir in "${python_plugins[@]}"; do
        build_polyglot "$dir" python
    done
fi
if [ ${#js_plugins[@]} -gt 0 ]; then
    js_toolchain_ready || die "cannot build the JavaScript plugins: Node.js >= 20 and componentize-js are needed"
    for dir in "${js_plugins[@]}"; do
        build_polyglot "$dir" js
    done
fi
