#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets: tests/fuzz/corpus/<target>/<seed>, small valid inputs (and a
few near misses) of every format a target reads. The files are committed; rerun this to regenerate them:

    python3 tests/fuzz/make-seeds.py [--sat build/sat]

Needs python3-opencv and numpy (Debian packages) for the image seeds, and a built `sat` for the model seed (a tiny
untrained model: `sat synth`, then `sat train --epochs 0` with small sizes). Crashing inputs the fuzzers found are
kept beside the seeds, under corpus/<target>/crash-* (see README.md there): they are replayed like every seed.
"""
import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
SHARD_MARKER = b"\n@@shard@@\n"  # tests/fuzz/fuzz_tfjs_*.cpp split their input here


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def image_seeds():
    import cv2
    rng = np.random.default_rng(1)
    img = (rng.random((12, 16, 3)) * 255).astype(np.uint8)
    for ext in ["png", "jpg", "bmp", "ppm", "tiff", "webp"]:
        ok, buf = cv2.imencode("." + ext, img)
        if ok:
            put("image", "tiny." + ext, buf.tobytes())
    ok, gray = cv2.imencode(".png", img[:, :, 0])
    put("image", "gray.png", gray.tobytes())
    ok, jpg = cv2.imencode(".jpg", img)
    put("image", "truncated.jpg", jpg.tobytes()[: len(jpg) // 2])  # refused: no end-of-image marker
    ok, progressive = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    put("image", "progressive.jpg", progressive.tobytes())
    # the damage checks (vision/damage.hpp): restart markers to count, half a scan with an end marker, a progressive
    # file missing its last scan, a PNG whose IDAT fails its CRC
    ok, restart = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_RST_INTERVAL, 1])
    put("image", "restart.jpg", restart.tobytes())
    ok, prog_restart = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_RST_INTERVAL, 1])
    put("image", "progressive_restart.jpg", prog_restart.tobytes())
    j = jpg.tobytes()
    scan = j.find(b"\xff\xda")
    put("image", "half_eoi.jpg", j[: scan + (len(j) - scan) // 2] + b"\xff\xd9")
    p = progressive.tobytes()
    put("image", "progressive_cut.jpg", p[: p.rfind(b"\xff\xda")] + b"\xff\xd9")
    ok, png = cv2.imencode(".png", img)
    bad_crc = bytearray(png.tobytes())
    bad_crc[bad_crc.find(b"IDAT") + 10] ^= 1
    put("image", "bad_crc.png", bytes(bad_crc))
    put("image", "exif6.jpg", with_exif_orientation(jpg.tobytes(), 6))
    ok, png = cv2.imencode(".png", img)
    put("image", "exif6.png", with_exif_orientation(png.tobytes(), 6))
    stb_image_seeds()


def exif_tiff(orientation):
    """A little-endian TIFF structure holding only the EXIF orientation tag (0x0112, a SHORT)."""
    return b"II*\0" + struct.pack("<IHHHIHHI", 8, 1, 0x0112, 3, 1, orientation, 0, 0)


def with_exif_orientation(data, orientation):
    """A JPEG with an APP1 Exif segment after its SOI, or a PNG with an eXIf chunk after its IHDR."""
    tiff = exif_tiff(orientation)
    if data[:2] == b"\xff\xd8":
        payload = b"Exif\0\0" + tiff
        return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]
    body = b"eXIf" + tiff
    return data[:33] + struct.pack(">I", len(tiff)) + body + struct.pack(">I", zlib.crc32(body)) + data[33:]


def stb_image_seeds():
    """The files only stb reads (GIF, binary PNM), and headers that declare more pixels than sat decodes, written
    without an encoder."""
    # a 4x3 GIF of a two-colour global palette: LZW with a clear code before every pixel, so that the code table
    # never grows and every code stays 3 bits (minimum code size 2: colours 0-3, clear 4, end 5), packed LSB first
    codes = [c for p in [0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0] for c in (4, p)] + [5]
    bits = sum(c << (3 * i) for i, c in enumerate(codes))
    lzw = bits.to_bytes((3 * len(codes) + 7) // 8, "little")
    gif = (b"GIF89a" + struct.pack("<HH", 4, 3) + b"\x80\x00\x00" + b"\x0a\xc8\x1e\xff\xff\xff" +
           b"\x2c" + struct.pack("<HHHH", 0, 0, 4, 3) + b"\x00" + b"\x02" + bytes([len(lzw)]) + lzw + b"\x00\x3b")
    put("image", "tiny.gif", gif)
    put("image", "tiny.pgm", b"P5\n# a comment\n4 3\n255\n" + bytes(range(0, 240, 20)))
    put("image", "tiny15.pgm", b"P5 4 3 15\n" + bytes(range(12)))
    put("image", "bomb.gif", b"GIF89a" + struct.pack("<HH", 65535, 65535) + b"\x00\x00\x00" + b"\x3b")
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)
    put("image", "bomb.png", b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr)))


def safetensors_bytes(tensors, metadata):
    """tensors: name -> (dtype, shape, raw bytes)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def safetensors_seeds():
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    f16 = np.array([0.5, -2, 65504, 6e-8], dtype=np.float16)
    u8 = np.array([0, 128, 255], dtype=np.uint8)
    put("safetensors", "mixed.safetensors", safetensors_bytes(
        {"a": ("F32", [2, 3], f32.tobytes()), "b": ("F16", [4], f16.tobytes()), "q": ("U8", [3], u8.tobytes())},
        {"quantization": json.dumps({"q": [-1.0, 0.01]}), "config": "{}"}))
    put("safetensors", "empty.safetensors", safetensors_bytes({}, {}))
    put("safetensors", "scalar.safetensors", safetensors_bytes({"s": ("F32", [], struct.pack("<f", 1.5))}, None))


