#!/usr/bin/python3
"""InceptionV3 trunk to mixed5 at 299x299, batch 1 and 8: sat (oneDNN) against PyTorch and OpenCV dnn, back to back.

The peers run torchvision's inception_v3 up to Mixed_6c (the same architecture as Keras up to mixed5, 3.60 GMAC),
2 threads each, with random weights (speed does not depend on them). OpenCV 4.6 reads an ONNX export of that trunk;
it rejects exports whose biases are all zero (the exporter merges identical tensors), so batch-norm statistics are
randomized first. Needs Debian's python3-torch, python3-torchvision, python3-opencv, libopenblas0-pthread.

usage: /usr/bin/python3 tools/peers/bench-encoder-peers.py [--sat build/sat] [--seconds 20] [--rounds 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def timed(fn, n, seconds):
    fn()  # warm-up
    runs, best, t0 = 0, 1e30, time.perf_counter()
    while time.perf_counter() - t0 < seconds or runs < 3:
        t1 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t1)
        runs += 1
    mean = (time.perf_counter() - t0) / runs
    return n / mean, n / best


def torch_trunk():
    import torch
    import torchvision
    m = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False).eval()
    trunk = torch.nn.Sequential(m.Conv2d_1a_3x3, m.Conv2d_2a_3x3, m.Conv2d_2b_3x3, m.maxpool1, m.Conv2d_3b_1x1,
                                m.Conv2d_4a_3x3, m.maxpool2, m.Mixed_5b, m.Mixed_5c, m.Mixed_5d, m.Mixed_6a,
                                m.Mixed_6b, m.Mixed_6c).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in trunk.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
    return trunk


def bench_torch(batches, seconds):
    import torch
    torch.set_num_threads(2)
    trunk = torch_trunk()
    out = {}
    for n in batches:
        x = torch.rand(n, 3, 299, 299)

        def run():
            with torch.no_grad():
                trunk(x)
        out[n] = timed(run, n, seconds)
    return out, "PyTorch %s, %d threads" % (torch.__version__, torch.get_num_threads())


def bench_opencv(batches, seconds):
    import cv2
    import torch
    cv2.setNumThreads(2)
    trunk = torch_trunk()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inception_mixed6c.onnx")
        torch.onnx.export(trunk, torch.rand(1, 3, 299, 299), path, input_names=["image"], output_names=["grid"],
                          dynamic_axes={"image": {0: "batch"}, "grid": {0: "batch"}}, opset_version=11)
        net = cv2.dnn.readNetFromONNX(path)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    out = {}
    for n in batches:
        x = np.random.rand(n, 3, 299, 299).astype(np.float32)

        def run():
            net.setInput(x)
            net.forward()
        out[n] = timed(run, n, seconds)
    return out, "OpenCV %s dnn" % cv2.__version__


def bench_sat(sat, batches, seconds):
    cmd = [sat, "bench", "encoder", "--json", "--seconds", str(seconds), "--batches", ",".join(map(str, batches))]
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    out = {}
    for line in lines:
        j = json.loads(line)
        out[j["batch"]] = (j["images_per_s"], j["best_images_per_s"])
    return out, "sat (oneDNN, %s)" % os.path.basename(sat)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default="build/sat")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="repeat sat/PyTorch/OpenCV this many times, keep the best")
    args = ap.parse_args()
    batches = [1, 8]
    results = {}
    for r in range(args.rounds):
        for name, fn in (("sat", lambda: bench_sat(args.sat, batches, args.seconds)),
                         ("pytorch", lambda: bench_torch(batches, args.seconds)),
                         ("opencv", lambda: bench_opencv(batches, args.seconds))):
            got, label = fn()
            prev = results.get(name, ({}, label))[0]
            results[name] = ({n: max(got[n], prev.get(n, (0, 0))) for n in batches}, label)
            for n in batches:
                print("round %d  %-8s batch %d: %6.2f images/s (best batch %.2f)" % (r + 1, name, n, *got[n]),
                      flush=True)
    print("\nInceptionV3 -> mixed5 (= torchvision Mixed_6c), 299x299, 2 threads, images/s (mean over %g s):"
          % args.seconds)
    print("%-48s %10s %10s" % ("", "batch 1", "batch 8"))
    for name in ("sat", "pytorch", "opencv"):
        vals, label = results[name]
        print("%-48s %10.2f %10.2f" % (label, vals[1][0], vals[8][0]))
    for n in batches:
        faster = max(results["pytorch"][0][n][0], results["opencv"][0][n][0])
        print("batch %d: sat / PyTorch = %.2fx, sat / OpenCV = %.2fx, sat / faster peer = %.2fx" % (
            n, results["sat"][0][n][0] / results["pytorch"][0][n][0], results["sat"][0][n][0] / results["opencv"][0][n][0],
            results["sat"][0][n][0] / faster))


if __name__ == "__main__":
    sys.exit(main())
