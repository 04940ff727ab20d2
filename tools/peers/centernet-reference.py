#!/usr/bin/python3
"""CenterNet (MobileNetV3-Large 0.75, COCO) class heatmaps in PyTorch: an independent reading of the TF.js graph model.

Two jobs. It is the reference that shows sat's oneDNN detector computes the same network: it parses the graph-model
JSON generically (nodes, attrs, the float16-stored weights widened to float32) and runs only the ancestors of
`tower_0/keypoints`, op by op, with TensorFlow's semantics (asymmetric SAME padding, legacy ResizeBilinear, the
hard-swish constants as stored, e.g. 0.16662598 rather than 1/6). And it is the PyTorch peer for a speed comparison:
the graph is turned once into a list of torch calls (F.conv2d with groups for the depthwise convolutions) on
channels-last tensors (about 3x faster than NCHW in torch 1.13 on CPU here), run under inference_mode, each
activation freed after its last use. An op outside the supported set stops it with the node's name.

Input: RGB 0..255 as decoded (no normalization), S x S with S a multiple of 32; a photo of another size is resized
bilinearly with half-pixel centres. The three upsampling sizes are twice their input's size, checked against the
stored constants scaled by S / 512 (the export size). Per photo it prints the heatmap shape, the sum of all heatmap
values and the five classes with the highest peaks. Cross-check figures (models/centernet_mobilenetv3/README.md):
  S=224: flickr8k 1001773457_577c3a7d70.jpg sum 965.054, dog 0.417 person 0.391 horse 0.386 cow 0.209 elephant 0.135
         flickr8k 1003163366_44323f5815.jpg sum 1158.074, dog 0.426 person 0.279 bench 0.174 chair 0.172 bird 0.157
  S=448: examples/dog_and_man.jpg (224x224, upsampled) README sum 2104.031, person 0.479 dog 0.366 cell phone 0.110;
         this script prints 2103.191, 0.478 0.360 0.108. The README's photo was upsampled by PIL and rounded to
         8 bits (which reproduces its figures exactly); here it stays float. The 224 figures are the exact check.

usage: /usr/bin/python3 tools/peers/centernet-reference.py --model-dir DIR PHOTO... [--size S] [--dump FILE.npy]
       /usr/bin/python3 tools/peers/centernet-reference.py --model-dir DIR --bench [--size 448]
e.g.   /usr/bin/python3 tools/peers/centernet-reference.py --model-dir /work/shared/models/centernet_mobilenetv3 \
           --size 224 /work/shared/data/flickr8k/images/1001773457_577c3a7d70.jpg
Needs Debian's python3-torch, libopenblas0-pthread, python3-pil.
"""
import argparse
import base64
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

OUTPUT = 'tower_0/keypoints'
CLASSES = [
    'person', 'bicycle', 'car', 'motorcycle', 'airplane', 'bus', 'train', 'truck', 'boat', 'traffic light',
    'fire hydrant', 'stop sign', 'parking meter', 'bench', 'bird', 'cat', 'dog', 'horse', 'sheep', 'cow', 'elephant',
    'bear', 'zebra', 'giraffe', 'backpack', 'umbrella', 'handbag', 'tie', 'suitcase', 'frisbee', 'skis', 'snowboard',
    'sports ball', 'kite', 'baseball bat', 'baseball glove', 'skateboard', 'surfboard', 'tennis racket', 'bottle',
    'wine glass', 'cup', 'fork', 'knife', 'spoon', 'bowl', 'banana', 'apple', 'sandwich', 'orange', 'broccoli',
    'carrot', 'hot dog', 'pizza', 'donut', 'cake', 'chair', 'couch', 'potted plant', 'bed', 'dining table', 'toilet',
    'tv', 'laptop', 'mouse', 'remote', 'keyboard', 'cell phone', 'microwave', 'oven', 'toaster', 'sink',
    'refrigerator', 'book', 'clock', 'vase', 'scissors', 'teddy bear', 'hair drier', 'toothbrush']
NHWC_TO_NCHW_AXIS = [0, 2, 3, 1]  # the graph speaks NHWC; tensors here are NCHW (channels-last in memory)


def fail(message):
    sys.exit(f'centernet-reference: {message}')


def load_weights(model_dir, manifest):
    """name -> float32/int32 array, in manifest order; float16-quantized tensors are widened."""
    weights = {}
    for group in manifest:
        blob = b''.join(open(os.path.join(model_dir, p), 'rb').read() for p in group['paths'])
        offset = 0
        for w in group['weights']:
            q = w.get('quantization')
            if q and set(q) - {'dtype', 'original_dtype'}:
                fail(f"{w['name']}: affine quantization ({q['dtype']}) is not supported")
            stored = np.dtype(q['dtype'] if q else w['dtype']).newbyteorder('<')
            count = int(np.prod(w['shape'], dtype=np.int64))
            a = np.frombuffer(blob, stored, count, offset).astype(w['dtype']).reshape(w['shape'])
            weights[w['name']] = torch.from_numpy(a)
            offset += count * stored.itemsize
        if offset != len(blob):
            fail(f'{group["paths"]}: {len(blob)} bytes, the manifest describes {offset}')
    return weights


