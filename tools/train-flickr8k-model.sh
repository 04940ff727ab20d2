#!/usr/bin/env bash
# Rebuilds the bundled default model (models/flickr8k.sat) from the Flickr8k photos and the shared ResNet-101 v2
# weights (steps 3-5: tools/flickr8k-choose.sh). Defaults: block3 (the end of what the weights hold) at 448x448, a
# 14x14x1024 grid, 9 epochs: the settings chosen on the dev photos (README, Real photos). Steps:
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
#     shipped file's dev scores (sat eval --record),
#  6. the encoder's arithmetic stored as $PRECISION (default auto: bfloat16 where the CPU computes it natively, 2x
#     the speed at the same dev scores, README), the dev scores recorded from the photos encoded that way.
# With $TUNE_AFTER (a unit; default block3/unit_22, the shipped model), a second stage follows: the shipped model goes on training with
# block3's units after that one fine-tuned (sat train --init-from --tune-from, on a cache of that unit's raw output,
# $EPOCHS2 epochs at decoder rate $LR2 and encoder rate $TUNE_LR2), and steps 3-6 choose and ship again from its
# epochs. The first stage's model is kept as $WORK/stage1.sat.
# With $TUNE_MORE (a unit before $TUNE_AFTER; default block3/unit_21, the shipped model), the second stage's model goes on training with
# the units after that one fine-tuned, those after $TUNE_AFTER from their tuned weights (sat train --init-from
# $WORK/stage2.sat --tune-from $TUNE_MORE, on a cache of that unit's raw output, $EPOCHS2B epochs at decoder rate $LR2B
# and encoder rate $TUNE_LR2B, decaying 0.8 per epoch), and steps 3-6 choose and ship again (kept as $WORK/stage2b.sat);
# the members below are then trained over its encoder.
# With $MEMBERS > 0 (default 1, the shipped model; after a second stage), a third: $MEMBERS more decoders trained
# afresh over the encoder of the last stage's model ($WORK/stage2b.sat, or stage2.sat without $TUNE_MORE), its
# fine-tuned units kept as they are (sat train --init-from that model --fresh-decoder --tune-lr 0 --seed 2, 3, ...;
# $EPOCHS3 epochs at $LR, the first stage's schedule), each member's epoch chosen as in step 3;
# then that model and the members are joined (sat model ensemble: the searches average their word
# distributions), and by step 3's rule the ensemble or one of its decoders alone is chosen (the shipped model: the
# member alone), which steps 4-6 ship. The second stage's model is kept as $WORK/stage2.sat.
# With $TUNE_MOST (a unit before $TUNE_MORE, e.g. block3/unit_20; default none), stage 2c: stage 3's best single
# model (by step 3's rule, in float32) goes on training with the units after that one fine-tuned, the later ones from
# their tuned weights ($EPOCHS2C epochs at decoder rate $LR2C and encoder rate $TUNE_LR2C, decaying 0.8 per epoch, on
# a cache of that unit's raw output); its last epoch's encoder is kept (its decoder is replaced), and stage 3 runs
# again over it ($WORK/member2c_2, ...): that model, the members, or their ensemble, chosen by step 3's rule and
# shipped by steps 4-6 (README: with block3/unit_20, a wash against the shipped model; not shipped).
# With TUNE4=UNIT (e.g. block3/unit_21; with OBJECTS), stage 4: the model that reads the objects (with MEMBERS=0,
# BASE itself; else stage 3's best single model) trains on with the units after UNIT fine-tuned jointly with its
# decoder, the objects beside them (sat train --init-from --tune-from UNIT, on the members' cache: UNIT's raw output
# with the objects; EPOCHS4 epochs at decoder rate LR4 and encoder rate TUNE_LR4, decaying 0.8 per epoch, products in
# float32), one run for each seed in SEEDS4 ($work/tune4_seedS); each run's epoch chosen by step 3's rule, the best of
# them by it, shipped by steps 4-6 (docs/objects.md: the tags through stage 2b).
# Last (MEMORY=1, the default and the shipped model), consensus reranking: a caption memory of the 6000 training
# photos (their mean grid vectors through the shipped encoder, from the last stage's cache, and their captions; sat
# model memory; their keys projected onto CCA=256 directions learned from the training captions' words, ridge
# CCA_REG=0.1; CCA=0: the pooled keys as they are) goes into the shipped file, and its use is chosen on the dev
# photos by BLEU-4 against the model without it: beam width (5, 10, 20, 30, 40), neighbours (20, 30, 60) and weight
# (8, 12, 20) (sat model set; the dev scores recorded again); the memory's word side then weighs each caption's
# relevance where the paired bootstrap says it raises dev CIDEr-D (step 8). MEMORY=0 ships without one.
# With MIRROR=1 the members train with mirror augmentation (sat train --mirror-features, on a cache of the training
# photos mirrored, extracted through the same frozen part; README: it did not beat the shipped decoder).
# With SMOOTH=EPS the members train with label smoothing (sat train --label-smoothing EPS; README).
# With ORDER3=updown (or luong) the members' decoders use that ordering (sat train --fresh-decoder --order; README);
# the default, bahdanau, is the shipped decoder's.
# With OBJECTS=SCALE (e.g. 4) the members read the COCO detector's objects beside the grid (sat train --objects SCALE
# --objects-as $OBJECTS_AS, default tags: each class's peak over the photo at every location), from a cache of the
# frozen part's raw output with them (sat extract --raw --objects SCALE --objects-as tags, $raw_unit's cache name
# plus _tagsSCALE); the model they start from reads no objects, so it is left out of the choice and of their
# ensemble, and the consensus memory comes from that cache (docs/objects.md). Not with MIRROR=1 or TUNE_MOST.
# With BASE=MODEL (e.g. BASE=models/flickr8k.sat, the shipped model) stages 1-2b are not run: the members train
# over that model's encoder (copied first to $WORK/base.sat, so shipping over MODEL changes nothing for a rerun),
# whose fine-tuned units start after TUNE_MORE (or TUNE_AFTER without it); the shipped file's recipe names BASE, and
# the model's own recipe stays in its started_from.
# The model names the weights file and its sha256; the weights stay in ../shared/models. Every path the model
# records is relative to the repository (the script runs from its top). Resumable: rerun it after an interruption.
# Usage: tools/train-flickr8k-model.sh   (environment: CUT, SIZE, TUNE_FROM, DIM, EPOCHS, LR, PRECISION, TUNE_AFTER,
#        EPOCHS2, LR2, TUNE_LR2, TUNE_MORE, EPOCHS2B, LR2B, TUNE_LR2B, MEMBERS, EPOCHS3, MIRROR, SMOOTH, ORDER3, TUNE_MOST,
#        EPOCHS2C, LR2C, TUNE_LR2C, TUNE4, SEEDS4, EPOCHS4, LR4, TUNE_LR4, MEMORY, CCA, CCA_REG, OBJECTS, OBJECTS_AS,
#        BASE, WORK, SAT)
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/flickr8k
weights=../shared/models/resnet_v2_101/resnet_v2_101.safetensors
cut=${CUT:-block3}
size=${SIZE:-448}
tune_from=${TUNE_FROM:-}
dim=${DIM:-512}
epochs=${EPOCHS:-9}
lr=${LR:-4e-4}
precision=${PRECISION:-auto}
tune_after=${TUNE_AFTER-block3/unit_22}  # empty (TUNE_AFTER=): stage 1 only
epochs2=${EPOCHS2:-8}
lr2=${LR2:-1e-4}
tune_lr2=${TUNE_LR2:-1e-4}
tune_more=${TUNE_MORE-block3/unit_21}  # empty (TUNE_MORE=): no stage 2b
epochs2b=${EPOCHS2B:-4}
lr2b=${LR2B:-1e-4}
tune_lr2b=${TUNE_LR2B:-1e-4}
tune_most=${TUNE_MOST-}  # a unit (block3/unit_20): stage 2c
epochs2c=${EPOCHS2C:-4}
lr2c=${LR2C:-1e-4}
tune_lr2c=${TUNE_LR2C:-1e-4}
members=${MEMBERS:-1}
tune4=${TUNE4-}  # a unit (block3/unit_21): stage 4, the objects model fine-tuned with its units (needs OBJECTS)
seeds4=${SEEDS4:-1 2}
epochs4=${EPOCHS4:-4}
lr4=${LR4:-1e-4}
tune_lr4=${TUNE_LR4:-1e-4}
epochs3=${EPOCHS3:-8}
mirror=${MIRROR:-0}  # 1: stage 3's members train with mirror augmentation (not shipped: README)
smooth=${SMOOTH:-0}  # stage 3's members' label smoothing
order3=${ORDER3:-bahdanau}  # stage 3's members' decoder ordering
memory=${MEMORY:-1}  # 1: consensus reranking's caption memory in the shipped model, its use chosen on dev
cca=${CCA:-256}  # the memory's keys projected onto that many CCA directions (0: as pooled; docs/search.md)
cca_regularization=${CCA_REG:-0.1}
objects=${OBJECTS:-0}  # SCALE > 0: stage 3's members read the detector's objects (OBJECTS_AS: tags, maps, both or tags+trunk;
# tags+trunk's trunk channels are standardized by sat train over the training photos and the model stores it)
objects_as=${OBJECTS_AS:-tags}
base_model=${BASE:-}  # a model whose encoder the members share, instead of stages 1-2b
work=${WORK:-runs/flickr8k-resnet}
sat=${SAT:-build/sat}  # SAT=path runs another build (e.g. a copy, so rebuilding does not touch the run)
if [ "$objects" != 0 ] && { [ "$mirror" = 1 ] || [ -n "$tune_most" ]; }; then
  echo "train-flickr8k-model.sh: OBJECTS=$objects does not go with MIRROR=1 or TUNE_MOST (their caches hold no objects)" >&2
  exit 2
