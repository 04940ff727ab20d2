#!/usr/bin/env python3
"""Nearest-neighbour caption baseline on a feature cache: tells weak features from a weak decoder.

Each image of the evaluation split gets a training caption: among the captions of its 10 nearest training images
(cosine of the mean-pooled grid), the one that agrees most with the others (word-set Jaccard). Score the result
with sat eval. Usage (numpy; Debian's /usr/bin/python3):
  tools/peers/knn-caption-baseline.py CACHE DATA_DIR TRAIN_LIST EVAL_LIST OUT.json
  build/sat eval --results OUT.json --refs DATA_DIR/captions.csv
"""
import csv
import json
import os
import struct
import sys

import numpy as np


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    cache, data, train_list, eval_list, out = sys.argv[1:]
    with open(cache, "rb") as f:
        if f.read(8) != b"SATFEAT1":
            sys.exit("%s: not a sat feature cache" % cache)
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    offset = ((16 + n + 4095) // 4096) * 4096
    L, D = head["grid_h"] * head["grid_w"], head["channels"]
    dtype = np.float16 if head["dtype"] == "f16" else np.float32
    grids = np.memmap(cache, dtype=dtype, mode="r", offset=offset, shape=(len(head["images"]), L, D))
    index = {name: i for i, name in enumerate(head["images"])}

    def names(path):
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]

    def pooled(images):
        v = np.stack([grids[index[x]].astype(np.float32).mean(0) for x in images])
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    captions = {}
    with open(os.path.join(data, "captions.csv")) as f:
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            captions.setdefault(row[0], []).append(row[1])
    train, evaluate = names(train_list), names(eval_list)
    similarity = pooled(evaluate) @ pooled(train).T
    results = []
    for i, name in enumerate(evaluate):
        pool = [c for j in np.argsort(-similarity[i])[:10] for c in captions[train[j]]]
        words = [set(c.lower().split()) for c in pool]
        agreement = [sum(len(a & b) / len(a | b) for k, b in enumerate(words) if k != j) for j, a in enumerate(words)]
        results.append({"image_id": name, "caption": pool[int(np.argmax(agreement))]})
    with open(out + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(out + ".partial", out)
    print("%d captions written to %s" % (len(results), out))


if __name__ == "__main__":
    main()
