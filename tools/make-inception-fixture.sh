#!/bin/sh
# Regenerates tests/fixtures/inception_v3_tfjs.safetensors: reference InceptionV3 activations (mixed5, mixed7)
# computed by TensorFlow.js for examples/dog_and_man.jpg at 160x160 and 299x299.
# Needs node/npm (apt: nodejs npm) and python3-opencv (to write the resized pixels as PPM).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
npm pack --silent nsfwjs@4.3.0 >/dev/null && tar xzf nsfwjs-4.3.0.tgz
npm init -y >/dev/null && npm install --silent @tensorflow/tfjs@4.22.0 >/dev/null
/usr/bin/python3 - "$ROOT/examples/dog_and_man.jpg" <<'PY'
import sys, cv2
im = cv2.imread(sys.argv[1])
cv2.imwrite("in160.ppm", cv2.resize(im, (160, 160), interpolation=cv2.INTER_AREA))
cv2.imwrite("in299.ppm", cv2.resize(im, (299, 299), interpolation=cv2.INTER_LINEAR))
PY
NODE_PATH="$WORK/node_modules" node "$ROOT/tools/inception-fixture.js" package/dist/models/inception_v3 \
  "$ROOT/tests/fixtures/inception_v3_tfjs.safetensors" in160.ppm in299.ppm
