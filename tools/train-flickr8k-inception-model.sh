#!/usr/bin/env bash
# Rebuilds the bundled InceptionV3 Flickr8k model (models/flickr8k-inception.sat, the default model until the ResNet one;
# needs only npm's nsfwjs weights) from the photos:
#  1. InceptionV3 features of every photo up to $TUNE_FROM (default mixed5) at 299x299, as a float16 cache (mixed0-5 hold
#     Keras's ImageNet weights; the cached part stays frozen),
#  2. the decoder (soft additive attention, embedding = LSTM = attention = 256) trained on the 6000 training photos
#     together with the layers after $TUNE_FROM up to mixed7, fine-tuned on the captions from the cached grids
#     (learning rate 1e-4 against the decoder's 5e-4) for 10 epochs, each epoch's model kept (--keep-epochs),
#  3. the model chosen by BLEU-4 with beam 3 on all 1000 dev photos among every epoch and the weight averages of the
#     last 2, 3 and 4 epochs (sat model average; greedy BLEU-4 on 200 dev photos, the run's own pick, is too noisy),
#  4. the shipped copy with its decoder and tuned layers stored as float16 (sat model compact),
#  5. the search's settings chosen on the 1000 dev photos by BLEU-4 and stored in the file (sat model set): length
#     normalization (0, 0.5, 1), beam width (3, 5) and repeat blocking (none, or no 3-word phrase twice), then the
#     shipped file's dev scores.
# Resumable: rerun the script after an interruption and it continues the feature cache and the training run where
# they stopped. TUNE_FROM=mixed4 also fine-tunes mixed5 (tried: no better on dev, see the README).
# Usage: tools/train-flickr8k-inception-model.sh [FLICKR8K_DIR] [WORKDIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
data=${1:-$top/../shared/data/flickr8k}
work=${2:-$top/runs/flickr8k-recipe}
tune_from=${TUNE_FROM:-mixed5}
sat=${SAT:-$top/build/sat}  # SAT=path runs another build (e.g. a copy, so rebuilding does not touch the run)
mkdir -p "$work"
features=$work/${tune_from}_299.feat
if [ ! -f "$features" ]; then
  "$sat" extract --data "$data" --out "$features" --encoder "$top/models/inception_v3.sat" --cut "$tune_from" --size 299
fi
if [ -f "$work/model/checkpoint.sat" ]; then
  "$sat" train --resume "$work/model/checkpoint.sat"
else
  "$sat" train --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" \
    --encoder "$top/models/inception_v3.sat" --encoder-size 299 --features "$features" \
    --cut mixed7 --tune-from "$tune_from" --tune-lr 1e-4 \
    --embed 256 --hidden 256 --attn 256 --dropout 0.5 --attention soft --score additive --min-count 5 \
    --epochs 10 --batch 16 --lr 5e-4 --lr-decay 0.9 --penalty 1 --patience 10 --val-limit 200 --metric bleu4 \
    --checkpoint-every 40 --seed 1 --keep-epochs --out "$work/model"
fi
dev_bleu4() {  # model [eval flags]: BLEU-4 on the 1000 dev photos
  local m=$1
  shift
  "$sat" eval --model "$m" --data "$data" --split "$data/dev.txt" --features "$features" "$@" --json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Bleu_4"])'
}
better() { python3 -c "import sys; sys.exit(0 if $1 > $2 else 1)"; }
epochs=$(ls "$work"/model/model-epoch*.sat | sed 's/.*model-epoch\([0-9]*\)\.sat/\1/' | sort -n)
last=$(echo "$epochs" | tail -n 1)
candidates=()
for e in $epochs; do candidates+=("$work/model/model-epoch$e.sat"); done
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
out=$top/models/flickr8k-inception.sat
"$sat" model compact "$best_model" --out "$out.new" \
  --recipe "tools/train-flickr8k-inception-model.sh (InceptionV3 $tune_from features at 299, then the command above; $(basename "$best_model") chosen by dev BLEU-4 with beam 3)"
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
