# Sourced by the Flickr8k recipes (tools/train-flickr8k-model.sh, tools/train-flickr8k-inception-model.sh): after a
# run kept every epoch's model, choose and ship one, all on the 1000 dev photos.
#   choose_and_ship SAT DATA FEATURES RUN_DIR OUT RECIPE [ENCODER_PRECISION]: choose_epoch, then ship
#   choose_epoch SAT DATA FEATURES RUN_DIR: sets `chosen` and its BLEU-4, `chosen_b4` (step 1)
#   ship SAT DATA FEATURES MODEL OUT RECIPE [ENCODER_PRECISION]: steps 2-4 for one model (an ensemble too)
#   consensus_stage FEATURES OUT [ENCODER_PRECISION]: step 5 for the shipped model OUT (needs $sat, $data, $work)
#   evidence_stage, decoder_precision_stage FEATURES OUT [ENCODER_PRECISION]: steps 6 and 7 (need $sat, $data)
#   relevance_stage FEATURES OUT [ENCODER_PRECISION]: step 8 (needs $sat, $data, $work)
#   neighbour_evidence_stage FEATURES OUT [ENCODER_PRECISION]: step 9 (needs $sat, $data, $work)
#   beam_evidence_stage FEATURES OUT [ENCODER_PRECISION]: step 10 (needs $sat, $data, $work)
#  1. candidates: every epoch (RUN_DIR/model-epochN.sat) and the weight averages of the last 2, 3 and 4 epochs
#     (sat model average), the best by BLEU-4 with beam 3, length norm 1;
#  2. compacted to float16 (sat model compact) with RECIPE plus the choice recorded;
#  3. the search settings chosen by BLEU-4 and stored (sat model set): beam width (3, 5), length normalization
#     (0, 0.5, 1), repeat blocking (none, or no 3-word phrase twice); with ENCODER_PRECISION (f32, bf16, auto), the
#     encoder's arithmetic stored too (sat model set --encoder-precision); its dev scores recorded (sat eval
#     --record: from FEATURES, or with ENCODER_PRECISION from the photos, encoded in that arithmetic);
#  4. renamed onto OUT;
#  5. consensus reranking: a caption memory of the training photos from FEATURES (sat model memory; with $cca > 0,
#     its keys projected onto that many CCA directions learned from the training captions' words, regularization
#     $cca_regularization), its use chosen by BLEU-4 against OUT's own settings without it: beam width (5, 10, 20,
#     30, 40), neighbours (20, 30, 60), weight (8, 12, 20) (sat model set; its dev scores recorded as in step 3);
#     without a gain OUT stays as it was. A finished step
#     keeps its result as $work/consensus.sat and the checksum of the OUT it started from in $work/memory.txt: a
#     rerun over the same OUT (or over that result) ships that result again.
#  6. the detector's evidence (a model that reads the objects): each candidate's total also gains V x (the detector's
#     peak minus T, summed over the objects it names), V (2, 4, 8) and T (0.1, 0.15, 0.2, 0.25) chosen by BLEU-4
#     among the settings that make no more false mentions of the rarer objects than OUT without it (sat model set
#     --object-evidence V --evidence-threshold T; its dev scores recorded as in step 3); without a gain OUT stays as it
#     was.
#  7. the decoder's arithmetic when captioning: where bf16 is this CPU's faster arithmetic and OUT searches in float32,
#     OUT searches in bf16 (sat model set --decoder-precision bf16; its dev scores recorded as in step 3) unless that
#     lowers dev BLEU-4 by more than 0.002; elsewhere OUT stays as it was.
#  8. the captions' relevance (a caption memory whose keys CCA projects, with its word side): each candidate's total
#     also gains R x the cosine of its words with the photo in the CCA space. R (0.5, 1, 2, 4) is scored against OUT
#     without it by the paired bootstrap over the dev photos (sat eval --baseline, 2000 resamples): among the R whose
#     CIDEr-D gain's 95% interval lies above 0, whose BLEU-4 is not lower beyond chance (the interval of its
#     difference reaches 0) and that make no more false mentions of the rarer objects, the best CIDEr-D is stored
#     (sat model set --relevance-weight R; its dev scores recorded as in step 3); without one OUT stays as it was.
#  9. the nearest memory photos' captions in the objects' evidence (a model with the detector's evidence on and a
#     caption memory): each object's evidence becomes (1 - M) x the detector's peak + M x the share of the nearest
#     memory photos' captions that name it. M (0.5, 0.75, 1) with V (4, 8) and T (0.15, 0.2, 0.25), each scored
#     against OUT as it is by the paired bootstrap (2000 resamples): among the settings that make no more false
#     mentions of the rarer objects and whose BLEU-4 and CIDEr-D are not lower beyond chance, the one naming the most
#     rarer objects (ties: fewer false mentions) is stored if it names more than OUT (sat model set
#     --neighbour-evidence M --object-evidence V --evidence-threshold T; its dev scores recorded as in step 3); else
#     OUT stays as it was.
# 10. the objects' evidence steering the beam (a model with the detector's evidence on): each beam row's rank gains
#     B x (the object's evidence minus T) the first time it names the object. B (2, 4, 6) with T (0.2, 0.25, 0.3,
#     0.35), each scored against OUT unsteered by the paired bootstrap, chosen by step 9's rule (sat model set
#     --beam-evidence B --evidence-threshold T; its dev scores recorded as in step 3); else OUT stays as it was.
dev_bleu4() {  # sat data features model [eval flags]: BLEU-4 on the 1000 dev photos
  local sat=$1 data=$2 features=$3 m=$4
  shift 4
  "$sat" eval --model "$m" --data "$data" --split "$data/dev.txt" --features "$features" "$@" --json \
    | json_bleu4
}
# awk, not python3: a recipe run makes hundreds of these calls, and python's start costs 30-150 ms each
json_bleu4() {  # reads sat eval --json, prints its BLEU-4 (a plain number); fails without one
  awk 'match($0, /"Bleu_4": *[-+0-9.eE]+/) { v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); print v; found = 1 }
       END { exit !found }'
}
# model features precision: its dev scores stored in it (sat eval --record), from FEATURES, or with an encoder
# precision from the photos, encoded in that arithmetic (needs $sat, $data)
record_dev_scores() {
  if [ -n "$3" ]; then
    "$sat" eval --model "$1" --data "$data" --split "$data/dev.txt" --record
  else
    "$sat" eval --model "$1" --data "$data" --split "$data/dev.txt" --features "$2" --record
  fi
}
better() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }
json_cider() {  # reads sat eval --json, prints its CIDEr-D; fails without one
  awk 'match($0, /"CIDEr": *[-+0-9.eE]+/) { v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); print v; found = 1; exit }
       END { exit !found }'
}
json_difference() {  # metric field: reads sat eval --baseline --json, prints that metric's field (low, high, ...)
  awk -v metric="\"$1\": {" -v field="\"$2\": *[-+0-9.eE]+" '
       index($0, metric) { inside = 1; next }
       inside && match($0, field) { v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); print v; found = 1; exit }
       inside && /}/ { inside = 0 }
       END { exit !found }'
}
json_rare_named() {  # reads sat eval --json, prints how many of the rarer objects' photos it named; fails without
  awk '{ line = $0 } !rare && match(line, /"rare": *\{/) { rare = 1; line = substr(line, RSTART) }
       rare && match(line, /"named": *[0-9]+/) {
         v = substr(line, RSTART, RLENGTH); sub(/.*: */, "", v); print v; found = 1; exit }
       END { exit !found }'
}
json_rare_false() {  # reads sat eval --json, prints the false mentions of the rarer objects; fails without them
  awk '{ line = $0 } !rare && match(line, /"rare": *\{/) { rare = 1; line = substr(line, RSTART) }
       rare && match(line, /"false_mentions": *[0-9]+/) {
         v = substr(line, RSTART, RLENGTH); sub(/.*: */, "", v); print v; found = 1; exit }
       END { exit !found }'
}

