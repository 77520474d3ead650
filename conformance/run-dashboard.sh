#!/usr/bin/env bash
# Runs the official operator dashboard against our server in headless Chromium: builds the
# release `cycles` binary, serves the dashboard build with it (`serve --dashboard-dir`) on a
# free loopback port with a temporary data directory and a random admin key, and drives it
# with conformance/dashboard (playwright-core, pinned in its package-lock.json).
#
# Environment:
#   CARGO_TARGET_DIR       honoured by the build; the screenshots go to
#                          <target dir>/dashboard-screenshots
#   CYCLES_DASHBOARD_DIST  the dashboard build (default: <repo>/../shared/dashboard/dist)
#   CHROMIUM               the browser (default: /usr/bin/chromium, installed with apt if
#                          missing)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

DIST="${CYCLES_DASHBOARD_DIST:-$ROOT/../shared/dashboard/dist}"
if [ ! -f "$DIST/index.html" ]; then
  echo "run-dashboard.sh: no dashboard build in $DIST (set CYCLES_DASHBOARD_DIST)" >&2
  exit 1
fi
DIST="$(cd "$DIST" && pwd)"

node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$node_major" -lt 20 ]; then
  echo "run-dashboard.sh: needs Node.js 20 or later (playwright-core)" >&2
  exit 1
fi

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
  echo "== chromium (apt)"
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
export CHROMIUM

echo "== build (cargo build --release -p cycles)"
# The JSON messages name the binary exactly, wherever CARGO_TARGET_DIR or cargo config put it.
BIN="$(cargo build --release -p cycles --message-format=json-render-diagnostics |
  sed -n 's/.*"target":{[^}]*"name":"cycles"[^}]*}.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "run-dashboard.sh: could not locate the built cycles binary" >&2
  exit 1
fi
# <target dir>/release/cycles
SHOTS="$(dirname "$(dirname "$BIN")")/dashboard-screenshots"
rm -rf "$SHOTS"
mkdir -p "$SHOTS"
export CYCLES_SCREENSHOT_DIR="$SHOTS"

echo "== node packages (npm ci in conformance/dashboard)"
(cd conformance/dashboard && npm ci --no-audit --no-fund --loglevel=error)

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

CYCLES_ADMIN_KEY="cyc_admin_dashboard_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export CYCLES_ADMIN_KEY
"$BIN" serve --listen 127.0.0.1:0 --data-dir "$work/data" --admin-api-key "$CYCLES_ADMIN_KEY" \
  --dashboard-dir "$DIST" --log warn >"$work/server.out" 2>"$work/server.err" &
server_pid=$!

CYCLES_URL=""
for _ in $(seq 1 100); do
  CYCLES_URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/server.out" 2>/dev/null |
    head -n1 || true)"
  [ -n "$CYCLES_URL" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$CYCLES_URL" ]; then
  echo "run-dashboard.sh: the server did not start" >&2
  cat "$work/server.out" "$work/server.err" >&2 || true
  exit 1
fi
export CYCLES_URL
echo "== official dashboard in headless Chromium against $CYCLES_URL (dashboard from $DIST)"

status=0
node conformance/dashboard/dashboard.mjs || status=$?
if [ "$status" -ne 0 ] && [ -s "$work/server.err" ]; then
  echo "-- server log" >&2
  cat "$work/server.err" >&2
fi
exit "$status"
