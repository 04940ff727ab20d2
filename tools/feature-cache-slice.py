#!/usr/bin/env python3
"""A feature cache's records, cut or reformed into a cache another extraction's header describes.

  tools/feature-cache-slice.py FROM HEADER_FROM OUT

FROM: a cache (datasets/features.hpp: "SATFEAT1", uint64 header length, JSON header, zero padding to 4096 bytes,
then one record of grid_h x grid_w x channels values per image). HEADER_FROM: a cache of the same grid (e.g. an
extraction of one photo) with
  - no object channels and fewer channels per location (a plain block3 extraction, where FROM has the object maps
    after the grid's 1024): OUT's records are the first `channels` values of each location of FROM's;
  - object channels in the form "tags" or "both" (sat extract --objects-as), where FROM has them as "maps" with the
    same scale: OUT's records are the grid, then (both) the maps, then each class's largest value over the
    locations, repeated at every location: what the detector-side pooling computes (a max of maxima), since
    rounding to float16 keeps the order of values;
  - object channels in the form "tags", where FROM has them as "tags+trunk" with the same scale: OUT's records are
    the first channels of FROM's (the grid, then the tags; the trunk's channels after them left out), since the
    detector's heat is the same with its trunk kept as without.
OUT gets HEADER_FROM's header with FROM's image list (and skipped list): the same grids, bit for bit. Written to
OUT.partial, then renamed. Used by tools/train-flickr8k-objects.sh so every arm of the ablation reads identical
ResNet features.
"""
import json
import os
import struct
import sys

import numpy as np

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


def objects_per_form(channels, form):
    """The maps' channel count of an object block of `channels` in `form`."""
    return channels // 2 if form == "both" else channels


def object_layout(header, path):
    """(form or None, grid channels, object channels) of a cache's encoder."""
    objects = header.get("encoder", {}).get("objects")
    if not objects:
        return None, header["channels"], 0
    form = objects.get("form", "maps")
    if form not in ("maps", "tags", "both", "tags+trunk"):
        sys.exit(f"feature-cache-slice: {path}: object form {form!r} is not maps, tags, both or tags+trunk")
    return form, header["channels"] - objects["channels"], objects["channels"]


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
        form, grid_channels, objects = object_layout(target, header_src)
        if form == "tags+trunk":
            sys.exit(f"feature-cache-slice: {header_src}: the tags+trunk form is made by sat extract, not from a slice")
        source_form, source_grid, source_objects = object_layout(source, src)
        if form == "tags" and source_form == "tags+trunk":  # the grid and the tags come first: the first channels
            if source_grid != grid_channels or source_objects <= objects:
                sys.exit(f"feature-cache-slice: {src} does not hold the {header_src}'s grid with its tags first")
            if source["encoder"]["objects"]["scale"] != target["encoder"]["objects"]["scale"]:
                sys.exit(f"feature-cache-slice: {src} and {header_src} scale the object channels differently")
            form = None
        form = None if form == "maps" else form  # maps to maps: the first channels, all of them
        if form is None and target["channels"] > source["channels"]:
            sys.exit(f"feature-cache-slice: {header_src} has more channels than {src}")
        if form is not None:
            if source_form != "maps" or source_grid != grid_channels or source_objects != objects_per_form(objects, form):
                sys.exit(f"feature-cache-slice: {src} does not hold the {header_src}'s grid with object maps")
            if source["encoder"]["objects"]["scale"] != target["encoder"]["objects"]["scale"]:
                sys.exit(f"feature-cache-slice: {src} and {header_src} scale the object maps differently")
        target["images"] = source["images"]
        target.pop("skipped", None)
        if source.get("skipped"):  # absent when empty, as sat writes it
            target["skipped"] = source["skipped"]
        dtype = np.float16 if source["dtype"] == "f16" else np.float32
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
                if form is None:
                    o.write(b"".join(record[l * stride : l * stride + keep] for l in range(locations)))
                    continue
                values = np.frombuffer(record, dtype=dtype).reshape(locations, source["channels"])
                maps = values[:, grid_channels:]
                parts = [values[:, :grid_channels]] + ([maps] if form == "both" else [])
                parts.append(np.broadcast_to(maps.max(axis=0), maps.shape))
                o.write(np.ascontiguousarray(np.concatenate(parts, axis=1)).tobytes())
            o.flush()
            os.fsync(o.fileno())
    os.replace(out + ".partial", out)


if __name__ == "__main__":
    main()
