#!/usr/bin/env python3
"""The first channels of every record of a feature cache, into a cache another extraction's header describes.

  tools/feature-cache-slice.py FROM HEADER_FROM OUT

FROM: a cache (datasets/features.hpp: "SATFEAT1", uint64 header length, JSON header, zero padding to 4096 bytes,
then one record of grid_h x grid_w x channels values per image). HEADER_FROM: a cache of the same grid with fewer
channels per location (e.g. a plain block3 extraction of one photo, where FROM has the object maps after the
grid's 1024). OUT gets HEADER_FROM's header with FROM's image list (and skipped list) and, per image, the first
`channels` values of each location of FROM's record: the same grids, bit for bit. Written to OUT.partial, then
renamed. Used by tools/train-flickr8k-objects.sh so both arms of the ablation read identical ResNet features.
"""
import json
import os
import struct
import sys

ALIGN = 4096


def read_header(f, path):
    magic = f.read(8)
    if magic != b"SATFEAT1":
        sys.exit(f"feature-cache-slice: {path}: not a sat feature cache")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > 1 << 30:
        sys.exit(f"feature-cache-slice: {path}: header length {n} is absurd")
    header = json.loads(f.read(n))
    return header, (16 + n + ALIGN - 1) // ALIGN * ALIGN


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, header_src, out = sys.argv[1:]
    with open(header_src, "rb") as f:
        target, _ = read_header(f, header_src)
    with open(src, "rb") as f:
        source, payload = read_header(f, src)
        for key in ("grid_h", "grid_w", "dtype"):
            if source[key] != target[key]:
                sys.exit(f"feature-cache-slice: {src} and {header_src} differ in {key}")
        if target["channels"] > source["channels"]:
            sys.exit(f"feature-cache-slice: {header_src} has more channels than {src}")
        target["images"] = source["images"]
        target.pop("skipped", None)
        if source.get("skipped"):  # absent when empty, as sat writes it
            target["skipped"] = source["skipped"]
        value = 2 if source["dtype"] == "f16" else 4
        locations = source["grid_h"] * source["grid_w"]
        keep, stride = target["channels"] * value, source["channels"] * value
        text = json.dumps(target, separators=(",", ":")).encode()
        block = b"SATFEAT1" + struct.pack("<Q", len(text)) + text
        block += b"\0" * ((len(block) + ALIGN - 1) // ALIGN * ALIGN - len(block))
        f.seek(payload)
        with open(out + ".partial", "wb") as o:
            o.write(block)
            for _ in source["images"]:
                record = f.read(locations * stride)
                if len(record) != locations * stride:
                    sys.exit(f"feature-cache-slice: {src}: too short (truncated file?)")
                o.write(b"".join(record[l * stride : l * stride + keep] for l in range(locations)))
            o.flush()
            os.fsync(o.fileno())
    os.replace(out + ".partial", out)


if __name__ == "__main__":
    main()
