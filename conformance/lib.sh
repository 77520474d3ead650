# Shell helpers for the CI stages that run the `cycles` binary against an outside client
# (the Python SDK, the dashboard, schemathesis, the bench smoke). Sourced, not run.

# Builds the `cycles` binary with `cargo build -p cycles <arguments>` and prints its path.
# The JSON messages name the binary exactly, wherever CARGO_TARGET_DIR or cargo config put it.
build_cycles() {
  local messages bin
  messages="$(cargo build -p cycles "$@" --message-format=json-render-diagnostics)" || return 1
  bin="$(printf '%s\n' "$messages" |
    sed -n 's/.*"target":{[^}]*"name":"cycles"[^}]*}.*"executable":"\([^"]*\)".*/\1/p' |
    tail -n 1)"
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "could not locate the built cycles binary" >&2
    return 1
  fi
  printf '%s\n' "$bin"
}

# A fresh random key with the given prefix.
random_key() {
  printf '%s_%s\n' "$1" "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
}

# Starts `<binary> serve` on a free loopback port with its data directory in a new temporary
# directory, the remaining arguments added; sets CYCLES_WORK (that directory, also for the
# caller's files), CYCLES_SERVER_PID and CYCLES_SERVER_URL. On exit the server is stopped
# and the directory removed.
start_cycles() {
  local bin="$1"
  shift
  CYCLES_WORK="$(mktemp -d)"
  trap stop_cycles EXIT
  "$bin" serve --listen 127.0.0.1:0 --data-dir "$CYCLES_WORK/data" "$@" \
    >"$CYCLES_WORK/server.out" 2>"$CYCLES_WORK/server.err" &
  CYCLES_SERVER_PID=$!
  CYCLES_SERVER_URL=""
  for _ in $(seq 1 100); do
    CYCLES_SERVER_URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$CYCLES_WORK/server.out" \
      2>/dev/null | head -n1 || true)"
    [ -n "$CYCLES_SERVER_URL" ] && return 0
    kill -0 "$CYCLES_SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "the server did not start" >&2
  cat "$CYCLES_WORK/server.out" "$CYCLES_WORK/server.err" >&2 || true
  return 1
}

# A loopback port free at the moment of asking.
free_port() {
  "${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (up to 10 s) until the server at <url> answers its liveness probe.
wait_live() {
  for _ in $(seq 1 100); do
    curl -sf "$1/actuator/health/liveness" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the server at $1 did not come up" >&2
  return 1
}

stop_cycles() {
  if [ -n "${CYCLES_SERVER_PID:-}" ] && kill -0 "$CYCLES_SERVER_PID" 2>/dev/null; then
    kill "$CYCLES_SERVER_PID" 2>/dev/null || true
    wait "$CYCLES_SERVER_PID" 2>/dev/null || true
  fi
  [ -n "${CYCLES_WORK:-}" ] && rm -rf "$CYCLES_WORK"
  return 0
}

# A virtualenv at <directory> (made again if it is missing or broken) with the requirements
# file <requirements> installed.
python_venv() {
  local venv="$1" requirements="$2"
  if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
}