fi
if [ -n "$tune4" ] && { [ "$objects" = 0 ] || [ -n "$tune_most" ]; }; then
  echo "train-flickr8k-model.sh: TUNE4=$tune4 needs OBJECTS and goes without TUNE_MOST" >&2
  exit 2
fi
if [ -n "$base_model" ] && [ ! -f "$base_model" ]; then
  echo "train-flickr8k-model.sh: BASE=$base_model: no such model file" >&2
  exit 2
fi
mkdir -p "$work"
cache_cut=${tune_from:-$cut}
cache_of() { echo "$work/$(echo "$1" | tr / _)_$size.feat"; }  # unit: the name of its cache at $size
features=$(cache_of "$cache_cut")
source "$(dirname "${BASH_SOURCE[0]}")/flickr8k-choose.sh"
settings="CUT=$cut SIZE=$size TUNE_FROM=$tune_from DIM=$dim EPOCHS=$epochs LR=$lr PRECISION=$precision"
[ -f "$work/train_dev.txt" ] || cat "$data/train.txt" "$data/dev.txt" >"$work/train_dev.txt"
finish() {  # features: the last steps (consensus reranking, from that cache; int8 ranges), then the end of the recipe
  [ "$memory" = 1 ] && consensus_stage "$1" models/flickr8k.sat "$precision"
  # the detector's evidence in reranking, for a model that reads the objects (step 6)
  [ "$objects" = 0 ] || evidence_stage "$1" models/flickr8k.sat "$precision"
  # the decoder's products in bf16 when captioning, where the CPU has it and dev BLEU-4 holds (step 7)
  decoder_precision_stage "$1" models/flickr8k.sat "$precision"
  # the captions' relevance in the memory's CCA space, where its gain in CIDEr-D is more than chance (step 8)
  [ "$memory" = 1 ] && relevance_stage "$1" models/flickr8k.sat "$precision"
  # the nearest memory photos' captions in the objects' evidence, where they name more of the rarer objects (step 9)
  [ "$memory" = 1 ] && [ "$objects" != 0 ] && neighbour_evidence_stage "$1" models/flickr8k.sat "$precision"
  # the objects' evidence steering the beam, where it names more of the rarer objects (step 10)
  [ "$objects" = 0 ] || beam_evidence_stage "$1" models/flickr8k.sat "$precision"
  # the ranges --encoder-precision int8 needs, from 64 training photos in float32 (the model's choice stays as set)
  "$sat" model calibrate models/flickr8k.sat --data "$data" --split "$data/train.txt" --photos 64 --out models/flickr8k.sat
  exit 0
}
raw_cache() {  # unit: sets `raw` to the cache of that unit's raw output at $size, extracted if missing (raw_unit: the unit)
  raw_unit=$1
  raw=$(cache_of "$1")
  if [ ! -f "$raw" ]; then
    "$sat" --encoder-precision "$precision" extract --data "$data" --images "$work/train_dev.txt" --out "$raw" \
      --encoder "$weights" --cut "$1" --size "$size" --raw
  fi
}
tune_run() {  # from_model tune_from tune_lr lr epochs out [features [seed [flags...]]]: trains (or resumes; a larger
  # epochs extends a finished run) from features ($raw by default) with seed (1) and any more flags
  local features=${7:-$raw} seed=${8:-1}
  if [ -f "$6/checkpoint.sat" ]; then
    "$sat" train --resume "$6/checkpoint.sat" --more-epochs "$5" --patience "$5"
  else
    "$sat" train --init-from "$1" --tune-from "$2" --tune-lr "$3" \
      --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" --features "$features" \
      --epochs "$5" --batch 16 --lr "$4" --lr-decay 0.8 --penalty 1 --patience "$5" --val-limit 200 \
      --metric bleu4 --checkpoint-every 100 --seed "$seed" --keep-epochs "${@:9}" --out "$6"
  fi
}
stages_1_to_2b() {  # sets `base` (the model whose encoder the members share), `raw`, `raw_unit` and `recipe2`
  if [ ! -f "$work/stage1.sat" ]; then  # stage 1 (a finished stage 1 is kept as stage1.sat)
    if [ ! -f "$features" ]; then
      "$sat" extract --data "$data" --images "$work/train_dev.txt" --out "$features" --encoder "$weights" \
        --cut "$cache_cut" --size "$size" ${tune_from:+--raw}
    fi
    tune=()
    [ -n "$tune_from" ] && tune=(--tune-from "$tune_from" --tune-lr "$(awk -v lr="$lr" 'BEGIN { print lr / 5 }')")
    if [ -f "$work/model/checkpoint.sat" ]; then
      "$sat" train --resume "$work/model/checkpoint.sat"
    else
      "$sat" train --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" \
        --encoder "$weights" --cut "$cut" --encoder-size "$size" --features "$features" "${tune[@]}" \
        --embed "$dim" --hidden "$dim" --attn "$dim" --dropout 0.5 --attention soft --score additive --min-count 5 \
        --epochs "$epochs" --batch 16 --lr "$lr" --lr-decay 0.9 --penalty 1 --patience "$epochs" --val-limit 200 \
        --metric bleu4 --checkpoint-every 100 --seed 1 --keep-epochs --out "$work/model"
    fi
    choose_and_ship "$sat" "$data" "$features" "$work/model" models/flickr8k.sat \
      "tools/train-flickr8k-model.sh ($settings: ResNet-101 v2 $cache_cut features at $size, then the command above" \
      "$precision"
    [ -z "$tune_after" ] && finish "$features"
    cp models/flickr8k.sat "$work/stage1.sat.partial" && mv "$work/stage1.sat.partial" "$work/stage1.sat"
  fi
  [ -z "$tune_after" ] && finish "$features"
  # Stage 2: the first stage's model, its encoder's units after $tune_after fine-tuned with the decoder.
  raw_cache "$tune_after"
  if [ ! -f "$work/stage2.sat" ]; then  # stage 2 (a finished stage 2 is kept as stage2.sat)
    tune_run "$work/stage1.sat" "$tune_after" "$tune_lr2" "$lr2" "$epochs2" "$work/stage2"
    choose_and_ship "$sat" "$data" "$raw" "$work/stage2" models/flickr8k.sat \
      "tools/train-flickr8k-model.sh ($settings TUNE_AFTER=$tune_after EPOCHS2=$epochs2 LR2=$lr2 TUNE_LR2=$tune_lr2: the first stage's model (its recipe: started_from) trained on with the units after $tune_after fine-tuned, from their raw output at $size, by the command above" \
      "$precision"
    cp models/flickr8k.sat "$work/stage2.sat.partial" && mv "$work/stage2.sat.partial" "$work/stage2.sat"
  fi
  base=$work/stage2.sat  # the model whose encoder the members share
  recipe2="TUNE_AFTER=$tune_after EPOCHS2=$epochs2 LR2=$lr2 TUNE_LR2=$tune_lr2"
  if [ -n "$tune_more" ]; then
    # Stage 2b: the second stage's model with more of block3's units fine-tuned.
    raw_cache "$tune_more"
    recipe2="$recipe2 TUNE_MORE=$tune_more EPOCHS2B=$epochs2b LR2B=$lr2b TUNE_LR2B=$tune_lr2b"
    if [ ! -f "$work/stage2b.sat" ]; then
      tune_run "$work/stage2.sat" "$tune_more" "$tune_lr2b" "$lr2b" "$epochs2b" "$work/stage2b"
      choose_and_ship "$sat" "$data" "$raw" "$work/stage2b" models/flickr8k.sat \
        "tools/train-flickr8k-model.sh ($settings $recipe2: the second stage's model (its recipe: started_from) trained on with the units after $tune_more fine-tuned, those after $tune_after from their tuned weights, from the raw output of $tune_more at $size, by the command above" \
        "$precision"
      cp models/flickr8k.sat "$work/stage2b.sat.partial" && mv "$work/stage2b.sat.partial" "$work/stage2b.sat"
    fi
    base=$work/stage2b.sat
  fi
}
if [ -n "$base_model" ]; then  # BASE: the members train over that model's encoder; stages 1-2b are not run
  if [ ! -f "$work/base.sat" ]; then cp "$base_model" "$work/base.sat.partial" && mv "$work/base.sat.partial" "$work/base.sat"; fi
  base=$work/base.sat
  recipe2="BASE=$base_model TUNE_AFTER=$tune_after TUNE_MORE=$tune_more"
  raw_unit=${tune_more:-$tune_after}
  if [ "$objects" = 0 ]; then raw_cache "$raw_unit"; else raw=$(cache_of "$raw_unit"); fi
