#!/usr/bin/env bash
# Runs the official Python SDK (runcycles, pinned in python/requirements.txt) against our server:
# builds the `cycles` binary, prepares a cached virtualenv outside the repo, runs pytest.
#
# Environment:
#   CARGO_TARGET_DIR  honoured by the build (and so by where the binary is found)
#   CYCLES_VENV       the virtualenv (default: $HOME/.cache/cycles-ci-venv)
#   CYCLES_SPEC_DIR   the upstream OpenAPI documents (default: <repo>/../shared/spec/upstream);
#                     without them schema validation is skipped, except under CI=true, where
#                     this script fails instead
#   PYTHON            the interpreter that creates the virtualenv (default: python3)
# Extra arguments are passed to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

SPEC_DIR="${CYCLES_SPEC_DIR:-$ROOT/../shared/spec/upstream}"
if [ -f "$SPEC_DIR/cycles-openapi-protocol-merged.yaml" ]; then
  CYCLES_SPEC_DIR="$(cd "$SPEC_DIR" && pwd)"
  export CYCLES_SPEC_DIR
elif [ "${CI:-}" = "true" ]; then
  echo "run-python.sh: CI=true but no upstream OpenAPI documents in $SPEC_DIR;" \
    "response schema validation must not be skipped in CI (set CYCLES_SPEC_DIR)" >&2
  exit 1
else
  echo "run-python.sh: warning: no upstream OpenAPI documents in $SPEC_DIR;" \
    "response schema validation is skipped (the SDK flows still run)" >&2
  export CYCLES_SPEC_DIR="$SPEC_DIR"
fi

echo "== build (cargo build -p cycles)"
# The JSON messages name the binary exactly, wherever CARGO_TARGET_DIR or cargo config put it.
BIN="$(cargo build -p cycles --message-format=json-render-diagnostics |
  sed -n 's/.*"target":{[^}]*"name":"cycles"[^}]*}.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "run-python.sh: could not locate the built cycles binary" >&2
  exit 1
fi
export CYCLES_BIN="$BIN"

VENV="${CYCLES_VENV:-${HOME:-/root}/.cache/cycles-ci-venv}"
echo "== python environment ($VENV)"
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r conformance/python/requirements.txt

echo "== official Python SDK against the server (pytest)"
export PYTHONDONTWRITEBYTECODE=1
exec "$VENV/bin/python" -m pytest conformance/python -q -p no:cacheprovider "$@"
