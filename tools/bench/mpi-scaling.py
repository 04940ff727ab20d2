#!/usr/bin/env python3
"""Data-parallel scaling of sat's decoder training step: measured here, projected to a cluster.

Measures `sat bench decoder` at one shape as 1 rank x 2 threads (this machine as one node) and as 2 ranks x 1 thread
under mpirun (the same global batch split in two, gradients summed over loopback TCP), then projects the epoch time of
COCO (616 000 captions) on 1, 4, 16 and 64 such nodes at 10 and 100 Gbit/s with the ring-allreduce model: each step
sums G bytes of gradients, which takes 2 (N - 1) / N x G / bandwidth (latency and contention left out). sat sums after
the backward pass, so its step is compute + allreduce; an implementation that overlapped the sum with the backward
pass would hide it once a node's share of the batch takes longer to compute than the sum takes to move, which gives
the per-node batch printed last.

  tools/bench/mpi-scaling.py                      # the benchmark shape (bench decoder's defaults: B 64, 14x14x512, 512, V 3000)
  tools/bench/mpi-scaling.py --quick              # a small shape, seconds: checks that the script works
  tools/bench/mpi-scaling.py -- --batch 80 --grid 14 --features 1024 --per-image 5   # any bench decoder flags after --
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

COCO_CAPTIONS = 616_000
NODES = [1, 4, 16, 64]
GBITS = [10, 100]
QUICK = ["--batch", "16", "--grid", "4", "--features", "64", "--embed", "64", "--hidden", "64", "--attn", "64",
         "--vocab", "500", "--steps", "8"]


def bench(cmd, env_threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(env_threads))
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"mpi-scaling: no JSON line from {' '.join(cmd)}:\n{out}")
    return json.loads(lines[-1])


def duration(seconds):
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sat", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "sat"))
    parser.add_argument("--iters", type=int, default=5, help="timed steps per measurement (after one warm-up)")
    parser.add_argument("--quick", action="store_true", help="a small shape: seconds, to check the script")
    parser.add_argument("--node-batch", type=int, default=0,
                        help="captions per node and step in the projection (default: the measured batch)")
    parser.add_argument("bench_flags", nargs="*", help="flags for sat bench decoder (after --)")
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("mpi-scaling: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)")
    flags = (QUICK if args.quick else []) + args.bench_flags + ["--iters", str(args.iters), "--json"]
    sat = os.path.abspath(args.sat)
    one = bench([sat, "bench", "decoder", *flags], 2)
    # as root Open MPI needs --allow-run-as-root; loopback TCP only; each rank bound to its own core
    two = bench([mpirun, "--allow-run-as-root", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                 "--bind-to", "core", "-np", "2", "-x", "OMP_NUM_THREADS", sat, "bench", "decoder", *flags], 1)

    batch = one["batch"]
    step_one = one["compute_ms"] / 1e3
    step_two = (two["compute_ms"] + two["wait_ms"] + two["allreduce_ms"]) / 1e3
    print(f"measured here, global batch {batch} captions, {args.iters} steps each:")
    print(f"  1 rank  x 2 threads: compute {one['compute_ms']:.1f} ms per step -> {batch / step_one:.1f} captions/s")
    print(f"  2 ranks x 1 thread:  compute {two['compute_ms']:.1f} ms + wait {two['wait_ms']:.1f} ms + allreduce "
          f"{two['allreduce_ms']:.1f} ms of {two['allreduce_bytes'] / 1e6:.2f} MB "
          f"({two['allreduce_bytes'] / 1e9 / max(two['allreduce_ms'] / 1e3, 1e-9):.2f} GB/s over loopback) "
          f"-> {batch / step_two:.1f} captions/s ({step_one / step_two:.2f}x the single rank)")

    per_caption = step_one / batch  # one node's compute per caption: this machine, both cores
    grad_bytes = one["allreduce_bytes"]
    node_batch = args.node_batch or batch
    print(f"\nprojection for COCO ({COCO_CAPTIONS} captions per epoch): nodes like this one "
          f"({per_caption * 1e3:.2f} ms of compute per caption), {node_batch} captions per node and step, "
          f"{grad_bytes / 1e6:.2f} MB of gradients summed per step by ring allreduce, 2(N-1)/N x bytes / bandwidth")
    print(f"| nodes | link | global batch | steps/epoch | compute/step | allreduce/step | epoch (compute + allreduce) "
          f"| epoch (allreduce hidden) | batch/node to hide it |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for nodes in NODES:
        for gbits in GBITS:
            comm = 2 * (nodes - 1) / nodes * grad_bytes / (gbits * 1e9 / 8)
            compute = node_batch * per_caption
            steps = COCO_CAPTIONS / (nodes * node_batch)
            hide = comm / per_caption  # captions per node whose compute takes as long as the sum
            print(f"| {nodes} | {gbits} Gbit/s | {nodes * node_batch} | {steps:.0f} | {compute * 1e3:.0f} ms "
                  f"| {comm * 1e3:.1f} ms | {duration(steps * (compute + comm))} | "
                  f"{duration(steps * max(compute, comm))} | {hide:.1f} |")


if __name__ == "__main__":
    main()