def text(node, key):
    return base64.b64decode(node['attr'][key]['s']).decode()


def ints(node, key):
    return [int(i) for i in node['attr'][key]['list'].get('i', [])]


def same_pads(size, k, s):
    """TensorFlow SAME: out = ceil(in / s); the odd pixel of padding goes after (bottom/right)."""
    total = max((-(-size // s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def conv(node, consts, depthwise):
    x, w = node['input'][:2]
    kh, kw, cin, cout = consts[w].shape
    if depthwise:  # H x W x C x multiplier -> (C * multiplier) x 1 x H x W, one group per input channel
        weight, groups = consts[w].permute(2, 3, 0, 1).reshape(cin * cout, 1, kh, kw).contiguous(), cin
    else:  # HWIO -> OIHW
        weight, groups = consts[w].permute(3, 2, 0, 1).contiguous(), 1
    if text(node, 'data_format') != 'NHWC' or set(ints(node, 'dilations')) != {1}:
        fail(f"{node['name']}: only NHWC, undilated convolutions are supported")
    bias, act = None, None
    for f in (base64.b64decode(s).decode() for s in node['attr'].get('fused_ops', {}).get('list', {}).get('s', [])):
        if f == 'BiasAdd':
            bias = consts[node['input'][2]]
        elif f in ('Relu', 'Relu6'):
            act = F.relu_ if f == 'Relu' else lambda t: F.relu6(t, inplace=True)
        else:
            fail(f"{node['name']}: fused op {f} is not supported")
    stride, same = tuple(ints(node, 'strides')[1:3]), text(node, 'padding') == 'SAME'

    def run(t):
        (top, bottom), (left, right) = [same_pads(n, k, s) if same else (0, 0)
                                        for n, k, s in zip(t.shape[2:], (kh, kw), stride)]
        if (top, left) == (bottom, right):
            y = F.conv2d(t, weight, bias, stride, (top, left), 1, groups)
        else:
            y = F.conv2d(F.pad(t, (left, right, top, bottom)), weight, bias, stride, 0, 1, groups)
        return act(y) if act else y
    return run, [x]


def broadcast_const(t):
    """An NHWC-broadcastable constant as its NCHW counterpart: scalar as is, (C,) and (N,1,1,C) to channels."""
    return t.permute(0, 3, 1, 2) if t.dim() == 4 else t.view(-1, 1, 1) if t.dim() == 1 else t


def binary(f):
    def build(node, consts):
        a, b = node['input']
        if a in consts:
            k = broadcast_const(consts[a])
            return (lambda y: f(k, y)), [b]
        if b in consts:
            k = broadcast_const(consts[b])
            return (lambda x: f(x, k)), [a]
        return f, [a, b]
    return build


def mean(node, consts):
    axes = [NHWC_TO_NCHW_AXIS[int(i) % 4] for i in consts[node['input'][1]].flatten()]
    if not node['attr'].get('keep_dims', {}).get('b', False):
        fail(f"{node['name']}: Mean without keep_dims is not supported")
    return (lambda x: x.mean(axes, keepdim=True)), [node['input'][0]]


def concat(node, consts):
    axis = NHWC_TO_NCHW_AXIS[int(consts[node['input'][-1]]) % 4]
    return (lambda *xs: torch.cat(xs, axis)), node['input'][:-1]


def legacy_taps(n_in, n_out):
    """TF's ResizeBilinear without half-pixel centres: src = dst * in / out, upper neighbour clamped."""
    src = torch.arange(n_out, dtype=torch.float32) * (n_in / n_out)
    lo = src.floor()
    return lo.long(), (lo.long() + 1).clamp(max=n_in - 1), src - lo


def resize(node, consts, scale):
    if node['attr']['align_corners']['b'] or node['attr'].get('half_pixel_centers', {}).get('b', False):
        fail(f"{node['name']}: only the legacy ResizeBilinear mapping is supported")
    expected = [n * scale for n in consts[node['input'][1]].tolist()]

    def run(x):
        h, w = x.shape[2:]
        if [2 * h, 2 * w] != expected:
            fail(f"{node['name']}: upsampling {h}x{w} to twice its size, but the graph's size scales to "
                 f"{'x'.join(f'{n:g}' for n in expected)}")
        y0, y1, wy = legacy_taps(h, 2 * h)
        x0, x1, wx = legacy_taps(w, 2 * w)
        t = x.permute(0, 2, 3, 1)  # on the NHWC view, so a channels-last tensor stays channels-last
        top, bottom = t.index_select(1, y0), t.index_select(1, y1)
        rows = top + (bottom - top) * wy.view(-1, 1, 1)
        left, right = rows.index_select(2, x0), rows.index_select(2, x1)
        return (left + (right - left) * wx.view(-1, 1)).permute(0, 3, 1, 2)
    return run, [node['input'][0]]


def unary(f):
    return lambda node, consts: (f, [node['input'][0]])


BUILDERS = {
    '_FusedConv2D': lambda n, c: conv(n, c, False), 'Conv2D': lambda n, c: conv(n, c, False),
    'FusedDepthwiseConv2dNative': lambda n, c: conv(n, c, True),
    'DepthwiseConv2dNative': lambda n, c: conv(n, c, True),
    'Relu': unary(F.relu), 'Relu6': unary(F.relu6), 'Sigmoid': unary(torch.sigmoid), 'Identity': unary(lambda x: x),
    'Mul': binary(torch.mul), 'Add': binary(torch.add), 'Mean': mean, 'ConcatV2': concat,
}


class CenterNet:
    """The subgraph that computes `tower_0/keypoints`, as a list of torch calls for S x S inputs."""

    def __init__(self, model_dir, size):
        if size % 32:
            fail(f'size {size}: must be a multiple of 32')
        graph = json.load(open(os.path.join(model_dir, 'centernet.json')))
        nodes = {n['name']: n for n in graph['modelTopology']['node']}
        weights = load_weights(model_dir, graph['weightsManifest'])
        order, seen = [], set()

        def visit(name):  # depth-first post-order: every node after its inputs
            if name not in seen:
                seen.add(name)
                for i in nodes[name].get('input', []):
                    visit(i.lstrip('^').split(':')[0])
                order.append(name)
        visit(OUTPUT)
        consts, steps = {}, []
        for name in order:
            node = nodes[name]
            if node['op'] == 'Const':
                if name not in weights:
                    fail(f'{name}: a constant with no stored weights')
                consts[name] = weights[name]
            elif node['op'] == 'Placeholder':
                self.input, export = name, int(node['attr']['shape']['shape']['dim'][1]['size'])
            elif node['op'] == 'ResizeBilinear':
                steps.append((name, *resize(node, consts, size / export)))
            elif node['op'] in BUILDERS:
                steps.append((name, *BUILDERS[node['op']](node, consts)))
            else:
                fail(f"node {name}: op {node['op']} is not supported")
        last_use = {a: i for i, (_, _, args) in enumerate(steps) for a in args}
        self.steps = [(out, fn, args, [a for a in set(args) if last_use[a] == i and a != OUTPUT])
                      for i, (out, fn, args) in enumerate(steps)]

    def __call__(self, images):
        """N x S x S x 3 float32 RGB 0..255 -> N x S/4 x S/4 x 80 class heatmaps."""
        with torch.inference_mode():
            env = {self.input: images.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)}
            for out, fn, args, done in self.steps:
                env[out] = fn(*[env[a] for a in args])
                for a in done:  # free each activation after its last reader, as a runtime would
                    del env[a]
            return env[OUTPUT].permute(0, 2, 3, 1).contiguous()


def load_photo(path, size):
    from PIL import Image
    rgb = torch.from_numpy(np.asarray(Image.open(path).convert('RGB'), dtype=np.float32))
    if rgb.shape[:2] != (size, size):
        rgb = F.interpolate(rgb.permute(2, 0, 1)[None], size=(size, size), mode='bilinear', align_corners=False,
                            antialias=False)[0].permute(1, 2, 0)
    return rgb


def bench(net, size):
    torch.set_num_threads(2)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, S={size}')
    for batch, runs in ((1, 15), (8, 5)):
        images = torch.rand(batch, size, size, 3, generator=torch.Generator().manual_seed(0)) * 255
        net(images)  # warm-up: allocator, kernel selection
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            net(images)
            times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        print(f'batch {batch}: {batch / median:.2f} images/s (median of {runs}, {1000 * median:.1f} ms per batch)')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('photos', nargs='*', metavar='PHOTO')
    ap.add_argument('--model-dir', required=True)
    ap.add_argument('--size', type=int, default=448)
    ap.add_argument('--dump', metavar='FILE.npy', help='save the N x S/4 x S/4 x 80 heatmaps (float32)')
    ap.add_argument('--bench', action='store_true', help='time batch 1 and 8 at --size on 2 threads')
    args = ap.parse_args()
    if not args.photos and not args.bench:
        ap.error('name a PHOTO or --bench')
    net = CenterNet(args.model_dir, args.size)
    maps = []
    for path in args.photos:
        heat = net(load_photo(path, args.size)[None])[0]
        maps.append(heat.numpy())
        peaks = heat.amax((0, 1))
        top = ', '.join(f'{CLASSES[i]} {peaks[i]:.3f}' for i in peaks.argsort(descending=True)[:5].tolist())
        print(f"{os.path.basename(path)}: heatmap {'x'.join(map(str, heat.shape))}, "
              f'sum {heat.double().sum():.3f}, top {top}')
    if args.dump and maps:
        np.save(args.dump, np.stack(maps))
    if args.bench:
        bench(net, args.size)


if __name__ == '__main__':
    main()