choose_epoch() {
  local sat=$1 data=$2 features=$3 run=$4
  local epochs last k e avg m b4
  epochs=$(ls "$run"/model-epoch*.sat | sed 's/.*model-epoch\([0-9]*\)\.sat/\1/' | sort -n)
  last=$(echo "$epochs" | tail -n 1)
  local candidates=()
  for e in $epochs; do candidates+=("$run/model-epoch$e.sat"); done
  for k in 2 3 4; do  # checkpoint averages of the last k epochs
    [ "$last" -ge "$k" ] || continue
    avg=$run/average-epochs$((last - k + 1))-$last.sat
    if [ ! -f "$avg" ]; then
      "$sat" model average $(for ((e = last - k + 1; e <= last; e++)); do echo "$run/model-epoch$e.sat"; done) \
        --out "$avg"
    fi
    candidates+=("$avg")
  done
  local best_b4=-1
  chosen=""
  for m in "${candidates[@]}"; do
    b4=$(dev_bleu4 "$sat" "$data" "$features" "$m" --beam 3 --length-norm 1)
    echo "$(basename "$m"): dev BLEU-4 $b4 (beam 3)"
    if better "$b4" "$best_b4"; then chosen=$m best_b4=$b4; fi
  done
  chosen_b4=$best_b4
}

