#!/bin/sh
# Rebuilds models/inception_v3.sat: Keras InceptionV3 as shipped (tfjs, uint8-quantized) in the npm package
# nsfwjs@4.3.0 (MIT), imported up to mixed7. Layers up to mixed5 hold Keras's ImageNet weights (MIT); nsfwjs
# fine-tuned the later ones. Inputs are RGB / 255 (the batch-norm statistics fit [0, 1]).
#   usage: tools/import-inception.sh [build/sat] [out.sat]
set -eu
SAT=${1:-build/sat}
OUT=${2:-models/inception_v3.sat}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent nsfwjs@4.3.0 >/dev/null && tar xzf nsfwjs-4.3.0.tgz)
"$SAT" import-tfjs "$WORK/package/dist/models/inception_v3" --out "$OUT" --cut mixed7 \
  --source "npm nsfwjs@4.3.0 dist/models/inception_v3 (Keras InceptionV3; ImageNet weights up to mixed5)" \
  --licence "MIT (nsfwjs; Keras applications weights)"
