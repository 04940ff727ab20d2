#!/usr/bin/python3
"""The soft-attention decoder training step in PyTorch 1.13 (CPU), side by side with `sat bench decoder`.

Same model and sizes as sat's: init MLP from the mean feature, additive attention (tanh) with the encoder-side
projection computed once per batch, scalar gate beta, LSTM over [embedding; gated context], deep output layer
tanh(E y + L_h h + L_z z) -> vocabulary, dropout 0.5 on h and on the deep output, doubly stochastic penalty,
cross-entropy, gradient clipping, Adam. Written the way the popular PyTorch tutorials write it (LSTMCell loop,
teacher forcing). Features are frozen (from a cache): no gradient flows into them, in either implementation.

PyTorch runs in float32 and under bfloat16 autocast (torch.autocast("cpu", dtype=torch.bfloat16): its matrix products
in bf16, softmax, loss and Adam in float32, the same split as sat's --precision bf16); sat in --sat-precision (auto:
bf16 where the CPU computes it natively).

usage: /usr/bin/python3 tools/peers/bench-decoder-peer.py [--sat build/sat] [--iters 5] [--threads 2]
           [--torch-precision f32,bf16] [--sat-precision auto]
Needs Debian's python3-torch and libopenblas0-pthread.
"""
import argparse
import re
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Decoder(nn.Module):
    def __init__(self, V, E, H, A, D):
        super().__init__()
        self.embed = nn.Embedding(V, E)
        self.init_h, self.init_c = nn.Linear(D, H), nn.Linear(D, H)
        self.feat_proj, self.query_proj = nn.Linear(D, A), nn.Linear(H, A, bias=False)
        self.v = nn.Linear(A, 1, bias=False)
        self.gate = nn.Linear(H, 1)
        self.lstm = nn.LSTMCell(E + D, H)
        self.out_hidden, self.out_context = nn.Linear(H, E, bias=False), nn.Linear(D, E, bias=False)
        self.out = nn.Linear(E, V)
        self.drop = nn.Dropout(0.5)

    def forward(self, feats, inputs, targets, mask, penalty=1.0):
        B, L, D = feats.shape
        T = inputs.shape[1]
        mean = feats.mean(1)
        h, c = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))
        UA = self.feat_proj(feats)  # B x L x A, once per batch
        emb = self.embed(inputs)
        alpha_sum = torch.zeros(B, L)
        logits = []
        for t in range(T):
            e = self.v(torch.tanh(UA + self.query_proj(h).unsqueeze(1))).squeeze(2)
            alpha = torch.softmax(e, 1)
            alpha_sum = alpha_sum + alpha * mask[:, t:t + 1]
            z = torch.bmm(alpha.unsqueeze(1), feats).squeeze(1)
            z = torch.sigmoid(self.gate(h)) * z
            h, c = self.lstm(torch.cat([emb[:, t], z], 1), (h, c))
            pre = torch.tanh(emb[:, t] + self.out_hidden(self.drop(h)) + self.out_context(z))
            logits.append(self.out(self.drop(pre)))
        logits = torch.stack(logits, 1)
        ce = (F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), reduction="none") * mask.reshape(-1)).sum() / mask.sum()
        return ce + penalty * ((1 - alpha_sum) ** 2).mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default="build/sat")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-sat", action="store_true", help="only the PyTorch side")
    ap.add_argument("--torch-precision", default="f32,bf16", help="PyTorch's runs: f32, bf16 (autocast) or both")
    ap.add_argument("--sat-precision", default="auto", help="sat bench decoder --precision: f32, bf16 or auto")
    a = ap.parse_args()
    B, L, D, E, H, A, V, T = 64, 196, 512, 512, 512, 512, 3000, 16
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Decoder(V, E, H, A, D)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    feats = torch.rand(B, L, D)
    inputs = torch.randint(4, V, (B, T))
    targets = torch.randint(4, V, (B, T))
    mask = torch.ones(B, T)
    torch_cps = {}
    for precision in a.torch_precision.split(","):
        if precision not in ("f32", "bf16"):
            ap.error("--torch-precision: f32 and/or bf16, not %r" % precision)
        times = []
        for it in range(a.iters + 1):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(feats, inputs, targets, mask)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            if it > 0:
                times.append(time.perf_counter() - t0)
        mean = sum(times) / len(times)
        torch_cps[precision] = B / mean
        print("PyTorch %s, %d threads, %s: decoder train step B=%d L=%d D=%d E=H=A=%d V=%d T=%d: mean %.1f ms (best %.1f) "
              "-> %.1f captions/s" % (torch.__version__, torch.get_num_threads(),
                                      "float32" if precision == "f32" else "bf16 autocast", B, L, D, E, V, T,
                                      mean * 1e3, min(times) * 1e3, torch_cps[precision]), flush=True)
    if a.no_sat:
        return 0
    out = subprocess.run([a.sat, "bench", "decoder", "--iters", str(a.iters), "--precision", a.sat_precision],
                         check=True, capture_output=True, text=True).stdout
    print(out.strip())
    sat_cps = float(re.search(r"([0-9.]+) captions/s \(mean\)", out).group(1))
    for precision, cps in torch_cps.items():
        print("sat / PyTorch %s = %.2fx (mean step times, run back to back)"
              % ("float32" if precision == "f32" else "bf16 autocast", sat_cps / cps))


if __name__ == "__main__":
    sys.exit(main())