ship() {
  local sat=$1 data=$2 features=$3 model=$4 out=$5 recipe=$6 precision=${7:-}
  local k a r b4
  "$sat" model compact "$model" --out "$out.new" --recipe "$recipe"
  local best_a=1 best_k=3 best_r=0 best_b4=-1
  for r in 0 3; do
    for k in 3 5; do
      for a in 0 0.5 1; do
        b4=$(dev_bleu4 "$sat" "$data" "$features" "$out.new" --beam $k --length-norm $a --no-repeat $r)
        echo "beam $k, length normalization $a, no repeated $r-word phrase: dev BLEU-4 $b4"
        if better "$b4" "$best_b4"; then best_a=$a best_k=$k best_r=$r best_b4=$b4; fi
      done
    done
  done
  "$sat" model set "$out.new" --out "$out.new" --length-norm "$best_a" --beam "$best_k" --no-repeat "$best_r"
  if [ -n "$precision" ]; then
    "$sat" model set "$out.new" --out "$out.new" --encoder-precision "$precision"
  fi
  record_dev_scores "$out.new" "$features" "$precision"
  mv "$out.new" "$out"
  echo "wrote $out"
}

choose_and_ship() {
  local sat=$1 data=$2 features=$3 run=$4 out=$5 recipe=$6 precision=${7:-}
  choose_epoch "$sat" "$data" "$features" "$run"
  ship "$sat" "$data" "$features" "$chosen" "$out" "$recipe; $(basename "$chosen") chosen by dev BLEU-4 with beam 3)" \
    "$precision"
}

consensus_stage() {
  local features=$1 out=$2 precision=${3:-}
  local k n w b4 best_b4 best="" given
  given=$(cksum <"$out")
  if [ -f "$work/memory.txt" ] && [ -f "$work/consensus.sat" ]; then  # done before, for this model or its result
    if [ "$given" = "$(cat "$work/memory.txt")" ] || cmp -s "$out" "$work/consensus.sat"; then
      cp "$work/consensus.sat" "$out.memory" && mv "$out.memory" "$out"
      echo "consensus reranking: done before ($work/consensus.sat)"
      return 0
    fi
  fi
  local projection=()
  if [ "${cca:-0}" -gt 0 ]; then projection=(--cca "$cca" --cca-regularization "${cca_regularization:-0.1}"); fi
  "$sat" model memory "$out" --data "$data" --split "$data/train.txt" --features "$features" "${projection[@]}" \
    --out "$out.memory"
  best_b4=$(dev_bleu4 "$sat" "$data" "$features" "$out.memory" --consensus-weight 0)
  echo "without consensus reranking: dev BLEU-4 $best_b4"
  for k in 5 10 20 30 40; do
    for n in 20 30 60; do
      for w in 8 12 20; do
        b4=$(dev_bleu4 "$sat" "$data" "$features" "$out.memory" --beam $k --neighbours $n --consensus-weight $w)
        echo "beam $k, $n neighbours, consensus weight $w: dev BLEU-4 $b4"
        if better "$b4" "$best_b4"; then best="$k $n $w" best_b4=$b4; fi
      done
    done
  done
  if [ -z "$best" ]; then
    echo "consensus reranking does not raise dev BLEU-4: $out ships without a caption memory"
    rm "$out.memory"
  else
    read -r k n w <<<"$best"
    "$sat" model set "$out.memory" --out "$out.memory" --beam "$k" --neighbours "$n" --consensus-weight "$w"
    record_dev_scores "$out.memory" "$features" "$precision"
    mv "$out.memory" "$out"
    echo "wrote $out with consensus reranking (beam $k, $n neighbours, weight $w)"
  fi
  cp "$out" "$work/consensus.sat.partial" && mv "$work/consensus.sat.partial" "$work/consensus.sat"
  echo "$given" >"$work/memory.txt.partial" && mv "$work/memory.txt.partial" "$work/memory.txt"
}

