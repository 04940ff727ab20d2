#!/usr/bin/env bash
# The whole test suite (the README's test command runs it after tools/install-deps.sh --test; so does CI):
#  1. the Release build and its tests (ctest: unit tests, the CLI test, the MPI test, the browser tests of the HTML report
#     and of sat serve's page, the Flickr8k recipe against a stand-in for sat);
#  2. a build with AddressSanitizer and UndefinedBehaviorSanitizer (clang, with libFuzzer's instrumentation so the
#     same build gives the fuzz targets): the unit tests and the CLI's bad-input tests, where any report fails;
#  3. every fuzz target: its corpus replayed, then FUZZ_SECONDS (20) of fuzzing.
# SAT_TESTS=release runs step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { echo "=== $1 ($(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s)"; }
# ccache, when installed, reuses what an earlier build on this machine compiled (from any checkout: paths are taken
# relative to the checkout, and the folder is left out of the hash); a fresh machine compiles everything.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
stage "Release build and tests"
cmake -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
cmake --build build -j2
ctest --test-dir build --output-on-failure
[ "${SAT_TESTS:-all}" = release ] && exit 0
stage "sanitizer build (ASan + UBSan, clang)"
# -O1 with line tables only: the usual sanitizer build (reports name file and line), and a third of -O2 -g's compile time
CC=clang CXX=clang++ cmake -B build-fuzz "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DSAT_FUZZ=ON -DSAT_BUILD_TESTS=ON
cmake --build build-fuzz -j2
stage "unit tests and the CLI's bad-input tests under the sanitizers"
# detect_leaks: a leak fails too; halt_on_error: the first report ends the run
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
build-fuzz/tests/sat_tests
SAT_CLI_TESTS=bad-input tests/cli_test.sh build-fuzz/sat
stage "fuzz targets: corpus replay and ${FUZZ_SECONDS:-20} s each, two at a time"
targets=($(ls tests/fuzz/corpus))
half=$(( (${#targets[@]} + 1) / 2 ))
tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-20}" "${targets[@]:0:$half}" & first=$!
tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-20}" "${targets[@]:$half}" || fuzz_failed=1
wait $first || fuzz_failed=1
[ -z "${fuzz_failed:-}" ]
stage "all passed"
