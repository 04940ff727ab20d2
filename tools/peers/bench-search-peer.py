#!/usr/bin/python3
"""The caption search's decoder step in PyTorch 1.13 (CPU), side by side with `sat bench search`.

One inference step of the soft-attention decoder at the rows of one photo's beam (beam 10: 10 rows), as the popular
PyTorch tutorials' beam search runs it: the encoder-side attention projection computed once per photo, then per step
the additive scores (tanh), softmax, the gated context, an LSTMCell step over [embedding; context] and the deep output
layer tanh(E y + L_h h + L_z z) -> log-softmax over the vocabulary, under torch.no_grad(). The sizes are those of
sat's model (sat bench search --json gives them; the default model: L = 196 locations of D = 1024 channels,
E = H = A = 512, V = 2538 words). Both sides time 16 steps from a fresh state and report the mean step.

usage: /usr/bin/python3 tools/peers/bench-search-peer.py [--sat build/sat] [--model M] [--beam 10] [--seconds 3] [--threads 2]
Needs Debian's python3-torch and libopenblas0-pthread.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import torch


def training_peer():
    """tools/peers/bench-decoder-peer.py as a module: its Decoder holds the same layers."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-decoder-peer.py")
    spec = importlib.util.spec_from_file_location("bench_decoder_peer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Decoder(training_peer().Decoder):
    """The training peer's decoder, stepped one word at a time for a search (its dropout off: eval())."""

    def begin(self, feats):  # feats: rows x L x D (the photo's grid, once per beam row)
        mean = feats.mean(1)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean)), self.feat_proj(feats)

    def step(self, feats, UA, words, h, c):
        emb = self.embed(words)
        e = self.v(torch.tanh(UA + self.query_proj(h).unsqueeze(1))).squeeze(2)
        alpha = torch.softmax(e, 1)
        z = torch.bmm(alpha.unsqueeze(1), feats).squeeze(1)
        z = torch.sigmoid(self.gate(h)) * z
        h, c = self.lstm(torch.cat([emb, z], 1), (h, c))
        pre = torch.tanh(emb + self.out_hidden(h) + self.out_context(z))
        return torch.log_softmax(self.out(pre), 1), h, c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default="build/sat")
    ap.add_argument("--model", default="", help="sat's model (default: its default model)")
    ap.add_argument("--beam", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-sat", action="store_true", help="only the PyTorch side")
    a = ap.parse_args()
    sat = None
    if not a.no_sat:  # sat first: its model gives the sizes
        cmd = [a.sat, "bench", "search", "--batches", "1", "--beam", str(a.beam), "--seconds", str(a.seconds), "--json"]
        if a.model:
            cmd += ["--model", a.model]
        sat = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        if (sat["attention"], sat["score"], sat["order"]) != ("soft", "additive", "bahdanau"):
            sys.exit("the peer runs soft additive attention in Bahdanau order; the model has %s %s %s"
                     % (sat["attention"], sat["score"], sat["order"]))
    L, D, E, H, A, V = ((sat["L"], sat["D"], sat["E"], sat["H"], sat["A"], sat["V"]) if sat
                        else (196, 1024, 512, 512, 512, 2538))
    T, rows = 16, a.beam
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Decoder(V, E, H, A, D).eval()
    feats = torch.rand(1, L, D).expand(rows, L, D).contiguous()
    words = torch.full((rows,), 4, dtype=torch.long)
    steps = []
    with torch.no_grad():
        t_end = time.perf_counter() + a.seconds
        first = True
        while first or time.perf_counter() < t_end or len(steps) < 3:
            h, c, UA = model.begin(feats)
            t0 = time.perf_counter()
            for _ in range(T):
                logp, h, c = model.step(feats, UA, words, h, c)
            if not first:
                steps.append((time.perf_counter() - t0) / T)
            first = False
    mean = sum(steps) / len(steps)
    print("PyTorch %s, %d threads: decoder inference step, %d rows (one photo's beam), L=%d D=%d E=%d H=%d A=%d V=%d: "
          "mean %.3f ms, best %.3f ms" % (torch.__version__, torch.get_num_threads(), rows, L, D, E, H, A, V, mean * 1e3,
                                          min(steps) * 1e3), flush=True)
    if sat:
        print("sat: decoder inference step, %d rows: mean %.3f ms, best %.3f ms; its whole beam search %.1f ms per photo"
              % (sat["rows"], sat["step_ms"], sat["step_best_ms"], sat["search_ms"]))
        print("sat / PyTorch = %.2fx (mean step times, run back to back)" % (mean * 1e3 / sat["step_ms"]))
    return 0

if __name__ == "__main__":
    sys.exit(main())