evidence_stage() {  # features out [encoder precision]: step 6 for the shipped model OUT (needs $sat, $data)
  local features=$1 out=$2 precision=${3:-}
  local v t json b4 false best="" best_b4 base_false
  json=$("$sat" eval --model "$out" --data "$data" --split "$data/dev.txt" --features "$features" --object-evidence 0 --json)
  best_b4=$(json_bleu4 <<<"$json")
  base_false=$(json_rare_false <<<"$json")
  echo "without the detector's evidence: dev BLEU-4 $best_b4, $base_false false mentions of the rarer objects"
  for v in 2 4 8; do
    for t in 0.1 0.15 0.2 0.25; do
      json=$("$sat" eval --model "$out" --data "$data" --split "$data/dev.txt" --features "$features" \
        --object-evidence $v --evidence-threshold $t --json)
      b4=$(json_bleu4 <<<"$json")
      false=$(json_rare_false <<<"$json")
      echo "the detector's evidence weighed $v, threshold $t: dev BLEU-4 $b4, $false false mentions"
      if [ "$false" -le "$base_false" ] && better "$b4" "$best_b4"; then best="$v $t" best_b4=$b4; fi
    done
  done
  if [ -z "$best" ]; then
    echo "the detector's evidence does not raise dev BLEU-4 without more false mentions: $out stays as it was"
    return 0
  fi
  read -r v t <<<"$best"
  store_settings "$out" evidence "the detector's evidence weighed $v (threshold $t)" --object-evidence "$v" \
    --evidence-threshold "$t"
}

