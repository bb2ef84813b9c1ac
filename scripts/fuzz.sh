#!/usr/bin/env bash
# Runs every fuzz target (or those named) under libFuzzer for SECONDS each, starting from
# its checked-in corpus (fuzz/corpus/TARGET, read only; what it finds goes to
# target/fuzz-corpus/TARGET), and prints a table of executions and findings per target,
# also written to target/fuzz-stats.csv. A crash fails the run and names the input
# (fuzz/artifacts/TARGET/...): copy it into fuzz/regressions/TARGET/ and it is tested on
# every run of the test suite from then on.
#
#   scripts/fuzz.sh 10              # the test suite's short run
#   scripts/fuzz.sh 3600 ipfix      # the long mode: an hour on one target
#
# Needs a nightly toolchain and cargo-fuzz (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
# No sanitizer: the decoders hold no unsafe code (what there is, valgrind checks in the
# test script), and without one a target runs several times faster; debug assertions
# (overflow checks) stay on. No link-time optimization: each target links the whole
# program, and LTO made the build take minutes more for little speed in a fuzz run.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
cargo +nightly fuzz build --features libfuzzer --sanitizer none
csv=target/fuzz-stats.csv
# seeds: the checked-in corpus; corpus: what the run's own corpus holds after it.
echo "target,seconds,executions,seeds,corpus,crashes" > "$csv"
printf '%-18s %8s %12s %10s %10s %8s\n' target seconds executions seeds corpus crashes
status=0
for t in "${targets[@]}"; do
  work="target/fuzz-corpus/$t"
  mkdir -p "$work" "fuzz/artifacts/$t"
  log="target/fuzz-$t.log"
  before=$(ls "fuzz/corpus/$t" | wc -l)
  if cargo +nightly fuzz run --features libfuzzer --sanitizer none "$t" "$work" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    crashes=0
  else
    crashes=1
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  found=$(ls "$work" | wc -l)
  printf '%-18s %8s %12s %10s %10s %8s\n' "$t" "$seconds" "${runs:-?}" "$before" "$found" "$crashes"
  echo "$t,$seconds,${runs:-},$before,$found,$crashes" >> "$csv"
  if [ "$crashes" -ne 0 ]; then
    echo "fuzz target $t failed: see $log; the input is in fuzz/artifacts/$t/ (copy it into fuzz/regressions/$t/)" >&2
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -8 >&2 || true
  fi
done
exit $status
