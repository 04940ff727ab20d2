#!/usr/bin/env bash
# Rebuilds the bundled synthetic-scene model (models/synth.sat) from nothing: generates the data, trains,
# copies the best model. About 14 minutes on 2 cores. Usage: tools/train-synth-model.sh [WORKDIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$top/runs/synth-recipe}
sat=$top/build/sat
mkdir -p "$work"
cd "$work"
start=$(date +%s)
"$sat" synth --out data/synth-train --images 6000 --seed 1
"$sat" synth --out data/synth-val --images 500 --seed 2
"$sat" train --data data/synth-train --val-data data/synth-val --out model --epochs 18 --lr 2e-3 --lr-decay 0.85 \
  --penalty 0 --captions-per-image 2 --patience 6 --coverage true
echo "synth + train wall time: $(( $(date +%s) - start )) s"
cp model/model.sat "$top/models/synth.sat"
echo "wrote $top/models/synth.sat"
