#!/usr/bin/env bash
# The objects ablation on Flickr8k, like for like: one ResNet-101 v2 block3 grid at 448x448 (bf16, float16 cache) of
# the 6000 training and 1000 dev photos, with the COCO detector's class maps joined to it (sat extract --objects
# $SCALE: 80 more features per location), and the same grids without them (the first 1024 channels of each record,
# copied by tools/feature-cache-slice.py into a cache whose header is a plain block3 extraction's): so the two arms
# see bit-identical ResNet features. Each arm trains the first stage of tools/train-flickr8k-model.sh (soft additive
# attention, 512 wide, Adam 4e-4 x 0.9 per epoch, batch 16, dropout 0.5) for $EPOCHS epochs with each seed in
# $SEEDS. Arms ($ARMS): objects (the grid and the maps), resnet (the grid alone), tags (the grid and each class's
# peak over the photo at every location: --objects-as tags), both (the grid, the maps and the tags); hard,
# hard-objects and hard-tags are resnet, objects and tags with the hard 3x3 glimpse of the InceptionV3 attention
# table (--attention hard --hard-window 3 --hard-samples 4 --hard-soft-warmup 5); any arm with -lm after its name (resnet-lm, tags-lm) first
# trains its new decoder as a language model on the COCO captions in $LANGUAGE ($LANGUAGE_EPOCHS epochs, default 1:
# sat train --language-captions). The tags and both caches are made from the maps cache's
# records (tools/feature-cache-slice.py, checked bit for bit against sat extract --objects-as on one photo). Every epoch's model is kept (RUN/model-epochN.sat); scores: sat eval ... --features CACHE
# (docs/objects.md). Resumable: rerun it after an interruption.
# Usage: tools/train-flickr8k-objects.sh   (environment: SCALE, EPOCHS, SEEDS, ARMS, WORK, SAT, LANGUAGE, LANGUAGE_EPOCHS)
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/flickr8k
weights=../shared/models/resnet_v2_101/resnet_v2_101.safetensors
scale=${SCALE:-4}
epochs=${EPOCHS:-4}
seeds=${SEEDS:-1}
arms=${ARMS:-objects resnet}  # objects: the grid and the class maps; resnet: the grid alone
work=${WORK:-runs/objects}
sat=${SAT:-build/sat}
language=${LANGUAGE:-../shared/data/coco-eval/val2014_refs4_codalab.json}
language_epochs=${LANGUAGE_EPOCHS:-1}
mkdir -p "$work"
[ -f "$work/train_dev.txt" ] || cat "$data/train.txt" "$data/dev.txt" >"$work/train_dev.txt"
with=$work/block3_448_objects$scale.feat
without=$work/block3_448.feat
if [ ! -f "$with" ]; then
  "$sat" --encoder-precision bf16 extract --data "$data" --images "$work/train_dev.txt" --out "$with" \
    --encoder "$weights" --cut block3 --size 448 --objects "$scale"
fi
if [ ! -f "$without" ]; then  # the header of a plain extraction (one photo), the records of the one above
  head -1 "$work/train_dev.txt" >"$work/one.txt"
  "$sat" --encoder-precision bf16 extract --data "$data" --images "$work/one.txt" --out "$work/one.feat" \
    --encoder "$weights" --cut block3 --size 448
  /usr/bin/python3 tools/feature-cache-slice.py "$with" "$work/one.feat" "$without"
fi
for form in tags both; do  # only when an arm needs it
  case " $arms " in *" $form "* | *" $form-lm "* | *" hard-$form "*) ;; *) continue ;; esac
  if [ ! -f "$work/block3_448_${form}$scale.feat" ]; then
    "$sat" --encoder-precision bf16 extract --data "$data" --images "$work/one.txt" --out "$work/one_$form.feat" \
      --encoder "$weights" --cut block3 --size 448 --objects "$scale" --objects-as "$form"
    /usr/bin/python3 tools/feature-cache-slice.py "$with" "$work/one_$form.feat" "$work/block3_448_${form}$scale.feat"
  fi
done
for seed in $seeds; do
  for arm in $arms; do
    run=$work/$arm-seed$seed
    if [ -f "$run/model-epoch$epochs.sat" ]; then continue; fi
    if [ -f "$run/checkpoint.sat" ]; then
      "$sat" train --resume "$run/checkpoint.sat"
      continue
    fi
    features=$without objects=() attention=(--attention soft --score additive) text=()
    case $arm in *-lm) text=(--language-captions "$language" --language-epochs "$language_epochs") ;; esac
    input=${arm%-lm} input=${input#hard-}  # what the decoder reads: resnet, objects, tags or both
    case $input in
      objects) features=$with objects=(--objects "$scale") ;;
      tags | both) features=$work/block3_448_$input$scale.feat objects=(--objects "$scale" --objects-as "$input") ;;
    esac
    case $arm in hard*) attention=(--attention hard --hard-window 3 --hard-samples 4 --hard-soft-warmup 5) ;; esac
    "$sat" train --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" \
      --encoder "$weights" --cut block3 --encoder-size 448 "${objects[@]}" --features "$features" \
      --embed 512 --hidden 512 --attn 512 --dropout 0.5 "${attention[@]}" "${text[@]}" --min-count 5 \
      --epochs "$epochs" --batch 16 --lr 4e-4 --lr-decay 0.9 --penalty 1 --patience "$epochs" --val-limit 200 \
      --metric bleu4 --checkpoint-every 100 --seed "$seed" --keep-epochs --precision f32 --out "$run"
  done
done