else
  stages_1_to_2b
fi
member_cache() {  # sets `member_flags` and `member_features` (the members' cache: $raw, or with OBJECTS one holding them
  # too); with MIRROR=1, the training photos mirrored through the frozen part up to $raw_unit
  member_flags=()
  member_features=$raw
  if [ "$mirror" = 1 ]; then
    mirrored=${raw%.feat}_mirror.feat
    if [ ! -f "$mirrored" ]; then
      "$sat" --encoder-precision "$precision" extract --data "$data" --images "$data/train.txt" --out "$mirrored" \
        --encoder "$weights" --cut "$raw_unit" --size "$size" --raw --mirror
    fi
    member_flags=(--mirror-features "$mirrored")
  fi
  [ "$smooth" = 0 ] || member_flags+=(--label-smoothing "$smooth")  # 0: the flag is left out, the shipped command
  [ "$order3" = bahdanau ] || member_flags+=(--order "$order3")
  if [ "$objects" != 0 ]; then
    member_features=${raw%.feat}_$objects_as$objects.feat
    if [ ! -f "$member_features" ]; then
      "$sat" --encoder-precision "$precision" extract --data "$data" --images "$work/train_dev.txt" \
        --out "$member_features" --encoder "$weights" --cut "$raw_unit" --size "$size" --raw \
        --objects "$objects" --objects-as "$objects_as"
    fi
    member_flags+=(--objects "$objects" --objects-as "$objects_as")
  fi
}
tune4_stage() {  # from recipe: stage 4 over the model `from` (reads the objects), then ships and finishes
  local from=$1 recipe=$2 s run best="" best_b4=-1 choices=""
  if [ "$tune4" != "$raw_unit" ]; then  # the members' cache holds that unit's raw output
    echo "train-flickr8k-model.sh: TUNE4=$tune4 must be the unit whose raw output the members' cache holds ($raw_unit)" >&2
    exit 2
  fi
  for s in $seeds4; do
    run=$work/tune4_seed$s
    tune_run "$from" "$tune4" "$tune_lr4" "$lr4" "$epochs4" "$run" "$member_features" "$s" --precision f32
    choose_epoch "$sat" "$data" "$member_features" "$run"
    choices+=" seed $s: $(basename "$chosen") $chosen_b4;"
    if better "$chosen_b4" "$best_b4"; then best=$chosen best_b4=$chosen_b4; fi
  done
  ship "$sat" "$data" "$member_features" "$best" models/flickr8k.sat \
    "tools/train-flickr8k-model.sh ($settings $recipe TUNE4=$tune4 SEEDS4=$seeds4 EPOCHS4=$epochs4 LR4=$lr4 TUNE_LR4=$tune_lr4: $(basename "$from" .sat)'s model trained on with the units after $tune4 fine-tuned beside the objects, from their cache, one run per seed, each run's epoch chosen by dev BLEU-4 with beam 3 ($choices); of these, ${best#"$work"/}, chosen by dev BLEU-4 with beam 3)" \
    "$precision"
  finish "$member_features"
}
if [ "$members" = 0 ] && [ -n "$tune4" ]; then  # stage 4 straight over BASE (a model that reads the objects)
  member_cache
  tune4_stage "$base" "$recipe2 OBJECTS=$objects OBJECTS_AS=$objects_as"
