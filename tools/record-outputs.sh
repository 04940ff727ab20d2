#!/usr/bin/env bash
# Records what a build of sat prints and writes on a fixed set of inputs, so that a change meant to keep the program
# as it was (a refactor) can be shown to: run it with the build before and the build after, then `diff -r` the two
# folders (`cmp` for the PNGs and model files). Needs ../shared (the ResNet weights of the default model and the
# Flickr8k dev photos).
#   tools/record-outputs.sh build/sat /tmp/before     # ... change, rebuild ...
#   tools/record-outputs.sh build/sat /tmp/after && diff -r /tmp/before /tmp/after && echo same
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: tools/record-outputs.sh SAT OUT_DIR" >&2; exit 2; }
SAT=$(realpath "$1")
OUT=$2
cd "$(dirname "$0")/.."
F8K=../shared/data/flickr8k
[ -f "$F8K/dev.txt" ] || { echo "record-outputs: $F8K/dev.txt not found" >&2; exit 1; }
mkdir -p "$OUT"
head -n 10 "$F8K/dev.txt" > "$OUT/ten.txt"
photos=()
while read -r name; do photos+=("$F8K/images/$name"); done < "$OUT/ten.txt"
photos+=(examples/dog_and_man.jpg)

run() {  # run NAME COMMAND...: stdout, stderr (without timings) and exit status into OUT/NAME.*
  local name=$1
  shift
  set +e
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  echo $? >"$OUT/$name.status"
  set -e
}

for precision in bf16 f32 int8; do
  run "caption-default-$precision" "$SAT" --encoder-precision "$precision" caption "${photos[@]}" --json --candidates 5
done
run caption-default-plain "$SAT" caption "${photos[@]}"
run caption-default-greedy "$SAT" caption "${photos[@]}" --beam 1 --json
run caption-default-include "$SAT" caption "${photos[@]:0:3}" --include dog --json --candidates 5
run caption-default-diverse "$SAT" caption "${photos[@]:0:3}" --beam 10 --beam-groups 5 --diversity 1 --candidates 10
run caption-default-options "$SAT" caption "${photos[@]:0:3}" --consensus-weight 0 --no-repeat 0 --length-norm 0.5 \
  --candidates 3
run caption-default-neighbours "$SAT" caption "${photos[@]:0:3}" --neighbours 5 --memory-candidates 2 --candidates 3
run caption-inception "$SAT" caption "${photos[@]}" --model models/flickr8k-inception.sat --json --candidates 5
run caption-synth "$SAT" caption examples/scene.png --model models/synth.sat --json --candidates 5
run caption-synth-greedy "$SAT" caption examples/scene.png --model models/synth.sat --beam 1

run attend-default "$SAT" attend examples/dog_and_man.jpg --out "$OUT/attend-default.png"
run attend-default-include "$SAT" attend examples/dog_and_man.jpg --include dog --out "$OUT/attend-default-include.png"
run attend-inception "$SAT" attend "${photos[0]}" --model models/flickr8k-inception.sat --out "$OUT/attend-inception.png"
run attend-synth "$SAT" attend examples/scene.png --model models/synth.sat --out "$OUT/attend-synth.png"

run eval-default "$SAT" eval --data "$F8K" --split "$OUT/ten.txt" --json --results-out "$OUT/eval-default-results.json"
run eval-inception "$SAT" eval --model models/flickr8k-inception.sat --data "$F8K" --split "$OUT/ten.txt" --beam 3 \
  --json --results-out "$OUT/eval-inception-results.json"
run report-default "$SAT" report --data "$F8K" --split "$OUT/ten.txt" --out "$OUT/report-default.html" --quiet
run report-inception "$SAT" report --model models/flickr8k-inception.sat --data "$F8K" --split "$OUT/ten.txt" \
  --out "$OUT/report-inception.html" --quiet

# Model files through `sat model`: a copy with other search settings, a compact copy, and their info.
# (Run inside OUT: the copies record the command that made them, with the output's path as given.)
REPO=$(pwd)
OUT=$(realpath "$OUT")
(cd "$OUT" && run model-set "$SAT" model set "$REPO/models/synth.sat" --out model-set.sat --beam 4 --no-repeat 2)
(cd "$OUT" && run model-compact "$SAT" model compact "$REPO/models/flickr8k-inception.sat" --out model-compact.sat)
run model-info-default "$SAT" model info models/flickr8k.sat
run model-info-set "$SAT" model info "$OUT/model-set.sat"

# Bad input: the one-line errors.
run bad-beam "$SAT" caption examples/scene.png --model models/synth.sat --beam 0
run bad-include "$SAT" caption examples/scene.png --model models/synth.sat --include zebra
run bad-memory "$SAT" caption examples/scene.png --model models/synth.sat --consensus-weight 2
run bad-groups "$SAT" caption examples/scene.png --model models/synth.sat --beam 3 --beam-groups 2
run bad-image "$SAT" caption "$OUT/ten.txt" --model models/synth.sat

# The paths of this run's folder are not part of what is compared; libjpeg's warnings are.
sed -i "s#$OUT#OUT#g" "$OUT"/*.out "$OUT"/*.err "$OUT"/*.html 2>/dev/null || true
echo "recorded in $OUT"
