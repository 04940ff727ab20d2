#!/usr/bin/env bash
# Rebuilds the bundled InceptionV3 Flickr8k model (models/flickr8k-inception.sat: needs only npm's nsfwjs weights,
# not ../shared; the default model is the ResNet one, tools/train-flickr8k-model.sh) from the photos (steps 3-5: tools/flickr8k-choose.sh):
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
source "$(dirname "${BASH_SOURCE[0]}")/flickr8k-choose.sh"
choose_and_ship "$sat" "$data" "$features" "$work/model" "$top/models/flickr8k-inception.sat" \
  "tools/train-flickr8k-inception-model.sh (InceptionV3 $tune_from features at 299, then the command above"