fi
[ "$members" -gt 0 ] || finish "$raw"
members_stage() {  # base prefix name: $members decoders trained afresh over base's encoder (runs $work/<prefix>2, 3, ...),
  # each member's epoch chosen by step 3's rule, then by that rule the ensemble of base and the members, or one of
  # them alone (a decoder trained afresh over stage 2b's encoder beat both that model's own decoder and their
  # ensemble: README); with OBJECTS, base (which reads no objects) is left out; sets `shipped` and `choice`, and
  # `single` (the best of them alone)
  local base=$1 prefix=$2 name=$3 i run m b4 best_b4=-1 best_single=-1
  local ensemble=() scores=()  # each one's dev BLEU-4, alone (the members' cache: member_cache, run before)
  if [ "$objects" = 0 ]; then
    ensemble=("$base")
    scores=("$(dev_bleu4 "$sat" "$data" "$raw" "$base" --beam 3 --length-norm 1)")
  fi
  for ((i = 2; i <= members + 1; i++)); do
    run=$work/$prefix$i
    if [ -f "$run/checkpoint.sat" ]; then
      "$sat" train --resume "$run/checkpoint.sat" --more-epochs "$epochs3" --patience "$epochs3"
    else
      "$sat" train --init-from "$base" --fresh-decoder --tune-lr 0 --seed "$i" \
        --data "$data" --train-split "$data/train.txt" --val-split "$data/dev.txt" --features "$member_features" \
        "${member_flags[@]}" --epochs "$epochs3" --batch 16 --lr "$lr" --lr-decay 0.9 --penalty 1 \
        --patience "$epochs3" --val-limit 200 --metric bleu4 --checkpoint-every 100 --keep-epochs --out "$run"
    fi
    choose_epoch "$sat" "$data" "$member_features" "$run"
    ensemble+=("$chosen")
    scores+=("$chosen_b4")
  done
  if [ "${#ensemble[@]}" -ge 2 ]; then
    "$sat" model ensemble "${ensemble[@]}" --out "$work/$name"
    shipped=$work/$name choice="their ensemble (sat model ensemble)"
    best_b4=$(dev_bleu4 "$sat" "$data" "$member_features" "$shipped" --beam 3 --length-norm 1)
    echo "the ensemble: dev BLEU-4 $best_b4 (beam 3)"
  fi
  for i in "${!ensemble[@]}"; do
    m=${ensemble[$i]} b4=${scores[$i]}
    echo "$m alone: dev BLEU-4 $b4 (beam 3)"
    if better "$b4" "$best_single"; then single=$m best_single=$b4; fi
    if better "$b4" "$best_b4"; then shipped=$m choice="${m#"$work"/} alone" best_b4=$b4; fi
  done
}
# Stage 3: more decoders over the encoder of $base, then all of them as one model.
recipe3="$recipe2 MEMBERS=$members EPOCHS3=$epochs3 MIRROR=$mirror SMOOTH=$smooth"
[ "$order3" = bahdanau ] || recipe3+=" ORDER3=$order3"
tagged=""  # with OBJECTS, the members' runs and the stage's marks are named apart from those without
if [ "$objects" != 0 ]; then recipe3+=" OBJECTS=$objects OBJECTS_AS=$objects_as" tagged=_$objects_as$objects; fi
member_cache
if [ ! -f "$work/stage3$tagged.txt" ]; then  # a finished stage 3 names its best single model there (remove it to rerun)
  members_stage "$base" "member${tagged:+${tagged}_}" "ensemble$tagged.sat"
  ship "$sat" "$data" "$member_features" "$shipped" models/flickr8k.sat \
    "tools/train-flickr8k-model.sh ($settings $recipe3: $(basename "$base" .sat)'s model, MEMBERS more decoders trained afresh over its encoder, each member's epoch chosen by dev BLEU-4 with beam 3, and their ensemble; of these, $choice, chosen by dev BLEU-4 with beam 3)" \
    "$precision"
  echo "$single" >"$work/stage3$tagged.txt.partial" && mv "$work/stage3$tagged.txt.partial" "$work/stage3$tagged.txt"
