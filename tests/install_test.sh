#!/usr/bin/env bash
# The library as another project uses it: `cmake --install` to a temporary prefix, examples/ configured and built
# against the installed CMake package (find_package(sat), sat::sat), and run on the example photo; the installed
# `sat` finds its models under the prefix, not in the source tree.
set -u
BUILD="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
P="$WORK/prefix"
PHOTO="$ROOT/examples/dog_and_man.jpg"
WEIGHTS="$ROOT/../shared/models"

if cmake --install "$BUILD" --prefix "$P" >"$WORK/install.log" 2>&1; then pass "cmake --install"; else
  fail "cmake --install: $(tail -n 3 "$WORK/install.log")"; echo "$failures failure(s)"; exit 1; fi
for f in bin/sat lib/libsat.so include/sat/captioner.hpp include/sat/scores.hpp include/sat/error.hpp lib/cmake/sat/satConfig.cmake \
         share/sat/models/flickr8k.sat share/sat/models/flickr8k-inception.sat share/sat/models/inception_v3.sat; do
  [ -e "$P/$f" ] && pass "installed $f" || fail "not installed: $f"
done
# libsat.so exports the public API only: no internal symbol (sat::CaptionModel, sat::Decoder, ...) is visible
exported=$(nm -D --defined-only -C "$P/lib/libsat.so" | grep ' sat::' || true)
public='sat::(Captioner|Error|score\(|score_files\(|compare_files\(|check_choice_files\()'  # <sat/captioner.hpp>, <sat/error.hpp>, <sat/scores.hpp>
if echo "$exported" | grep -q 'sat::Captioner::' && echo "$exported" | grep -q 'sat::score_files(' &&
   ! echo "$exported" | grep -vE "$public" | grep -q .; then
  pass "libsat.so exports sat::Captioner, sat::Error, sat::score, sat::score_files, sat::compare_files and sat::check_choice_files only"
else
  fail "libsat.so exports: $(echo "$exported" | grep -vE "$public" | head -n 3)"
fi

# a project of its own: examples/ against the installed package, no path into this checkout or build tree
cp -r "$ROOT/examples" "$WORK/src"
if cmake -S "$WORK/src" -B "$WORK/example" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
     >"$WORK/configure.log" 2>&1 && cmake --build "$WORK/example" >"$WORK/build.log" 2>&1; then
  pass "examples/ built against the installed package"
else
  fail "examples/ did not build: $(tail -n 5 "$WORK/configure.log" "$WORK/build.log")"
  echo "$failures failure(s)"; exit 1
fi
EXAMPLE="$WORK/example/caption_example"
if grep -rqF -e "$BUILD" -e "$ROOT" "$WORK/example/CMakeCache.txt" "$P/lib/cmake/sat" 2>/dev/null; then
  fail "the example's build refers to the source or build tree"
else pass "the example's build refers to the installed prefix only"; fi

# the InceptionV3 model needs nothing outside the prefix
out=$("$EXAMPLE" --model "$P/share/sat/models/flickr8k-inception.sat" "$PHOTO" 2>&1)
if [[ "$out" =~ ^"$PHOTO: "[a-z]+.*"(log p -"[0-9.]+")"$ ]]; then pass "example program: $out"; else
  fail "example program with the InceptionV3 model: $out"; fi
# the default model (from the prefix) with the shared ResNet weights, when this machine has them
if [ -f "$WEIGHTS/resnet_v2_101/resnet_v2_101.safetensors" ]; then
  out=$(SAT_WEIGHTS="$WEIGHTS" "$EXAMPLE" "$PHOTO" 2>&1)
  if [[ "$out" =~ ^"$PHOTO: "[a-z]+ ]]; then pass "example program, default model: $out"; else
    fail "example program with the default model: $out"; fi
  cli=$(SAT_WEIGHTS="$WEIGHTS" "$P/bin/sat" caption "$PHOTO" 2>&1)
  lib="${out#"$PHOTO: "}"; lib="${lib% (log p*}"
  [ "$cli" = "$lib" ] && pass "the installed sat gives the library's caption" || \
    fail "installed sat: '$cli' against the library's '$lib'"
fi
# without weights: the library's one-line error, exit 1
out=$(env -u SAT_WEIGHTS XDG_CACHE_HOME="$WORK/no-cache" "$EXAMPLE" "$PHOTO" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && [[ "$out" == "caption_example: $P/share/sat/models/flickr8k.sat: needs the encoder weights"* ]]; then
  pass "no weights: one line, exit 1"
elif [ ! -f "$WEIGHTS/resnet_v2_101/resnet_v2_101.safetensors" ]; then
  fail "no weights: exit $rc: $out"
else
  # ../shared beside the checkout is not looked in by an installed library: the prefix is
  fail "no weights: exit $rc: $out"
fi
out=$("$EXAMPLE" --model "$WORK/none.sat" "$PHOTO" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == "caption_example: $WORK/none.sat: "* ]] && pass "missing model: $out" || \
  fail "missing model: exit $rc: $out"

# the installed sat finds its models under the prefix: without the prefix's default model it names that path
mv "$P/share/sat/models/flickr8k.sat" "$WORK/moved.sat"
out=$(env -u SAT_MODEL "$P/bin/sat" caption "$PHOTO" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$out" == "sat: $P/share/sat/models/flickr8k.sat: "* ]] && pass "installed sat looks under the prefix" || \
  fail "installed sat without the prefix's model: exit $rc: $out"

echo "$failures failure(s)"
[ $failures -eq 0 ]
