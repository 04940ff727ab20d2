#!/usr/bin/python3
"""TF-slim's ResNet v2 trunk in PyTorch, computed from the same safetensors file sat reads: the reference sat's oneDNN
network is checked against, and the speed peer for `sat bench encoder`.

Written from the computation in ../shared/models/resnet_v2_101/README.md (conv1 7x7/2 with explicit padding 3,
pool1 3x3/2 'SAME', pre-activation bottleneck units, the last unit of blocks 1-3 striding by 2, the grid normalized
by the next unit's pre-activation), in float32. Needs Debian's python3-torch, python3-numpy, python3-opencv (and
libopenblas0-pthread, else torch uses the reference BLAS).

  # the unit test's fixture: grids of a photo at block3 and block3/unit_22 (224x224)
  /usr/bin/python3 tools/resnet-reference.py fixture WEIGHTS IMAGE tests/fixtures/dog_and_man_grids_pytorch.safetensors
  # one grid's statistics
  /usr/bin/python3 tools/resnet-reference.py grid WEIGHTS IMAGE [--cut block3] [--size 224]
  # speed: sat bench encoder, this trunk in PyTorch, and OpenCV dnn on its ONNX export, back to back, 2 threads each
  /usr/bin/python3 tools/resnet-reference.py bench WEIGHTS [--cut block3] [--size 224] [--batches 1,8] [--seconds 20]
  # the same with sat's encoder in bfloat16 (--encoder-precision bf16) and PyTorch under CPU bf16 autocast (its
  # convolutions in bf16 through its own oneDNN); OpenCV dnn has no bf16 CPU path and stays float32
  /usr/bin/python3 tools/resnet-reference.py bench WEIGHTS --size 448 --precision bf16
  # the same with sat's encoder in int8, PyTorch in float32, under bf16 autocast and with its own int8 convolutions
  # (quantized engine onednn, ranges from the benchmark's input as sat's bench takes them); OpenCV dnn in float32
  /usr/bin/python3 tools/resnet-reference.py bench WEIGHTS --size 448 --precision int8
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    kinds = {"F32": np.float32, "F16": np.float16, "U8": np.uint8}
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data, kinds[e["dtype"]], offset=8 + n + a,
                                  count=(b - a) // np.dtype(kinds[e["dtype"]]).itemsize).reshape(e["shape"])
    return out, meta


def write_safetensors(path, tensors, meta):
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(path + ".tmp", path)


def units_of(tensors):
    """{block: number of units}, from names like block3/unit_22/bottleneck_v2/conv1/weights."""
    units = {}
    for name in tensors:
        m = re.match(r"block(\d+)/unit_(\d+)/bottleneck_v2/", name)
        if m:
            b, u = int(m.group(1)), int(m.group(2))
            units[b] = max(units.get(b, 0), u)
    return units


def tf_same_pads(n, k, s):
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def make_trunk(tensors, cut):
    """The trunk up to a cut ('blockB' or 'blockB/unit_U') as a torch.nn.Module, grid normalized as the README says."""
    import torch
    import torch.nn.functional as F

    units = units_of(tensors)
    m = re.fullmatch(r"block(\d+)(?:/unit_(\d+))?", cut)
    if not m:
        sys.exit("cut must be blockB or blockB/unit_U, got %r" % cut)
    cut_b = int(m.group(1))
    cut_u = int(m.group(2)) if m.group(2) else units[cut_b]

    def t(name):
        return torch.from_numpy(tensors[name].astype(np.float32))

    def kernel(name):  # OHWI -> OIHW
        return torch.from_numpy(np.ascontiguousarray(tensors[name].astype(np.float32).transpose(0, 3, 1, 2)))

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterDict()
            self.plan = []  # (scope, stride, projection)
            for b in sorted(units):
                for u in range(1, units[b] + 1):
                    scope = "block%d/unit_%d/bottleneck_v2" % (b, u)
                    if scope + "/conv1/weights" not in tensors:
                        continue
                    last = u == units[b] and b < 4
                    self.plan.append((scope, 2 if last else 1, scope + "/shortcut/weights" in tensors))
                    if (b, u) == (cut_b, cut_u):
                        break
                else:
                    continue
                break
            nb, nu = (cut_b, cut_u + 1) if cut_u < units[cut_b] else (cut_b + 1, 1)
            self.norm = "block%d/unit_%d/bottleneck_v2/preact" % (nb, nu)
            names = ["conv1/weights", "conv1/biases", self.norm + "/scale", self.norm + "/offset"]
            for scope, _, proj in self.plan:
                names += [scope + "/preact/scale", scope + "/preact/offset"]
                for c in ["conv1", "conv2", "conv3"] + (["shortcut"] if proj else []):
                    names += [scope + "/%s/weights" % c, scope + "/%s/biases" % c]
            for n in names:
                v = kernel(n) if n.endswith("/weights") else t(n)
                if n.endswith(("/scale", "/offset")):
                    v = v.reshape(1, -1, 1, 1)
                self.params[n.replace("/", "__")] = torch.nn.Parameter(v, requires_grad=False)

        def p(self, name):
            return self.params[name.replace("/", "__")]

        def forward(self, x):
            # TF-slim pads (k - 1) / 2 on every side then convolves 'valid': the convolution's own symmetric
            # padding (an explicit Pad op would be the same, but OpenCV 4.6's ONNX reader rejects it)
            x = F.conv2d(x, self.p("conv1/weights"), self.p("conv1/biases"), stride=2, padding=3)
            top, bottom = tf_same_pads(int(x.shape[2]), 3, 2)  # constants in an export at a fixed size
            left, right = tf_same_pads(int(x.shape[3]), 3, 2)
            if top == 0 and left == 0:  # the padding at the end only: ceil mode, which ONNX readers know
                x = F.max_pool2d(x, 3, 2, ceil_mode=True)
            else:
                x = F.max_pool2d(F.pad(x, (left, right, top, bottom), value=float("-inf")), 3, 2)
            for scope, s, proj in self.plan:
                pre = F.relu(self.affine(x, scope + "/preact"))
                if proj:
                    short = F.conv2d(pre, self.p(scope + "/shortcut/weights"), self.p(scope + "/shortcut/biases"),
                                     stride=s)
                else:
                    short = F.max_pool2d(x, 1, s) if s > 1 else x  # x[::s, ::s]
                r = F.relu(F.conv2d(pre, self.p(scope + "/conv1/weights"), self.p(scope + "/conv1/biases")))
                r = F.relu(F.conv2d(r, self.p(scope + "/conv2/weights"), self.p(scope + "/conv2/biases"), stride=s,
                                    padding=1))
                r = F.conv2d(r, self.p(scope + "/conv3/weights"), self.p(scope + "/conv3/biases"))
                x = short + r
            return F.relu(self.affine(x, self.norm))

        def affine(self, x, scope):
            # x * scale + offset, written as batch norm with mean 0, variance 1 and epsilon 0 (the same numbers):
            # OpenCV 4.6's ONNX reader broadcasts a plain Mul/Add over batch 1 only
            scale, offset = self.p(scope + "/scale").flatten(), self.p(scope + "/offset").flatten()
            return F.batch_norm(x, torch.zeros_like(scale), torch.ones_like(scale), scale, offset, False, 0.0, 0.0)

    return Module().eval()


def make_int8_trunk(trunk, x):
    """The same trunk with PyTorch's own int8 convolutions (quantized engine 'onednn': u8 activations, s8 weights
    per output channel, as sat's int8), for the speed comparison only. Each unit's pre-activation is quantized
    before its convolutions, conv1 and conv2 (with their ReLU) write u8, conv3 and a projection shortcut write u8
    around a zero point of 128 and are dequantized to be added to the float32 residual stream; the root convolution,
    the pooling and the grid's normalization stay float32. Ranges: the float trunk's maxima on `x`."""
    import torch
    import torch.nn.functional as F
    import torch.nn.quantized as nnq
    import torch.nn.intrinsic.quantized as nniq

    torch.backends.quantized.engine = "onednn"
    tops = {}

    def seen(key, v):
        tops[key] = max(tops.get(key, 0.0), float(v.abs().max()))
        return v

    with torch.no_grad():  # the float trunk's forward, recording each quantized tensor's largest magnitude
        p = trunk.p
        h = F.conv2d(x, p("conv1/weights"), p("conv1/biases"), stride=2, padding=3)
        h = F.max_pool2d(h, 3, 2, ceil_mode=True)
        for scope, s, proj in trunk.plan:
            pre = seen(scope + "/pre", F.relu(trunk.affine(h, scope + "/preact")))
            short = seen(scope + "/shortcut", F.conv2d(pre, p(scope + "/shortcut/weights"), p(scope + "/shortcut/biases"),
                                                      stride=s)) if proj else (F.max_pool2d(h, 1, s) if s > 1 else h)
            r = seen(scope + "/conv1", F.relu(F.conv2d(pre, p(scope + "/conv1/weights"), p(scope + "/conv1/biases"))))
            r = seen(scope + "/conv2", F.relu(F.conv2d(r, p(scope + "/conv2/weights"), p(scope + "/conv2/biases"),
                                                       stride=s, padding=1)))
            r = seen(scope + "/conv3", F.conv2d(r, p(scope + "/conv3/weights"), p(scope + "/conv3/biases")))
            h = short + r

    def qconv(cls, name, stride, padding, out_key, signed):
        w = trunk.p(name + "/weights").detach()
        scales = (w.abs().amax(dim=(1, 2, 3)) / 127).clamp(min=1e-12).double()
        qw = torch.quantize_per_channel(w, scales, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        c = cls(w.shape[1], w.shape[0], w.shape[2], stride=stride, padding=padding)
        c.set_weight_bias(qw, trunk.p(name + "/biases").detach())
        top = max(tops[out_key], 1e-6)
        c.scale, c.zero_point = (top / 127, 128) if signed else (top / 255, 0)
        return c

    class Int8Trunk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.units = torch.nn.ModuleList()
            self.pre_scale = []
            for scope, s, proj in trunk.plan:
                u = torch.nn.Module()
                u.conv1 = qconv(nniq.ConvReLU2d, scope + "/conv1", 1, 0, scope + "/conv1", False)
                u.conv2 = qconv(nniq.ConvReLU2d, scope + "/conv2", s, 1, scope + "/conv2", False)
                u.conv3 = qconv(nnq.Conv2d, scope + "/conv3", 1, 0, scope + "/conv3", True)
                if proj:
                    u.shortcut = qconv(nnq.Conv2d, scope + "/shortcut", s, 0, scope + "/shortcut", True)
                self.units.append(u)
                self.pre_scale.append(max(tops[scope + "/pre"], 1e-6) / 255)

        def forward(self, x):
            p = trunk.p
            h = F.conv2d(x, p("conv1/weights"), p("conv1/biases"), stride=2, padding=3)
            h = F.max_pool2d(h, 3, 2, ceil_mode=True)
            for (scope, s, proj), u, ps in zip(trunk.plan, self.units, self.pre_scale):
                pre = torch.quantize_per_tensor(F.relu(trunk.affine(h, scope + "/preact")), ps, 0, torch.quint8)
                short = u.shortcut(pre).dequantize() if proj else (F.max_pool2d(h, 1, s) if s > 1 else h)
                h = short + u.conv3(u.conv2(u.conv1(pre))).dequantize()
            return F.relu(trunk.affine(h, trunk.norm))

    return Int8Trunk().eval()


def load_image(path, size):
    """As sat does: OpenCV decode, resize (area when shrinking, bilinear otherwise), RGB, x / 127.5 - 1."""
    import cv2
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        sys.exit("%s: cannot decode" % path)
    if bgr.shape[0] != size or bgr.shape[1] != size:
        shrink = bgr.shape[0] > size or bgr.shape[1] > size
        bgr = cv2.resize(bgr, (size, size), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    rgb = bgr[:, :, ::-1].astype(np.float32)
    return (rgb / 127.5 - 1.0).transpose(2, 0, 1)[None].copy()


def grid_of(tensors, image, cut, size):
    import torch
    with torch.no_grad():
        g = make_trunk(tensors, cut)(torch.from_numpy(load_image(image, size)))
    return g[0].permute(1, 2, 0).numpy()  # H x W x C


def cmd_grid(a):
    tensors, _ = read_safetensors(a.weights)
    g = grid_of(tensors, a.image, a.cut, a.size)
    pooled = g.reshape(-1, g.shape[2]).mean(0)
    print("%s at %d: grid %dx%dx%d, mean %.5f, max %.4f, pooled channels 0-3: %s" % (
        a.cut, a.size, g.shape[0], g.shape[1], g.shape[2], g.mean(), g.max(),
        ", ".join("%.5f" % v for v in pooled[:4])))


def cmd_fixture(a):
    """Per cut: the mean-pooled grid (all channels) and every 4th channel at a 7x7 lattice of locations. Activations
    only: the weights stay in ../shared/models."""
    tensors, _ = read_safetensors(a.weights)
    out = {}
    for cut in ["block3", "block3/unit_22"]:
        g = grid_of(tensors, a.image, cut, 224)
        step = g.shape[0] // 7
        out["grid.pooled." + cut] = g.reshape(-1, g.shape[2]).mean(0)
        out["grid.sampled." + cut] = g[::step, ::step, ::4]  # 7 x 7 x 256
        print("%s: grid %s, mean %.5f, max %.4f" % (cut, g.shape, g.mean(), g.max()))
    meta = {"content": "the trunk's output grids (activations) for one photo, sampled; no weights",
            "command": "tools/resnet-reference.py fixture <weights> %s %s" % (os.path.basename(a.image), a.out),
            "image": os.path.basename(a.image), "size": "224",
            "sampled": "grid[::step, ::step, ::4] with step = grid side / 7 (block3: every location, unit_22: every "
                       "other row and column)",
            "torch": __import__("torch").__version__}
    write_safetensors(a.out, out, meta)
    print("wrote", a.out)


def timed(fn, n, seconds):
    fn()  # warm-up
    runs, best, t0 = 0, 1e30, time.perf_counter()
    while time.perf_counter() - t0 < seconds or runs < 3:
        t1 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t1)
        runs += 1
    return n / ((time.perf_counter() - t0) / runs), n / best


def cmd_bench(a):
    import cv2
    import torch
    batches = [int(b) for b in a.batches.split(",")]
    tensors, _ = read_safetensors(a.weights)
    rows = {}
    bf16 = a.precision == "bf16"
    sat = subprocess.run([a.sat, "--encoder-precision", a.precision, "bench", "encoder", "--encoder", a.weights, "--cut", a.cut, "--size", str(a.size),
                          "--batches", a.batches, "--seconds", str(a.seconds), "--json"],
                         check=True, capture_output=True, text=True).stdout
    for line in sat.splitlines():
        j = json.loads(line)
        rows.setdefault("sat", {})[j["batch"]] = (j["images_per_s"], j["best_images_per_s"])
        gmac = j["gmac_per_image"]

    torch.set_num_threads(2)
    trunk = make_trunk(tensors, a.cut)
    int8 = make_int8_trunk(trunk, torch.rand(1, 3, a.size, a.size) * 2 - 1) if a.precision == "int8" else None
    for n in batches:
        x = torch.rand(n, 3, a.size, a.size) * 2 - 1

        def run():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                trunk(x)
        rows.setdefault("PyTorch %s%s" % (torch.__version__, " (bf16 autocast)" if bf16 else ""), {})[n] = \
            timed(run, n, a.seconds)
        if int8 is not None:  # PyTorch's fastest float path too: bf16 autocast
            def run_bf16():
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    trunk(x)
            rows.setdefault("PyTorch %s (bf16 autocast)" % torch.__version__, {})[n] = timed(run_bf16, n, a.seconds)

            def run_int8():
                with torch.no_grad():
                    int8(x)
            rows.setdefault("PyTorch %s int8 (quantized engine onednn)" % torch.__version__, {})[n] = \
                timed(run_int8, n, a.seconds)

    cv2.setNumThreads(2)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet_trunk.onnx")
        torch.onnx.export(trunk, torch.rand(1, 3, a.size, a.size), path, input_names=["image"], output_names=["grid"],
                          dynamic_axes={"image": {0: "batch"}, "grid": {0: "batch"}}, opset_version=11)
        net = cv2.dnn.readNetFromONNX(path)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    for n in batches:
        x = (np.random.rand(n, 3, a.size, a.size) * 2 - 1).astype(np.float32)

        def run():
            net.setInput(x)
            net.forward()
        rows.setdefault("OpenCV %s dnn" % cv2.__version__, {})[n] = timed(run, n, a.seconds)

    print("ResNet v2 trunk to %s at %dx%d, %.2f GMAC per image, 2 threads each; sat in %s" % (
        a.cut, a.size, a.size, gmac, a.precision))
    for n in batches:
        peers = {k: v[n][0] for k, v in rows.items() if k != "sat"}
        best_peer = max(peers.values())
        line = "batch %d: sat %.2f images/s (%.0f GFLOPS)" % (n, rows["sat"][n][0], rows["sat"][n][0] * gmac * 2)
        for k, v in peers.items():
            line += ", %s %.2f (%.0f GFLOPS)" % (k, v, v * gmac * 2)
        line += "; sat / faster peer %.2fx" % (rows["sat"][n][0] / best_peer)
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid")
    g.add_argument("weights")
    g.add_argument("image")
    g.add_argument("--cut", default="block3")
    g.add_argument("--size", type=int, default=224)
    f = sub.add_parser("fixture")
    f.add_argument("weights")
    f.add_argument("image")
    f.add_argument("out")
    b = sub.add_parser("bench")
    b.add_argument("weights")
    b.add_argument("--cut", default="block3")
    b.add_argument("--size", type=int, default=224)
    b.add_argument("--batches", default="1,8")
    b.add_argument("--seconds", type=float, default=20)
    b.add_argument("--precision", choices=["f32", "bf16", "int8"], default="f32")
    b.add_argument("--sat", default=os.path.join(TOP, "build", "sat"))
    a = ap.parse_args()
    {"grid": cmd_grid, "fixture": cmd_fixture, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    main()