fi
[ -z "$tune4" ] || tune4_stage "$(cat "$work/stage3$tagged.txt")" "$recipe3"
[ -n "$tune_most" ] || finish "$member_features"
# Stage 2c: stage 3's best single model (in float32) with still more of block3's units fine-tuned, its last epoch's
# encoder (the decoder trained beside it is replaced), then stage 3 again over that encoder.
stage3=$(cat "$work/stage3.txt")
raw_cache "$tune_most"
member_cache
tune_run "$stage3" "$tune_most" "$tune_lr2c" "$lr2c" "$epochs2c" "$work/stage2c"
base=$work/stage2c/model-epoch$epochs2c.sat
members_stage "$base" member2c_ ensemble2c.sat
ship "$sat" "$data" "$raw" "$shipped" models/flickr8k.sat \
  "tools/train-flickr8k-model.sh ($settings $recipe3 TUNE_MOST=$tune_most EPOCHS2C=$epochs2c LR2C=$lr2c TUNE_LR2C=$tune_lr2c: stage 3's best single model ($(basename "$stage3")) trained on with the units after $tune_most fine-tuned, from the raw output of $tune_most at $size, its last epoch's encoder; MEMBERS more decoders trained afresh over it, each member's epoch chosen by dev BLEU-4 with beam 3, and their ensemble with that epoch's model; of these, $choice, chosen by dev BLEU-4 with beam 3)" \
  "$precision"
finish "$raw"
