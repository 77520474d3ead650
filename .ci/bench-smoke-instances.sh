#!/usr/bin/env bash
# Several instances of one ledger under load, for CI: three `cycles serve` on the Redis engine
# (the store's settings come from the environment, as .ci/run's redis_stage sets them), each
# handing its writes to the lease's holder (--redis-advertise-url), and one short
# `cycles bench run` whose concurrent clients are spread over the three (--spread-url). The
# run fails on any error, and its fan-out cells reconcile every budget through the admin API
# afterwards, so a hold lost or counted twice between instances fails it too.
set -euo pipefail
cd "$(dirname "$0")/.."
. conformance/lib.sh

bin="$(build_cycles --release --features alloc-count)"
out_dir="$(dirname "$(dirname "$bin")")/bench-smoke-instances"
mkdir -p "$out_dir"
work="$(mktemp -d)"
pids=()
stop_all() {
  if [ "${#pids[@]}" -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop_all EXIT

admin_key="$(random_key cyc_admin_smoke)"
urls=()
for i in 1 2 3; do
  port="$(free_port)"
  url="http://127.0.0.1:$port"
  "$bin" serve --listen "127.0.0.1:$port" --redis-advertise-url "$url" --data-dir "$work/data-$i" \
    --admin-api-key "$admin_key" --log warn >"$work/serve-$i.out" 2>"$work/serve-$i.err" &
  pids+=("$!")
  urls+=("$url")
done
for url in "${urls[@]}"; do
  wait_live "$url" || { cat "$work"/serve-*.err >&2; exit 1; }
done
echo "== bench smoke, three instances: ${urls[*]}"

"$bin" bench run --url "${urls[0]}" --spread-url "${urls[1]},${urls[2]}" --admin-key "$admin_key" \
  --only lifecycles,fanout --quick --concurrency-clients 8,32 --fanout-clients 10,50 \
  --out "$out_dir/report.json"

# The instances without the lease handed their writes on (the clients' errors above would
# show any that went unanswered).
sent=0
for url in "${urls[@]}"; do
  n="$(curl -sf -H "X-Admin-API-Key: $admin_key" "$url/metrics" |
    sed -n 's/^cycles_forward_sent_total \([0-9]*\)$/\1/p')"
  echo "$url handed ${n:-0} requests to the lease's holder"
  sent=$((sent + ${n:-0}))
done
if [ "$sent" -eq 0 ]; then
  echo "no request was handed to the lease's holder: the instances did not share the load" >&2
  exit 1
fi
