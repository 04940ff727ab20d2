#!/usr/bin/python3
"""Trains the soft-attention decoder in PyTorch 1.13 on a sat feature cache, so sat's Flickr8k scores and training
speed can be checked against the same model written the way the PyTorch tutorials write it.

The model is the one tools/peers/bench-decoder-peer.py times (init MLP from the mean feature, additive attention, scalar
gate beta, deep output, dropout 0.5, doubly stochastic penalty); the recipe is the one tools/compare-attention.py
gives sat's "soft" row on Flickr8k: the same feature cache, vocabulary rule (words seen 5+ times, sat's tokenizer
rule), captions cut at 20 words, 16 photos x 5 captions per step, Adam 5e-4 x 0.9 per epoch, clipping at 5, 3 epochs.
It then captions the dev photos greedily and writes a COCO results file; score it with sat's metrics:

  /usr/bin/python3 tools/peers/train-decoder-peer.py --flickr8k ../shared/data/flickr8k --features f8k_mixed5_299.feat \
      --out runs/peer --embed 256 --hidden 256 --attn 256 --epochs 3 --threads 1
  build/sat eval --results runs/peer/dev_results.json --refs ../shared/data/flickr8k/captions.csv

With --tune ENCODER --tune-to mixed7 the encoder file's blocks after the cache's cut (mixed6 and mixed7 on a mixed5
cache) run on top of the cached grids, batch norm folded into the convolutions, and are trained with the decoder at
--tune-lr (0 keeps them as imported: the deeper cut's features). This asks whether fine-tuning the blocks nsfwjs
fitted to its own classes (see sat import-tfjs) recovers better features for captions.

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


def read_sat_tensors(path):
    """sat's safetensors files (datasets/safetensors.hpp): F32, F16 and uint8 tensors with (min, scale) per tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    quant = json.loads(meta.get("quantization", "{}"))
    base, tensors = 8 + n, {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        dtype = {"F32": np.float32, "F16": np.float16, "U8": np.uint8}[e["dtype"]]
        v = np.frombuffer(raw, dtype=dtype, count=(hi - lo) // np.dtype(dtype).itemsize, offset=base + lo)
        v = v.astype(np.float32)
        if e["dtype"] == "U8":
            v = v * quant[name][1] + quant[name][0]
        tensors[name] = v.reshape(e["shape"])
    return meta, tensors


class Blocks(torch.nn.Module):
    """The encoder graph's nodes after `start` up to `end` (stride-1 convolutions with batch norm folded in and ReLU,
    3x3 'same' average pooling over valid inputs, channel concatenation), as trainable PyTorch layers."""

    def __init__(self, path, start, end):
        super().__init__()
        meta, tensors = read_sat_tensors(path)
        nodes = json.loads(meta["graph"])
        names = [n["name"] for n in nodes]
        if start not in names or end not in names or names.index(end) <= names.index(start):
            sys.exit("%s: no blocks from %s to %s (layers: %s)" % (path, start, end, ", ".join(
                n for n in names if n.startswith("mixed"))))
        self.nodes = nodes[names.index(start) + 1:names.index(end) + 1]
        self.start, self.end = start, end
        self.convs = torch.nn.ModuleDict()
        for n in self.nodes:
            if n["op"] == "conv":
                kh, kw = n["kernel_size"]
                if n["strides"] != [1, 1] or kh % 2 == 0 or kw % 2 == 0 or n["padding"] != "same":
                    sys.exit("%s: layer %s is not a stride-1 'same' convolution with odd kernel" % (path, n["name"]))
                k = tensors[n["kernel"]]  # HWIO
                f = k.shape[3]
                factor, bias = np.ones(f, np.float64), np.zeros(f, np.float64)
                if n.get("bias"):
                    bias = tensors[n["bias"]].astype(np.float64)
                if n.get("batch_norm"):
                    bn = n["batch_norm"]
                    gamma = tensors[bn + "/gamma"] if n.get("bn_scale") else np.ones(f)
                    factor = gamma / np.sqrt(tensors[bn + "/moving_variance"].astype(np.float64) + n["bn_epsilon"])
                    bias = (bias - tensors[bn + "/moving_mean"]) * factor + tensors[bn + "/beta"]
                conv = torch.nn.Conv2d(k.shape[2], f, (kh, kw), padding=(kh // 2, kw // 2))
                with torch.no_grad():
                    conv.weight.copy_(torch.from_numpy((k.transpose(3, 2, 0, 1) * factor[:, None, None, None])
                                                       .astype(np.float32)))
                    conv.bias.copy_(torch.from_numpy(bias.astype(np.float32)))
                conv.relu = bool(n.get("relu"))
                self.convs[n["name"].replace(".", "_")] = conv
            elif n["op"] == "avgpool":
                if n["kernel_size"] != [3, 3] or n["strides"] != [1, 1] or n["padding"] != "same":
                    sys.exit("%s: pooling layer %s is not 3x3 stride-1 'same'" % (path, n["name"]))
            elif n["op"] != "concat":
                sys.exit("%s: layer %s (%s) is not supported here" % (path, n["name"], n["op"]))

    def forward(self, grids, h, w):
        """grids: B x L x D (raster order) -> B x L x C."""
        B, L, D = grids.shape
        out = {self.start: grids.transpose(1, 2).reshape(B, D, h, w)}
        for n in self.nodes:
            x = out[n["inputs"][0]]
            if n["op"] == "conv":
                conv = self.convs[n["name"].replace(".", "_")]
                y = conv(x)
                out[n["name"]] = torch.relu(y) if conv.relu else y
            elif n["op"] == "avgpool":
                out[n["name"]] = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
            else:
                out[n["name"]] = torch.cat([out[i] for i in n["inputs"]], 1)
        y = out[self.end]
        return y.flatten(2).transpose(1, 2).contiguous()


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
    ap.add_argument("--tune", help="encoder file whose blocks after the cache's cut run on the cached grids")
    ap.add_argument("--tune-to", default="mixed7", help="last block to run (with --tune)")
    ap.add_argument("--tune-lr", type=float, default=1e-4, help="learning rate of the blocks (0: kept as imported)")
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
    blocks, D = None, cache.D
    if a.tune:
        blocks = Blocks(a.tune, cache.header["encoder"]["cut"], a.tune_to)
        D = blocks(torch.zeros(1, cache.L, cache.D), cache.header["grid_h"], cache.header["grid_w"]).shape[2]
        for p in blocks.parameters():
            p.requires_grad_(a.tune_lr > 0)
        print("blocks %s..%s on the cache (%d weights, learning rate %g), features %d wide" % (
            blocks.nodes[0]["name"], a.tune_to, sum(p.numel() for p in blocks.parameters()), a.tune_lr, D), flush=True)
    model = Decoder(len(words), a.embed, a.hidden, a.attn, D)
    groups = [{"params": list(model.parameters()), "base_lr": a.lr}]
    if blocks is not None and a.tune_lr > 0:
        groups.append({"params": list(blocks.parameters()), "base_lr": a.tune_lr})
    opt = torch.optim.Adam(groups, lr=a.lr)
    trained = [p for g in groups for p in g["params"]]

    def features(names, grad):
        grids = cache.grids(names)
        if blocks is None:
            return grids
        with torch.set_grad_enabled(grad):
            return blocks(grids, cache.header["grid_h"], cache.header["grid_w"])
    ckpt_path = os.path.join(a.out, "checkpoint.pt")
    first_epoch, log = 0, []
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        if blocks is not None:
            blocks.load_state_dict(ck["blocks"])
        opt.load_state_dict(ck["opt"])
        first_epoch, log = ck["epoch"], ck["log"]
        random.setstate(ck["py_rng"])
        torch.set_rng_state(ck["torch_rng"])
        print("resumed after epoch %d" % first_epoch, flush=True)

    for epoch in range(first_epoch, a.epochs):
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * a.lr_decay ** epoch
        model.train()
        order = train[:]
        random.shuffle(order)
        t0, seen, loss_sum, steps = time.time(), 0, 0.0, 0
        for s in range(0, len(order), a.batch):
            names = order[s:s + a.batch]
            grids = features(names, a.tune_lr > 0)
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
            torch.nn.utils.clip_grad_norm_(trained, 5.0)
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
        torch.save({"model": model.state_dict(), "blocks": blocks.state_dict() if blocks is not None else None,
                    "opt": opt.state_dict(), "epoch": epoch + 1, "log": log,
                    "py_rng": random.getstate(), "torch_rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, ckpt_path)

    model.eval()
    results = []
    banned = [PAD, START, UNK]
    with torch.no_grad():
        for s in range(0, len(dev), 50):
            names = dev[s:s + 50]
            for n, seq in zip(names, greedy(model, features(names, False), a.max_len, START, END, banned)):
                results.append({"image_id": n, "caption": " ".join(words[w] for w in seq)})
    path = os.path.join(a.out, "dev_results.json")
    with open(path + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(path + ".partial", path)
    summary = {"epochs": log, "mean_captions_per_second": sum(e["captions_per_second"] for e in log) / len(log),
               "threads": a.threads, "torch": torch.__version__, "results": path,
               "tune": {"encoder": a.tune, "to": a.tune_to, "lr": a.tune_lr} if a.tune else None}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
