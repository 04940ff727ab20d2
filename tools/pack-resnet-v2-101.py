#!/usr/bin/python3
"""Packs TF-slim's ResNet-101 v2 trunk, as the public WebNN test-data repository publishes it (one float32 .npy per
tensor, models/resnet101v2_nhwc/weights/), into the resnet_v2_101.safetensors that models/flickr8k.sat names by
sha256: through block3 plus block4/unit_1's pre-activation batch norm, TF-slim scope names, conv kernels float16,
vectors float32. The bytes must come out exactly as the shared copy's (../shared/models/resnet_v2_101/README.md), so
the header order, the padding and the metadata strings below are fixed: change none of them.

  pack-resnet-v2-101.py names              the .npy file names the packing reads, one a line
  pack-resnet-v2-101.py pack NPY_DIR OUT [SHOWN_AS]
                                           packs them (OUT written through a temporary file and a rename); errors
                                           name a file as SHOWN_AS/NAME (the URL it was downloaded from)
  pack-resnet-v2-101.py npy FILE OUT_DIR   writes a packed file's tensors back as float32 .npy files (the tests')

Standard library only: the float16 rounding is struct's 'e' (round to nearest, ties to even, as numpy's astype),
applied to the float32 value widened exactly to a double, so it is rounded once."""
import array
import ast
import json
import os
import struct
import sys

NPY_PREFIX = "resnet_v2_101_"
# (block, units, projection shortcut in unit_1): TF-slim resnet_v2_101 through block3.
BLOCKS = [("block1", 3), ("block2", 4), ("block3", 23)]
METADATA = {
    "architecture": "resnet_v2_101 (TF-slim, pre-activation bottlenecks), through block3 + block4/unit_1/bottleneck_v2/preact",
    "source": "github webmachinelearning/test-data (fork BruceDai/test-data commit 38659dfbc5f69daddb71b42d10eb4970176ddc54), models/resnet101v2_nhwc/weights/*.npy",
    "original": "TensorFlow Lite hosted model resnet_v2_101 (tflite_11_05_08/resnet_v2_101.tgz), Apache License 2.0",
    "imagenet_top1": "76.8% (whole network, 299x299, per the TensorFlow Lite hosted models table)",
    "input": "RGB, NHWC, x / 127.5 - 1 (Inception preprocessing), trained at 299x299",
    "kernel_layout": "OHWI (out, kernel h, kernel w, in); batch norm after conv1/conv2 of each unit already folded into weights and biases",
    "dtypes": "conv kernels float16 (converted from float32), vectors float32 (as published)",
}
# The TFLite converter's names for what TF-slim calls biases, and the folded batch norm's y = x * scale + offset.
NPY_KIND = {"weights": "weights", "biases": "Conv2D_bias", "scale": "FusedBatchNorm_mul_0_param",
            "offset": "FusedBatchNorm_add_param"}


class Refused(Exception):
    pass


def tensors():
    """Every tensor of the packed file: TF-slim name -> shape (kernels OHWI)."""
    out = {"conv1/weights": [64, 7, 7, 3], "conv1/biases": [64]}
    cin = 64
    for b, (block, units) in enumerate(BLOCKS):
        depth = 256 << b
        bottleneck = depth // 4
        for u in range(1, units + 1):
            s = f"{block}/unit_{u}/bottleneck_v2/"
            out[s + "preact/scale"] = out[s + "preact/offset"] = [cin]
            if u == 1:
                out[s + "shortcut/weights"], out[s + "shortcut/biases"] = [depth, 1, 1, cin], [depth]
            out[s + "conv1/weights"], out[s + "conv1/biases"] = [bottleneck, 1, 1, cin], [bottleneck]
            out[s + "conv2/weights"], out[s + "conv2/biases"] = [bottleneck, 3, 3, bottleneck], [bottleneck]
            out[s + "conv3/weights"], out[s + "conv3/biases"] = [depth, 1, 1, bottleneck], [depth]
            cin = depth
    out["block4/unit_1/bottleneck_v2/preact/scale"] = out["block4/unit_1/bottleneck_v2/preact/offset"] = [cin]
    return out


