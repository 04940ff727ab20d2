#!/usr/bin/env bash
# Rebuilds the default Flickr8k model (models/flickr8k.sat) from the photos and the shared ResNet-101 v2 weights:
#  1. ResNet-101 v2 grids of the 6000 training and 1000 dev photos at $CUT and $SIZE (float16 cache; with $TUNE_FROM,
#     that unit's raw output, the frozen part),
#  2. the decoder (soft additive attention, embedding = LSTM = attention = $DIM) trained on the training photos
#     (with $TUNE_FROM: block3's units after it fine-tuned too, at a fifth of the decoder's learning rate), every
#     epoch's model kept,
#  3. the model chosen by BLEU-4 with beam 3 on all 1000 dev photos among every epoch and the weight averages of the
#     last 2, 3 and 4 epochs (sat model average),
#  4. the shipped copy with its decoder (and tuned units) stored as float16 (sat model compact),
#  5. the search settings chosen on the dev photos by BLEU-4 and stored in the file (sat model set): beam width
#     (3, 5), length normalization (0, 0.5, 1) and repeat blocking (none, or no 3-word phrase twice), then the
#     shipped file's dev scores (sat eval --record).
# The model names the weights file and its sha256; the weights stay in ../shared/models. Every path the model
# records is relative to the repository (the script runs from its top). Resumable: rerun it after an interruption.
# Usage: tools/train-flickr8k-model.sh   (environment: CUT, SIZE, TUNE_FROM, DIM, EPOCHS, LR, WORK, SAT)
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/flickr8k
weights=../shared/models/resnet_v2_101/resnet_v2_101.safetensors
cut=${CUT:-block3/unit_22}
size=${SIZE:-224}
tune_from=${TUNE_FROM:-}
dim=${DIM:-512}
epochs=${EPOCHS:-12}
lr=${LR:-4e-4}
work=${WORK:-runs/flickr8k-resnet}
sat=${SAT:-build/sat}  # SAT=path runs another build (e.g. a copy, so rebuilding does not touch the run)
mkdir -p "$work"
cache_cut=${tune_from:-$cut}
features=$work/$(echo "$cache_cut" | tr / _)_$size.feat
if [ ! -f "$features" ]; then
  cat "$data/train.txt" "$data/dev.txt" >"$work/train_dev.txt"
  "$sat" extract --data "$data" --images "$work/train_dev.txt" --out "$features" --encoder "$weights" \
    --cut "$cache_cut" --size "$size" ${tune_from:+--raw}
fi
tune=()
[ -n "$tune_from" ] && tune=(--tune-from "$tune_from" --tune-lr "$(python3 -c "print($lr / 5)")")
if [ -f "$work/model/checkpoint.sat" ]; then
  "$sat" train --resume "$work/model/checkpoint.sat"
else
  "$sat" train --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" \
    --encoder "$weights" --cut "$cut" --encoder-size "$size" --features "$features" "${tune[@]}" \
    --embed "$dim" --hidden "$dim" --attn "$dim" --dropout 0.5 --attention soft --score additive --min-count 5 \
    --epochs "$epochs" --batch 16 --lr "$lr" --lr-decay 0.9 --penalty 1 --patience "$epochs" --val-limit 200 \
    --metric bleu4 --checkpoint-every 100 --seed 1 --keep-epochs --out "$work/model"
fi
dev_bleu4() {  # model [eval flags]: BLEU-4 on the 1000 dev photos
  local m=$1
  shift
  "$sat" eval --model "$m" --data "$data" --split "$data/dev.txt" --features "$features" "$@" --json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Bleu_4"])'
}
better() { python3 -c "import sys; sys.exit(0 if $1 > $2 else 1)"; }
epoch_list=$(ls "$work"/model/model-epoch*.sat | sed 's/.*model-epoch\([0-9]*\)\.sat/\1/' | sort -n)
last=$(echo "$epoch_list" | tail -n 1)
candidates=()
for e in $epoch_list; do candidates+=("$work/model/model-epoch$e.sat"); done
for k in 2 3 4; do  # checkpoint averages of the last k epochs
  [ "$last" -ge "$k" ] || continue
  avg=$work/model/average-epochs$((last - k + 1))-$last.sat
  if [ ! -f "$avg" ]; then
    "$sat" model average $(for ((e = last - k + 1; e <= last; e++)); do echo "$work/model/model-epoch$e.sat"; done) \
      --out "$avg"
  fi
  candidates+=("$avg")
done
best_model="" best_b4=-1
for m in "${candidates[@]}"; do
  b4=$(dev_bleu4 "$m" --beam 3 --length-norm 1)
  echo "$(basename "$m"): dev BLEU-4 $b4 (beam 3)"
  if better "$b4" "$best_b4"; then best_model=$m best_b4=$b4; fi
done
out=models/flickr8k.sat
"$sat" model compact "$best_model" --out "$out.new" \
  --recipe "tools/train-flickr8k-model.sh (CUT=$cut SIZE=$size TUNE_FROM=$tune_from DIM=$dim EPOCHS=$epochs LR=$lr: ResNet-101 v2 $cache_cut features at $size, then the command above; $(basename "$best_model") chosen by dev BLEU-4 with beam 3)"
best_a=1 best_k=3 best_r=0 best_b4=-1
for r in 0 3; do
  for k in 3 5; do
    for a in 0 0.5 1; do
      b4=$(dev_bleu4 "$out.new" --beam $k --length-norm $a --no-repeat $r)
      echo "beam $k, length normalization $a, no repeated $r-word phrase: dev BLEU-4 $b4"
      if better "$b4" "$best_b4"; then best_a=$a best_k=$k best_r=$r best_b4=$b4; fi
    done
  done
done
"$sat" model set "$out.new" --out "$out.new" --length-norm "$best_a" --beam "$best_k" --no-repeat "$best_r"
"$sat" eval --model "$out.new" --data "$data" --split "$data/dev.txt" --features "$features" --record
mv "$out.new" "$out"
echo "wrote $out"
