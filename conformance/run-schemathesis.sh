#!/usr/bin/env bash
# The spec's own fuzzer: schemathesis (PyPI, pinned in schemathesis/requirements.txt) against a
# running server, from the server's own /openapi.json and from the upstream runtime and
# governance specs. Each run is time-bounded; any server error, accepted invalid request or
# response that breaks its schema fails the script (and, against our own document, any
# undocumented status, content type or header too).
#
# The runtime plane is fuzzed first, with a tenant key: the admin plane's fuzzing closes
# tenants and revokes keys, so it runs after.
#
# Environment:
#   CARGO_TARGET_DIR        honoured by the build
#   CYCLES_ST_VENV          the virtualenv (default: $HOME/.cache/cycles-st-venv)
#   CYCLES_SPEC_DIR         the upstream OpenAPI documents (default: <repo>/../shared/spec/upstream);
#                           without them only our own document is fuzzed, except under
#                           CI=true, where this script fails instead
#   CYCLES_ST_SECONDS       the time budget of each run (default: 40)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. conformance/lib.sh
SECONDS_PER_RUN="${CYCLES_ST_SECONDS:-40}"

SPEC_DIR="${CYCLES_SPEC_DIR:-$ROOT/../shared/spec/upstream}"
if [ ! -f "$SPEC_DIR/cycles-openapi-protocol-merged.yaml" ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "run-schemathesis.sh: CI=true but no upstream OpenAPI documents in $SPEC_DIR" >&2
    exit 1
  fi
  echo "run-schemathesis.sh: warning: no upstream documents in $SPEC_DIR; fuzzing our own only" >&2
  SPEC_DIR=""
else
  SPEC_DIR="$(cd "$SPEC_DIR" && pwd)"
fi

echo "== build (cargo build -p cycles)"
BIN="$(build_cycles)"

VENV="${CYCLES_ST_VENV:-${HOME:-/root}/.cache/cycles-st-venv}"
echo "== schemathesis environment ($VENV)"
python_venv "$VENV" conformance/schemathesis/requirements.txt

admin_key="$(random_key cyc_admin_st)"
start_cycles "$BIN" --admin-api-key "$admin_key" --log warn
url="$CYCLES_SERVER_URL"
work="$CYCLES_WORK"

# A tenant with a budget and a key for the runtime plane.
admin() {
  curl -sf -X "$1" "$url$2" -H "X-Admin-API-Key: $admin_key" -H 'Content-Type: application/json' -d "$3"
}
admin POST /v1/admin/tenants '{"tenant_id":"fuzzed","name":"fuzzed"}' >/dev/null
tenant_key="$(admin POST /v1/admin/api-keys '{"tenant_id":"fuzzed","name":"fuzz"}' |
  sed -n 's/.*"key_secret":"\([^"]*\)".*/\1/p')"
admin POST /v1/admin/budgets '{"tenant_id":"fuzzed","scope":"tenant:fuzzed","unit":"USD_MICROCENTS","allocated":{"unit":"USD_MICROCENTS","amount":1000000000000}}' >/dev/null

# Each security scheme of the documents gets its own key.
cat >"$work/schemathesis.toml" <<TOML
[auth.openapi.ApiKeyAuth]
api_key = "$tenant_key"
[auth.openapi.AdminKeyAuth]
api_key = "$admin_key"
TOML
# The upstream governance spec declares `limit` at most 100 on some lists; the reference
# clamps a larger one to 100 instead, and the official dashboard relies on that (it asks
# for 200, 1 000 and 2 000). We clamp as the reference does, so that run keeps `limit`
# valid and fuzzes everything else.
cp "$work/schemathesis.toml" "$work/upstream-governance.toml"
cat >>"$work/upstream-governance.toml" <<TOML
[parameters]
"query.limit" = 50
TOML

# The upstream runtime spec declares the six window bounds of GET /v1/reservations
# `format: date-time`, and its prose requires a blank one to be read as unset (NORMATIVE:
# "Servers MUST NOT 400 on empty-string values"); the fuzzer counts a blank one as invalid
# data that must be refused. That run holds them at valid bounds that cover every time, so
# its cases of that operation are finalized reservations; our own document declares them
# "a date-time or blank", so its runs fuzz them (and the behaviour suite checks blanks).
cp "$work/schemathesis.toml" "$work/upstream-runtime.toml"
cat >>"$work/upstream-runtime.toml" <<TOML
[[operations]]
include-name = "GET /v1/reservations"
[operations.parameters]
"query.from" = "1970-01-01T00:00:00Z"
"query.to" = "2999-12-31T23:59:59Z"
"query.expires_from" = "1970-01-01T00:00:00Z"
"query.expires_to" = "2999-12-31T23:59:59Z"
"query.finalized_from" = "1970-01-01T00:00:00Z"
"query.finalized_to" = "2999-12-31T23:59:59Z"
TOML

strict="not_a_server_error,negative_data_rejection,response_schema_conformance"
ours="$strict,status_code_conformance,content_type_conformance,response_headers_conformance"
failed=0
# One worker: with two, hypothesis (under schemathesis) describes its strategies from two
# threads at once and trips over CPython's AST recursion check, a failure of the tool.
# Run from the temporary directory: schemathesis keeps a cache (`.schemathesis/`, with the
# failures it replays) in its working directory, which must not land in the repository.
fuzz() {
  local title="$1" config="$2"; shift 2
  echo "== schemathesis: $title"
  if ! (cd "$work" && "$VENV/bin/schemathesis" --config-file "$config" run "$@" \
    --max-time "$SECONDS_PER_RUN" --phases examples,coverage,fuzzing --workers 1 \
    --no-color --warnings off); then
    failed=1
  fi
}
fuzz "our document, runtime plane" schemathesis.toml "$url/openapi.json" --checks "$ours" \
  --exclude-path-regex '^/v1/admin/'
if [ -n "$SPEC_DIR" ]; then
  # The evidence operations are optional (MAY) and not served.
  fuzz "upstream runtime spec" upstream-runtime.toml \
    "$SPEC_DIR/cycles-openapi-protocol-merged.yaml" --url "$url" \
    --checks "$strict" --exclude-operation-id-regex '^getEvidence'
fi
fuzz "our document, admin plane" schemathesis.toml "$url/openapi.json" --checks "$ours" \
  --include-path-regex '^/v1/admin/'
if [ -n "$SPEC_DIR" ]; then
  fuzz "upstream governance spec" upstream-governance.toml \
    "$SPEC_DIR/cycles-openapi-admin-merged.yaml" --url "$url" --checks "$strict"
fi
if [ "$failed" != 0 ]; then
  echo "run-schemathesis.sh: schemathesis found failures (above); the server's log:" >&2
  tail -n 50 "$work/server.err" >&2
  exit 1
fi
echo "schemathesis: no failures"