def npy_name(name):
    """conv1/biases -> resnet_v2_101_conv1_Conv2D_bias.npy; block1/unit_1/bottleneck_v2/preact/scale ->
    resnet_v2_101_block1_unit_1_bottleneck_v2_preact_FusedBatchNorm_mul_0_param.npy"""
    scope, kind = name.rsplit("/", 1)
    return NPY_PREFIX + scope.replace("/", "_") + "_" + NPY_KIND[kind] + ".npy"


def read_npy(file, shape, path):
    """The float32 values of a little-endian, C-order .npy file of that shape; errors name it `path`."""
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise Refused(f"{path}: cannot read ({e.strerror})")
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        raise Refused(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        hlen, start = struct.unpack_from("<H", data, 8)[0], 10
    elif major in (2, 3) and len(data) >= 12:
        hlen, start = struct.unpack_from("<I", data, 8)[0], 12
    else:
        raise Refused(f"{path}: .npy version {major} is not supported")
    try:
        header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
        descr, fortran, got = header["descr"], header["fortran_order"], list(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise Refused(f"{path}: malformed .npy header")
    if descr != "<f4" or fortran:
        raise Refused(f"{path}: holds {descr}{' in Fortran order' if fortran else ''}, expected little-endian float32 in C order")
    if got != shape:
        raise Refused(f"{path}: shape {got}, expected {shape}")
    body = data[start + hlen:]
    count = 1
    for d in shape:
        count *= d
    if len(body) != 4 * count:
        raise Refused(f"{path}: {len(body)} bytes of data, expected {4 * count} (truncated?)")
    values = array.array("f")
    values.frombytes(body)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def to_float16(values, where):
    try:
        return struct.pack(f"<{len(values)}e", *values)
    except (OverflowError, struct.error):
        raise Refused(f"{where}: a value beyond float16's range (65504)")


def write_atomic(path, chunks):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def pack(npy_dir, out, shown_as=None):
    shapes = tensors()
    header, blobs, offset = {}, [], 0
    for name in sorted(shapes):  # the header lists the tensors in name order, the data follows in the same order
        shown = f"{(shown_as or npy_dir).rstrip('/')}/{npy_name(name)}"
        values = read_npy(os.path.join(npy_dir, npy_name(name)), shapes[name], shown)
        if len(shapes[name]) == 4:
            blob, dtype = to_float16(values, shown), "F16"
        else:
            blob, dtype = struct.pack(f"<{len(values)}f", *values), "F32"
        header[name] = {"dtype": dtype, "shape": shapes[name], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = METADATA
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    write_atomic(out, [struct.pack("<Q", len(h)), h] + blobs)


def write_npy(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{d}, " for d in shape).rstrip(" ")
    header += " " * (63 - (10 + len(header)) % 64) + "\n"  # numpy's layout: data aligned to 64 bytes
    write_atomic(path, [b"\x93NUMPY\x01\x00", struct.pack("<H", len(header)), header.encode("latin1"),
                        struct.pack(f"<{len(values)}f", *values)])


def unpack(packed, out_dir):
    with open(packed, "rb") as f:
        data = f.read()
    hlen = struct.unpack_from("<Q", data)[0]
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    os.makedirs(out_dir, exist_ok=True)
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        fmt = {"F16": "e", "F32": "f"}[t["dtype"]]
        values = struct.unpack(f"<{(end - begin) // struct.calcsize(fmt)}{fmt}", data[base + begin:base + end])
        write_npy(os.path.join(out_dir, npy_name(name)), t["shape"], values)


def main(argv):
    try:
        if argv[1:] == ["names"]:
            print("\n".join(npy_name(n) for n in sorted(tensors())))
        elif len(argv) in (4, 5) and argv[1] == "pack":
            pack(*argv[2:])
        elif len(argv) == 4 and argv[1] == "npy":
            unpack(argv[2], argv[3])
        else:
            print("usage: pack-resnet-v2-101.py names | pack NPY_DIR OUT [SHOWN_AS] | npy PACKED OUT_DIR", file=sys.stderr)
            return 2
    except Refused as e:
        print(f"pack-resnet-v2-101: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
