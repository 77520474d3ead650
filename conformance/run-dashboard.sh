#!/usr/bin/env bash
# Runs the official operator dashboard against our server in headless Chromium: builds the
# release `cycles` binary, serves the dashboard build with it (`serve --dashboard-dir`) on a
# free loopback port with a temporary data directory and a random admin key, and drives it
# with conformance/dashboard (playwright-core, pinned in its package-lock.json).
#
# Environment:
#   CARGO_TARGET_DIR       honoured by the build; the screenshots go to
#                          <target dir>/dashboard-screenshots (with CYCLES_SCREENSHOT_SUFFIX
#                          after it, if set)
#   CYCLES_DASHBOARD_DIST  the dashboard build (default: <repo>/../shared/dashboard/dist)
#   CHROMIUM               the browser (default: /usr/bin/chromium, installed with apt if
#                          missing)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. conformance/lib.sh

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
BIN="$(build_cycles --release)"
# <target dir>/release/cycles
SHOTS="$(dirname "$(dirname "$BIN")")/dashboard-screenshots${CYCLES_SCREENSHOT_SUFFIX:-}"
rm -rf "$SHOTS"
mkdir -p "$SHOTS"
export CYCLES_SCREENSHOT_DIR="$SHOTS"

echo "== node packages (npm ci in conformance/dashboard)"
(cd conformance/dashboard && npm ci --no-audit --no-fund --loglevel=error)

CYCLES_ADMIN_KEY="$(random_key cyc_admin_dashboard)"
export CYCLES_ADMIN_KEY
start_cycles "$BIN" --admin-api-key "$CYCLES_ADMIN_KEY" --dashboard-dir "$DIST" --log warn
CYCLES_URL="$CYCLES_SERVER_URL"
export CYCLES_URL
echo "== official dashboard in headless Chromium against $CYCLES_URL (dashboard from $DIST)"

status=0
node conformance/dashboard/dashboard.mjs || status=$?
if [ "$status" -ne 0 ] && [ -s "$CYCLES_WORK/server.err" ]; then
  echo "-- server log" >&2
  cat "$CYCLES_WORK/server.err" >&2
fi
exit "$status"
