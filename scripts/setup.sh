#!/usr/bin/env bash
# Installs the system packages wasmjobs needs that a fresh Debian machine
# lacks. Usage: scripts/setup.sh [run|test]
#   run  (default): redis-server, for the embedded Redis of `wasmjobs run`.
#   test: also what the test suite uses: ruby-sidekiq (the real Sidekiq
#         client/API for the interop tests), ruby-activejob and
#         ruby-globalid (Rails' ActiveJob with its Sidekiq adapter, for the
#         ActiveJob tests), ruby-sidekiq-cron (1.8: the schedule layout
#         Sidekiq 6 apps use), postgresql (the SQL tests
#         start their own throwaway servers with its binaries),
#         ruby-activerecord and ruby-pg (a Rails model's transaction
#         enqueueing into the PostgreSQL store, as docs/postgres.md shows), and chromium
#         with chromium-driver (the dashboard tests drive a headless Chromium
#         over WebDriver with /usr/bin/chromedriver; fonts-liberation, which
#         --no-install-recommends would leave out, so pages have fonts).
# The wasm toolchain is handled by scripts/build-plugins.sh.
set -euo pipefail

want=(redis-server)
if [ "${1:-run}" = test ]; then
  want+=(ruby-sidekiq ruby-activejob ruby-globalid ruby-sidekiq-cron ruby-activerecord ruby-pg postgresql chromium chromium-driver fonts-liberation)
fi

missing=()
for package in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# Debian starts a system redis-server on port 6379 on install; wasmjobs does
# not need it (it runs its own), so leave the machine as quiet as we found it.
if [[ " ${missing[*]} " == *" redis-server "* ]] && command -v systemctl >/dev/null 2>&1; then
  "${sudo[@]}" systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
# Likewise the system PostgreSQL cluster Debian creates and may start: the
# tests run their own clusters and never use it.
if [[ " ${missing[*]} " == *" postgresql "* ]]; then
  if command -v systemctl >/dev/null 2>&1; then
    "${sudo[@]}" systemctl disable --now postgresql >/dev/null 2>&1 || true
  fi
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version cluster _port status _rest; do
      if [ "$status" = online ]; then
        "${sudo[@]}" pg_ctlcluster "$version" "$cluster" stop >/dev/null 2>&1 || true
      fi
    done
  fi
fi
