#!/usr/bin/env bash
# Fuzz stage for CI: builds the fuzz targets (fuzz/, cargo-fuzz and libFuzzer) and runs each
# for a short fixed time from its committed seeds (fuzz/seeds/<target>), in a fresh corpus.
# A crash, a failed assertion or a leak fails the run (its log's tail is printed); libFuzzer
# leaves the input that did it under fuzz/artifacts/<target>. The long runs' figures are in ARCHITECTURE.md ("Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${CYCLES_FUZZ_SECONDS:-15}"
CARGO_FUZZ_VERSION=0.13.2

if [ "$(cargo fuzz --version 2>/dev/null | awk '{print $2}')" != "$CARGO_FUZZ_VERSION" ]; then
  echo "== fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi
# cargo-fuzz instruments with the compiler's unstable sanitizer flags; this machine has one
# (stable) toolchain, which accepts them when told it is bootstrapping.
export RUSTC_BOOTSTRAP=1
target_dir="${CARGO_TARGET_DIR:-target}/fuzz"

cd fuzz
echo "== fuzz: build (release, address sanitizer)"
cargo fuzz build -O --target-dir "$target_dir"
for target in $(cargo fuzz list); do
  corpus="$(mktemp -d)"
  log="$(mktemp)"
  echo "== fuzz: $target for ${SECONDS_PER_TARGET}s"
  if ! cargo fuzz run -O --target-dir "$target_dir" "$target" "$corpus" "seeds/$target" -- \
    -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    echo "fuzz: $target failed; the input is under fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E '^#[0-9]+ +DONE|^stat::number_of_executed_units' "$log" || true
  rm -rf "$corpus" "$log"
done
