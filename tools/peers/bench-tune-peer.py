#!/usr/bin/python3
"""Times fine-tuning InceptionV3's mixed6-mixed7 on cached mixed5 grids in PyTorch 1.13 (forward and backward, the
blocks built from the same encoder file with batch norm folded, as tools/peers/train-decoder-peer.py --tune runs them) and
`sat bench tune` back to back, and prints the ratio.

  /usr/bin/python3 tools/peers/bench-tune-peer.py [--sat build/sat] [--batch 16] [--threads 1] [--iters 5]

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

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default=os.path.join(HERE, "..", "..", "build", "sat"))
    ap.add_argument("--encoder", default=os.path.join(HERE, "..", "..", "models", "inception_v3.sat"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()

    spec = importlib.util.spec_from_file_location("peer", os.path.join(HERE, "train-decoder-peer.py"))
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    torch.set_num_threads(a.threads)
    blocks = peer.Blocks(a.encoder, "mixed5", "mixed7")
    x = torch.relu(torch.randn(a.batch, 17 * 17, 768))
    times = []
    for it in range(a.iters + 1):
        t0 = time.time()
        y = blocks(x, 17, 17)
        y.backward(y.detach())
        if it > 0:
            times.append(time.time() - t0)
        blocks.zero_grad()
    torch_ips = a.batch / (sum(times) / len(times))

    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    out = subprocess.run([a.sat, "bench", "tune", "--encoder", a.encoder, "--batch", str(a.batch), "--iters",
                          str(a.iters), "--json"], env=env, capture_output=True, text=True, check=True).stdout
    sat_ips = json.loads(out.strip().splitlines()[-1])["images_per_s"]
    print(json.dumps({"batch": a.batch, "threads": a.threads, "pytorch_images_per_s": round(torch_ips, 2),
                      "sat_images_per_s": round(sat_ips, 2), "ratio": round(sat_ips / torch_ips, 2),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    sys.exit(main())
