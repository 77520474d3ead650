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
. conformance/lib.sh

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
BIN="$(build_cycles)"
export CYCLES_BIN="$BIN"

VENV="${CYCLES_VENV:-${HOME:-/root}/.cache/cycles-ci-venv}"
echo "== python environment ($VENV)"
python_venv "$VENV" conformance/python/requirements.txt

echo "== official Python SDK against the server (pytest)"
export PYTHONDONTWRITEBYTECODE=1
exec "$VENV/bin/python" -m pytest conformance/python -q -p no:cacheprovider "$@"
