#!/usr/bin/env bash
# Replays every libFuzzer target's corpus (the seeds and the crashing inputs found before, tests/fuzz/corpus/), then
# fuzzes each target for SECONDS (0: replay only). New inputs go to a scratch directory, never into the repository;
# a finding leaves its input in WORK/<target>/ and fails the run. Prints each target's executions.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS=30] [TARGET...]   (BUILD_DIR configured with -DSAT_FUZZ=ON, clang)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-30}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in "$here"/corpus/*/; do targets+=("$(basename "$d")"); done
fi
work=${FUZZ_WORK:-$(mktemp -d /tmp/sat-fuzz-run.XXXXXX)}
failed=0
for t in "${targets[@]}"; do
  bin=$build/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz $t: $bin not built (cmake --build $build --target fuzz_targets)"; failed=1; continue; }
  mkdir -p "$work/$t/new"
  # -rss_limit_mb: a loader must refuse an input that would need more than 2 GB, not try; -timeout: 10 s per input
  opts=(-rss_limit_mb=2048 -timeout=10 -artifact_prefix="$work/$t/" -print_final_stats=1)
  if ! "$bin" "${opts[@]}" -runs=0 "$here/corpus/$t" >"$work/$t/replay.log" 2>&1; then
    echo "fuzz $t: the corpus replay FAILED (log: $work/$t/replay.log)"; tail -n 30 "$work/$t/replay.log"; failed=1; continue
  fi
  replayed=$(ls "$here/corpus/$t" | wc -l)
  if [ "$seconds" -gt 0 ]; then
    if ! "$bin" "${opts[@]}" -max_total_time="$seconds" "$work/$t/new" "$here/corpus/$t" >"$work/$t/fuzz.log" 2>&1; then
      echo "fuzz $t: FOUND a failing input after the $replayed corpus inputs passed (log: $work/$t/fuzz.log):"
      grep -E "^==|ERROR|SUMMARY|Test unit written|uncaught|what\(\)" "$work/$t/fuzz.log" | head -n 20
      failed=1; continue
    fi
    runs=$(grep -o "stat::number_of_executed_units: [0-9]*" "$work/$t/fuzz.log" | awk '{print $2}')
    cov=$(grep -o "cov: [0-9]*" "$work/$t/fuzz.log" | tail -n 1 | awk '{print $2}')
    echo "fuzz $t: $replayed corpus inputs pass; ${runs:-?} executions in ${seconds} s, no finding (coverage: ${cov:-?} edges)"
  else
    echo "fuzz $t: $replayed corpus inputs pass"
  fi
done
[ -z "${FUZZ_WORK:-}" ] && [ $failed -eq 0 ] && rm -rf "$work"
exit $failed