def feature_cache_bytes(header, records):
    h = json.dumps(header).encode()
    head = b"SATFEAT1" + struct.pack("<Q", len(h)) + h
    head += b"\0" * ((4096 - len(head) % 4096) % 4096)
    return head + records


def feature_cache_seeds():
    hdr = {"encoder": {"kind": "cnn"}, "encoder_id": "0123456789abcdef", "grid_h": 2, "grid_w": 2, "channels": 3,
           "dtype": "f16", "images": ["a.jpg", "b.jpg"]}
    recs = np.linspace(-1, 1, 2 * 4 * 3).astype(np.float16).tobytes()
    put("feature_cache", "f16.feat", feature_cache_bytes(hdr, recs))
    hdr32 = dict(hdr, dtype="f32", skipped=[["c.jpg", "cannot decode image"]])
    put("feature_cache", "f32_skipped.feat",
        feature_cache_bytes(hdr32, np.linspace(-1, 1, 2 * 4 * 3).astype(np.float32).tobytes()))


def tfjs_model():
    """A small Keras functional model as tfjs-converter writes it (the shape of tests/test_tfjs.cpp's model)."""
    rng = np.random.default_rng(2)

    def layer(name, cls, config, inbound):
        return {"name": name, "class_name": cls, "config": dict(config, name=name),
                "inbound_nodes": [[[i, 0, 0, {}] for i in inbound]] if inbound else []}

    layers = [layer("input_1", "InputLayer", {"batch_input_shape": [None, 8, 8, 3], "dtype": "float32"}, [])]
    manifest, shard = [], b""

    def weight(name, shape, dtype="float32"):
        nonlocal shard
        v = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        entry = {"name": name, "shape": list(shape), "dtype": "float32"}
        if dtype == "uint8":
            lo, hi = float(v.min()), float(v.max())
            scale = (hi - lo) / 255
            q = np.round((v - lo) / scale).astype(np.uint8)
            entry["quantization"] = {"dtype": "uint8", "min": lo, "scale": scale}
            shard += q.tobytes()
        else:
            shard += v.tobytes()
        manifest.append(entry)

    channels = {"input_1": 3, "act_a": 4}
    for conv, inp, f, k, s in [("conv_a", "input_1", 4, 3, 2), ("conv_b", "act_a", 4, 1, 1), ("conv_c", "act_a", 6, 3, 1)]:
        bn, act = "bn" + conv[4:], "act" + conv[4:]
        layers.append(layer(conv, "Conv2D", {"filters": f, "kernel_size": [k, k], "strides": [s, s], "padding": "same",
                                             "use_bias": False, "activation": "linear", "dilation_rate": [1, 1]}, [inp]))
        layers.append(layer(bn, "BatchNormalization", {"axis": 3, "epsilon": 1e-3, "center": True, "scale": False}, [conv]))
        layers.append(layer(act, "Activation", {"activation": "relu"}, [bn]))
        weight(conv + "/kernel", (k, k, channels[inp], f), "uint8" if conv == "conv_b" else "float32")
        weight(bn + "/beta", (f,))
        weight(bn + "/moving_mean", (f,))
        weight(bn + "/moving_variance", (f,))
    layers.append(layer("pool_avg", "AveragePooling2D", {"pool_size": [3, 3], "strides": [1, 1], "padding": "same"}, ["act_a"]))
    layers.append(layer("mixed0", "Concatenate", {"axis": -1}, ["act_b", "act_c", "pool_avg"]))
    layers.append(layer("pool_max", "MaxPooling2D", {"pool_size": [3, 3], "strides": [2, 2], "padding": "valid"}, ["mixed0"]))
    layers.append(layer("flatten", "Flatten", {}, ["pool_max"]))
    model = {"modelTopology": {"class_name": "Model", "config": {"layers": layers}},
             "weightsManifest": [{"paths": ["group1-shard1of1.bin"], "weights": manifest}]}
    return model, shard


