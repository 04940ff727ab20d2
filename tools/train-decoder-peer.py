#!/usr/bin/python3
"""Trains the soft-attention decoder in PyTorch 1.13 on a sat feature cache, so sat's Flickr8k scores and training
speed can be checked against the same model written the way the PyTorch tutorials write it.

The model is the one tools/bench-decoder-peer.py times (init MLP from the mean feature, additive attention, scalar
gate beta, deep output, dropout 0.5, doubly stochastic penalty); the recipe is the one tools/compare-attention.py
gives sat's "soft" row on Flickr8k: the same feature cache, vocabulary rule (words seen 5+ times, sat's tokenizer
rule), captions cut at 20 words, 16 photos x 5 captions per step, Adam 5e-4 x 0.9 per epoch, clipping at 5, 3 epochs.
It then captions the dev photos greedily and writes a COCO results file; score it with sat's metrics:

  /usr/bin/python3 tools/train-decoder-peer.py --flickr8k ../shared/data/flickr8k --features f8k_mixed5_299.feat \
      --out runs/peer --embed 256 --hidden 256 --attn 256 --epochs 3 --threads 1
  build/sat eval --results runs/peer/dev_results.json --refs ../shared/data/flickr8k/captions.csv

Each epoch ends with a checkpoint (runs/peer/checkpoint.pt, written atomically); a rerun continues from it.
Needs Debian's python3-torch and libopenblas0-pthread.
"""
import argparse
import collections
import csv
import importlib.util
import json
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_peer_decoder():
    spec = importlib.util.spec_from_file_location("bench_decoder_peer", os.path.join(HERE, "bench-decoder-peer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Decoder


class FeatureCache:
    """Reads sat's feature cache (datasets/features.hpp): magic, header JSON, records at a 4096-byte boundary."""

    def __init__(self, path):
        with open(path, "rb") as f:
            head = f.read(16)
            if head[:8] != b"SATFEAT1":
                sys.exit("%s: not a sat feature cache" % path)
            n = int.from_bytes(head[8:16], "little")
            self.header = json.loads(f.read(n))
        payload = (16 + n + 4095) // 4096 * 4096
        h = self.header
        self.L, self.D = h["grid_h"] * h["grid_w"], h["channels"]
        dtype = np.float16 if h["dtype"] == "f16" else np.float32
        self.records = np.memmap(path, dtype=dtype, mode="r", offset=payload, shape=(len(h["images"]), self.L, self.D))
        self.index = {name: i for i, name in enumerate(h["images"])}

    def grids(self, names):
        return torch.from_numpy(np.stack([self.records[self.index[n]] for n in names]).astype(np.float32))


def tokenize(text):
    # sat's rule (datasets/vocab.cpp): runs of letters, digits and apostrophes, lower-cased; a lone "'" is dropped
    words, cur = [], ""
    for ch in text:
        if ch.isalnum() or ch == "'" or ord(ch) >= 0x80:
            cur += ch.lower()
        elif cur:
            words.append(cur)
            cur = ""
    if cur:
        words.append(cur)
    return [w for w in words if w != "'"]


def read_captions(path):
    caps = collections.defaultdict(list)
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            caps[row[0]].append(row[1])
    return caps


def read_split(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def greedy(model, feats, max_len, start, end, banned):
    """Greedy captions for a batch of grids (eval mode): the same steps as the model's forward."""
    B = feats.shape[0]
    mean = feats.mean(1)
    h, c = torch.tanh(model.init_h(mean)), torch.tanh(model.init_c(mean))
    UA = model.feat_proj(feats)
    word = torch.full((B,), start, dtype=torch.long)
    out = []
    for _ in range(max_len):
        e = model.v(torch.tanh(UA + model.query_proj(h).unsqueeze(1))).squeeze(2)
        alpha = torch.softmax(e, 1)
        z = torch.sigmoid(model.gate(h)) * torch.bmm(alpha.unsqueeze(1), feats).squeeze(1)
        emb = model.embed(word)
        h, c = model.lstm(torch.cat([emb, z], 1), (h, c))
        logits = model.out(torch.tanh(emb + model.out_hidden(h) + model.out_context(z)))
        logits[:, banned] = -1e9
        word = logits.argmax(1)
        out.append(word)
    out = torch.stack(out, 1).tolist()
    captions = []
    for seq in out:
        words = []
        for w in seq:
            if w == end:
                break
            words.append(w)
        captions.append(words)
    return captions


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flickr8k", required=True, help="directory with captions.csv, train.txt, dev.txt")
    ap.add_argument("--features", required=True, help="sat feature cache holding the train and dev photos")
    ap.add_argument("--out", required=True)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--attn", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="photos per step (each brings all its captions)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--lr-decay", type=float, default=0.9)
    ap.add_argument("--penalty", type=float, default=1.0)
    ap.add_argument("--max-len", type=int, default=20)
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)

    cache = FeatureCache(a.features)
    caps = read_captions(os.path.join(a.flickr8k, "captions.csv"))
    train = read_split(os.path.join(a.flickr8k, "train.txt"))
    dev = read_split(os.path.join(a.flickr8k, "dev.txt"))
    for name in train + dev:
        if name not in cache.index:
            sys.exit("%s: image %s is not in the cache" % (a.features, name))
    full = {n: [tokenize(c) for c in caps[n]] for n in train}
    counts = collections.Counter(w for n in train for c in full[n] for w in c)  # sat counts whole captions
    tokens = {n: [c[:a.max_len] for c in full[n]] for n in train}
    words = ["<pad>", "<start>", "<end>", "<unk>"] + sorted(w for w, k in counts.items() if k >= a.min_count)
    index = {w: i for i, w in enumerate(words)}
    PAD, START, END, UNK = 0, 1, 2, 3
    print("vocabulary %d words, %d training photos, %d dev photos" % (len(words), len(train), len(dev)), flush=True)

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    Decoder = load_peer_decoder()
    model = Decoder(len(words), a.embed, a.hidden, a.attn, cache.D)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    ckpt_path = os.path.join(a.out, "checkpoint.pt")
    first_epoch, log = 0, []
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        first_epoch, log = ck["epoch"], ck["log"]
        random.setstate(ck["py_rng"])
        torch.set_rng_state(ck["torch_rng"])
        print("resumed after epoch %d" % first_epoch, flush=True)

    for epoch in range(first_epoch, a.epochs):
        for g in opt.param_groups:
            g["lr"] = a.lr * a.lr_decay ** epoch
        model.train()
        order = train[:]
        random.shuffle(order)
        t0, seen, loss_sum, steps = time.time(), 0, 0.0, 0
        for s in range(0, len(order), a.batch):
            names = order[s:s + a.batch]
            grids = cache.grids(names)
            rows, seqs = [], []
            for i, n in enumerate(names):
                for c in tokens[n]:
                    rows.append(i)
                    seqs.append([index.get(w, UNK) for w in c])
            T = max(len(q) for q in seqs) + 1
            inputs = torch.full((len(seqs), T), PAD, dtype=torch.long)
            targets = torch.full((len(seqs), T), PAD, dtype=torch.long)
            mask = torch.zeros(len(seqs), T)
            for r, q in enumerate(seqs):
                inputs[r, :len(q) + 1] = torch.tensor([START] + q)
                targets[r, :len(q) + 1] = torch.tensor(q + [END])
                mask[r, :len(q) + 1] = 1
            feats = grids[torch.tensor(rows)]
            loss = model(feats, inputs, targets, mask, a.penalty)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            seen += len(seqs)
            loss_sum += loss.item()
            steps += 1
            if steps % 50 == 0:
                print("epoch %d step %d loss %.3f %.1f captions/s" % (epoch + 1, steps, loss_sum / steps,
                                                                     seen / (time.time() - t0)), flush=True)
        speed = seen / (time.time() - t0)
        log.append({"epoch": epoch + 1, "loss": loss_sum / steps, "captions_per_second": speed,
                    "seconds": time.time() - t0})
        print("epoch %d done: loss %.3f, %.1f captions/s" % (epoch + 1, loss_sum / steps, speed), flush=True)
        tmp = ckpt_path + ".partial"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1, "log": log,
                    "py_rng": random.getstate(), "torch_rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, ckpt_path)

    model.eval()
    results = []
    banned = [PAD, START, UNK]
    with torch.no_grad():
        for s in range(0, len(dev), 50):
            names = dev[s:s + 50]
            for n, seq in zip(names, greedy(model, cache.grids(names), a.max_len, START, END, banned)):
                results.append({"image_id": n, "caption": " ".join(words[w] for w in seq)})
    path = os.path.join(a.out, "dev_results.json")
    with open(path + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(path + ".partial", path)
    summary = {"epochs": log, "mean_captions_per_second": sum(e["captions_per_second"] for e in log) / len(log),
               "threads": a.threads, "torch": torch.__version__, "results": path}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
