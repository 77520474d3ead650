#!/usr/bin/env bash
# Performance smoke for CI: builds the release binary with allocation counting, starts it on
# loopback (strict durability, temporary data directory, a free port, a random admin key),
# runs a short `cycles bench run --quick`, then gates with `cycles bench check`:
#   - any error or ledger mismatch fails (the run itself fails on those too);
#   - heap allocations per reserve / commit above the budget fail (allocation counts are
#     deterministic, so these budgets are tight: measured + a small margin);
#   - latency above catastrophe ceilings fails (generous: a shared CI machine is noisy;
#     these catch a disaster, they are not targets — BENCHMARKS.md has the real numbers);
#   - RSS grown per settled reservation (VmRSS: it counts the allocator's slack that heap
#     counters miss) above its budget fails: settled reservations must leave memory.
# Each optimisation that lowers a measured figure tightens its budget here.
set -euo pipefail
cd "$(dirname "$0")/.."
. conformance/lib.sh

# Budgets (BENCHMARKS.md, "Budgets in CI", says where they come from).
MAX_ALLOCATIONS_PER_RESERVE="${CYCLES_BENCH_MAX_ALLOCATIONS_PER_RESERVE:-69}"
MAX_ALLOCATIONS_PER_COMMIT="${CYCLES_BENCH_MAX_ALLOCATIONS_PER_COMMIT:-60}"
MAX_P50_MS="${CYCLES_BENCH_MAX_P50_MS:-50}"
MAX_P99_MS="${CYCLES_BENCH_MAX_P99_MS:-1000}"
MAX_RSS_PER_SETTLED_BYTES="${CYCLES_BENCH_MAX_RSS_PER_SETTLED_BYTES:-512}"

echo "== bench smoke: release build with --features alloc-count"
bin="$(build_cycles --release --features alloc-count)"
# <target dir>/release/cycles
out_dir="$(dirname "$(dirname "$bin")")/bench-smoke"
mkdir -p "$out_dir"

admin_key="$(random_key cyc_admin_smoke)"
start_cycles "$bin" --durability strict --admin-api-key "$admin_key" --log warn
echo "== bench smoke: server $CYCLES_SERVER_URL (pid $CYCLES_SERVER_PID, strict durability)"

"$bin" bench run --url "$CYCLES_SERVER_URL" --admin-key "$admin_key" \
  --data-dir "$CYCLES_WORK/data" --server-pid "$CYCLES_SERVER_PID" \
  --quick --warmup 20 --iterations 100 \
  --out "$out_dir/report.json"

echo "== bench smoke: budgets"
"$bin" bench check "$out_dir/report.json" \
  --max-allocations-per-reserve "$MAX_ALLOCATIONS_PER_RESERVE" \
  --max-allocations-per-commit "$MAX_ALLOCATIONS_PER_COMMIT" \
  --max-p50-ms "$MAX_P50_MS" --max-p99-ms "$MAX_P99_MS" \
  --max-rss-per-settled-bytes "$MAX_RSS_PER_SETTLED_BYTES"