def tfjs_seeds():
    model, shard = tfjs_model()
    text = json.dumps(model)
    put("tfjs_json", "model_and_shard", text.encode() + SHARD_MARKER + shard)
    put("tfjs_json", "no_shard", text)
    # the UMD-wrapped minified form: keys unquoted, true as !0, the shard as a base64 string
    js = text.replace('"class_name"', "class_name").replace('"config"', "config").replace("true", "!0")
    js = js.replace("group1-shard1of1.bin", "group1-shard1of1.min.js")
    umd = "!function(a){module.exports=a()}(function(){return {1:[function(a,n,i){n.exports="
    shard_js = umd + '"' + base64.b64encode(shard).decode() + '"},{}]}});'
    put("tfjs_minjs", "model_and_shard", (umd + js + "},{}]}});").encode() + SHARD_MARKER + shard_js.encode())


def caption_seeds():
    coco = {"images": [{"id": 1, "file_name": "a.jpg", "width": 4, "height": 3},
                       {"id": 7, "file_name": "b.jpg",
                        "objects": [{"shape": "circle", "colour": "red", "size": "big", "bbox": [1, 2, 3, 4]}]}],
            "annotations": [{"id": 1, "image_id": 1, "caption": "A dog runs on the grass."},
                            {"id": 2, "image_id": 7, "caption": "a red circle", "grounding": [{"token": 1, "object": 0}, {"token": 2, "object": 0}]},
                            {"id": 3, "image_id": 1, "caption": "Two dogs, one \"brown\"!"}]}
    put("coco_json", "coco.json", json.dumps(coco))
    put("coco_json", "results.json", json.dumps([{"image_id": 1, "caption": "a dog"}]))
    karpathy = {"images": [
        {"filename": "a.jpg", "filepath": "val2014", "split": "train", "imgid": 0,
         "sentences": [{"raw": "A dog runs.", "tokens": ["a", "dog", "runs"]}]},
        {"filename": "b.jpg", "split": "restval", "sentences": [{"raw": "A man.", "tokens": ["a", "man"]}]},
        {"filename": "c.jpg", "split": "test", "sentences": [{"raw": "", "tokens": []}]}], "dataset": "flickr8k"}
    put("karpathy", "dataset_flickr8k.json", json.dumps(karpathy))
    put("coco_json", "karpathy.json", json.dumps(karpathy))
    csv = 'image,caption\na.jpg,A dog runs on the grass .\na.jpg,"A dog, brown, runs"\nb.jpg,"He said ""hi"""\n'
    put("flickr_csv", "captions.csv", csv)
    put("flickr_csv", "crlf.csv", csv.replace("\n", "\r\n"))
    put("coco_json", "captions.csv", csv)
    token = "a.jpg#0\tA dog runs on the grass .\na.jpg#1\tA brown dog .\nb.jpg#0\tA man stands .\n"
    put("flickr_token", "Flickr8k.token.txt", token)
    put("coco_json", "Flickr8k.token.txt", token)
    put("split_list", "split.txt", "a.jpg\nb.jpg\n")
    put("split_list", "crlf.txt", "a.jpg\r\n\r\nb.jpg\r\n")
    put("split_list", "unknown.txt", "a.jpg\nz.jpg\n")
    for i, text in enumerate(["A man's dog, running (fast) -- isn't it?", "Two dogs play in the snow.",
                              "\"Quoted\" words... and $5.00 & 10% etc.", "  tabs\tand\nnewlines  ",
                              "caf\u00e9 na\u00efve \u2014 unicode", ""]):
        put("ptb_tokenizer", "text%d" % i, text)
    # a caption memory's captions as model files store them (json.dumps here writes nlohmann's compact form only
    # with separators=(",", ":"); the spaced and escaped forms take the full parser's path)
    lists = [["a dog runs", "a \"quoted\" dog \\ here"], [], ["caf\u00e9 \u2014 \U0001F600\n\t/"]]
    put("caption_lists", "compact.json", json.dumps(lists, separators=(",", ":"), ensure_ascii=False))
    put("caption_lists", "escaped.json", json.dumps(lists, separators=(",", ":")))
    put("caption_lists", "spaced.json", json.dumps(lists))
    put("caption_lists", "empty.json", "[]")
    put("caption_lists", "lone_surrogate.json", '[["\\ud800"]]')
    put("caption_lists", "number.json", '[["a"],[1]]')
    put("caption_lists", "truncated.json", '[["a"]')