decoder_precision_stage() {  # features out [encoder precision]: step 7 for the shipped model OUT (needs $sat, $data)
  local features=$1 out=$2 precision=${3:-}
  local info b4 b4_bf16
  info=$("$sat" model info "$out" --json)
  if [[ "$info" =~ \"decoder_precision\":\ *\"bf16\" ]]; then echo "$out's decoder already searches in bf16"; return 0; fi
  "$sat" model set "$out" --out "$out.bf16" --decoder-precision bf16 >/dev/null
  info=$("$sat" model info "$out.bf16" --json)
  if ! [[ "$info" =~ \"decoder_precision_in_use\":\ *\"bf16\" ]]; then
    rm -f "$out.bf16"
    echo "bf16 is not the faster arithmetic on this CPU: $out's decoder searches in float32"
    return 0
  fi
  b4=$(dev_bleu4 "$sat" "$data" "$features" "$out")
  b4_bf16=$(dev_bleu4 "$sat" "$data" "$features" "$out.bf16")
  echo "the decoder's products in float32: dev BLEU-4 $b4; in bf16: $b4_bf16"
  if better "$b4" "$(awk -v a="$b4_bf16" 'BEGIN { print a + 0.002 }')"; then
    rm -f "$out.bf16"
    echo "bf16 lowers dev BLEU-4 by more than 0.002: $out's decoder searches in float32"
    return 0
  fi
  record_dev_scores "$out.bf16" "$features" "$precision"
  mv "$out.bf16" "$out"
  echo "wrote $out with its decoder searching in bf16"
}

# out suffix description flags...: the flags' settings stored in OUT (sat model set into OUT.SUFFIX, its dev scores
# recorded as in step 3, then renamed onto OUT; needs $sat, $data, $features and $precision, the caller's)
store_settings() {
  local out=$1 changed=$1.$2 what=$3
  shift 3
  "$sat" model set "$out" --out "$changed" "$@"
  record_dev_scores "$changed" "$features" "$precision"
  mv "$changed" "$out"
  echo "wrote $out with $what"
}

dev_json() {  # model features [eval flags]: sat eval's JSON on the 1000 dev photos from that cache (needs $sat, $data)
  local m=$1 features=$2
  shift 2
  "$sat" eval --model "$m" --data "$data" --split "$data/dev.txt" --features "$features" "$@" --json
}
# model features baseline results [eval flags]: one setting scored on the dev photos against a baseline's results
# file: sets `scored` (sat eval's JSON, its captions written to RESULTS) and `compared` (the paired bootstrap of
# RESULTS against BASELINE, sat eval --baseline, 2000 resamples; needs $sat, $data)
score_against() {
  local m=$1 features=$2 baseline=$3 results=$4
  shift 4
  scored=$(dev_json "$m" "$features" "$@" --results-out "$results")
  compared=$("$sat" eval --results "$results" --baseline "$baseline" --refs "$data/captions.csv" --resamples 2000 \
    --seed 1 --json)
}

relevance_stage() {  # features out [encoder precision]: step 8 for the shipped model OUT (needs $sat, $data, $work)
  local features=$1 out=$2 precision=${3:-}
  local r json scored compared cider false low b4_high best="" best_cider base_false base_results=$work/relevance_0.json
  if ! [[ "$("$sat" model info "$out" --json)" =~ \"word_side\":\ *true ]]; then
    echo "$out has no caption memory with a word side: no relevance to weigh"
    return 0
  fi
  json=$("$sat" eval --model "$out" --data "$data" --split "$data/dev.txt" --features "$features" \
    --relevance-weight 0 --json --results-out "$base_results")
  best_cider=$(json_cider <<<"$json")
  base_false=$(json_rare_false <<<"$json")
  echo "without the captions' relevance: dev CIDEr-D $best_cider, $base_false false mentions of the rarer objects"
  for r in 0.5 1 2 4; do
    score_against "$out" "$features" "$base_results" "$work/relevance_$r.json" --relevance-weight $r
    cider=$(json_cider <<<"$scored")
    false=$(json_rare_false <<<"$scored")
    low=$(json_difference CIDEr low <<<"$compared")
    b4_high=$(json_difference Bleu_4 high <<<"$compared")
    echo "the captions' relevance weighed $r: dev CIDEr-D $cider (the gain's 95% interval from $low), BLEU-4's" \
      "difference up to $b4_high, $false false mentions"
    if better "$low" 0 && ! better 0 "$b4_high" && [ "$false" -le "$base_false" ] && better "$cider" "$best_cider"; then
      best=$r best_cider=$cider
    fi
  done
  if [ -z "$best" ]; then
    echo "the captions' relevance does not raise dev CIDEr-D beyond chance: $out stays as it was"
    return 0
  fi
  store_settings "$out" relevance "the captions' relevance weighed $best" --relevance-weight "$best"
}

# setting description: steps 9 and 10's rule for one setting scored by score_against (`scored`, `compared`): where
# it makes no more false mentions of the rarer objects than the model as it is ($base_false) and neither its BLEU-4
# nor its CIDEr-D is lower beyond chance, it becomes `best` if it names more of the rarer objects than `best_named`
# (or as many with fewer false mentions than `best_false`); prints what it scored
keep_if_more_named() {
  local named false high_b4 high_cider
  named=$(json_rare_named <<<"$scored")
  false=$(json_rare_false <<<"$scored")
  high_b4=$(json_difference Bleu_4 high <<<"$compared")
  high_cider=$(json_difference CIDEr high <<<"$compared")
  echo "$2: $named named, $false false mentions; BLEU-4's difference up to $high_b4, CIDEr-D's up to $high_cider"
  better 0 "$high_b4" && return 0    # BLEU-4 lower beyond chance
  better 0 "$high_cider" && return 0 # CIDEr-D lower beyond chance
  [ "$false" -le "$base_false" ] || return 0
  if better "$named" "$best_named" || { [ "$named" = "$best_named" ] && [ -n "$best" ] && better "$best_false" "$false"; }; then
    best=$1 best_named=$named best_false=$false
  fi
}

neighbour_evidence_stage() {  # features out [encoder precision]: step 9 for the shipped model OUT (needs $sat, $data, $work)
  local features=$1 out=$2 precision=${3:-}
  local info m v t json scored compared best="" best_named best_false base_false
  local base_results=$work/neighbour_evidence_0.json results
  info=$("$sat" model info "$out" --json)
  if [[ "$info" =~ \"caption_memory\":\ *null ]] || [[ "$info" =~ \"object_evidence\":\ *null ]]; then
    echo "$out does not weigh the detector's evidence with a caption memory: no neighbours' captions to weigh in"
    return 0
  fi
  json=$("$sat" eval --model "$out" --data "$data" --split "$data/dev.txt" --features "$features" --json \
    --results-out "$base_results")
  best_named=$(json_rare_named <<<"$json")
  base_false=$(json_rare_false <<<"$json")
  best_false=$base_false
  echo "as it is: $best_named of the rarer objects' photos named, $base_false false mentions"
  for m in 0.5 0.75 1; do
    for v in 4 8; do
      for t in 0.15 0.2 0.25; do
        results=$work/neighbour_evidence_${m}_${v}_$t.json
        score_against "$out" "$features" "$base_results" "$results" --neighbour-evidence $m --object-evidence $v \
          --evidence-threshold $t
        keep_if_more_named "$m $v $t" "the neighbours' captions $m of the evidence, weighed $v, threshold $t"
      done
    done
  done
  if [ -z "$best" ]; then
    echo "the neighbours' captions name no more of the rarer objects within these bounds: $out stays as it was"
    return 0
  fi
  read -r m v t <<<"$best"
  store_settings "$out" neighbours "the neighbours' captions $m of the objects' evidence (weight $v, threshold $t)" \
    --neighbour-evidence "$m" --object-evidence "$v" --evidence-threshold "$t"
}

beam_evidence_stage() {  # features out [encoder precision]: step 10 for the shipped model OUT (needs $sat, $data, $work)
  local features=$1 out=$2 precision=${3:-}
  local info b t json scored compared best="" best_named best_false base_false
  local base_results=$work/beam_evidence_0.json
  info=$("$sat" model info "$out" --json)
  if [[ "$info" =~ \"object_evidence\":\ *null ]]; then
    echo "$out does not weigh the detector's evidence: none to steer the beam with"
    return 0
  fi
  json=$("$sat" eval --model "$out" --data "$data" --split "$data/dev.txt" --features "$features" --beam-evidence 0 \
    --json --results-out "$base_results")
  best_named=$(json_rare_named <<<"$json")
  base_false=$(json_rare_false <<<"$json")
  best_false=$base_false
  echo "the beam unsteered: $best_named of the rarer objects' photos named, $base_false false mentions"
  for b in 2 4 6; do
    for t in 0.2 0.25 0.3 0.35; do
      score_against "$out" "$features" "$base_results" "$work/beam_evidence_${b}_$t.json" --beam-evidence $b \
        --evidence-threshold $t
      keep_if_more_named "$b $t" "the beam steered by the evidence, weight $b, threshold $t"
    done
  done
  if [ -z "$best" ]; then
    echo "steering the beam names no more of the rarer objects within these bounds: $out stays as it was"
    return 0
  fi
  read -r b t <<<"$best"
  store_settings "$out" steered "the beam steered by the objects' evidence (weight $b, threshold $t)" \
    --beam-evidence "$b" --evidence-threshold "$t"
}