def model_seed(sat):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sat, "synth", "--out", tmp + "/data", "--images", "4", "--seed", "3"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([sat, "train", "--data", tmp + "/data", "--epochs", "0", "--blocks", "4", "--input-size", "16",
                        "--embed", "4", "--hidden", "4", "--attn", "4", "--out", tmp + "/run"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(tmp + "/run/model.sat", "rb") as f:
            put("model", "tiny_untrained.sat", f.read())
        # the same with a caption memory of its 4 photos (consensus reranking)
        with open(tmp + "/split.txt", "w") as f:
            f.write("".join(name + "\n" for name in sorted(os.listdir(tmp + "/data/images"))))
        subprocess.run([sat, "model", "memory", tmp + "/run/model.sat", "--data", tmp + "/data", "--split",
                        tmp + "/split.txt", "--neighbours", "2", "--consensus-weight", "3", "--out",
                        tmp + "/run/memory.sat"], check=True, stdout=subprocess.DEVNULL)
        with open(tmp + "/run/memory.sat", "rb") as f:
            put("model", "tiny_memory.sat", f.read())
    put("model", "not_a_model.safetensors", safetensors_bytes({"a": ("F32", [1], struct.pack("<f", 1))}, {}))


def http_request_seeds():
    # what clients send sat serve: a GET, a multipart POST, and heads the parser refuses (Transfer-Encoding beside a
    # length, a folded header, bare LF line ends)
    put("http_request", "bare_lf", b'POST /caption HTTP/1.1\nContent-Length: 1\n\nx')
    put("http_request", "fold", b'GET / HTTP/1.0\r\nConnection: keep-alive\r\nX: 1\r\n folded\r\n\r\n')
    put("http_request", "get", b'GET /health HTTP/1.1\r\nHost: a\r\n\r\n')
    put("http_request", "multipart", b'POST /caption?beam=3&include=hot+dog HTTP/1.1\r\nHost: a\r\nContent-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 120\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n\xff\xd8\xff\r\n--XyZ--\r\n')
    put("http_request", "te", b'POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default="build/sat", help="a built sat (for the model seed)")
    args = ap.parse_args()
    for target in ["image", "safetensors", "model", "feature_cache", "tfjs_json", "tfjs_minjs", "coco_json",
                   "karpathy", "flickr_csv", "flickr_token", "split_list", "ptb_tokenizer", "caption_lists",
                   "http_request"]:
        d = os.path.join(CORPUS, target)
        if os.path.isdir(d):  # regenerate the seeds, keep the crashing inputs found by fuzzing
            for f in os.listdir(d):
                if not f.startswith(("crash-", "oom-", "timeout-")):
                    os.remove(os.path.join(d, f))
    image_seeds()
    safetensors_seeds()
    feature_cache_seeds()
    tfjs_seeds()
    caption_seeds()
    http_request_seeds()
    model_seed(args.sat)
    for target in sorted(os.listdir(CORPUS)):
        print(target, len(os.listdir(os.path.join(CORPUS, target))), "seeds")


if __name__ == "__main__":
    main()
