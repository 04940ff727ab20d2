#!/usr/bin/env bash
# `sat report` in a real browser: a tiny synthetic set and briefly trained models (made as cli_test.sh makes them),
# their reports opened in headless Chromium. Fails when a page does not finish its script, shows a script error or
# any console message, or renders blank; checks that hostile captions and file names stay text, that sorting and
# filtering work, that a word's attention map is drawn (and hard attention's glimpse box), the page of a model
# without attention, captions from a feature cache, unreadable photos and one-line errors. Two negative controls
# show the checks can fail: a page whose script throws, and a blank screenshot.
set -u
SAT="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "FAIL: chromium is not installed, so the report page cannot be tested (tools/install-deps.sh installs it)"
  exit 1
fi
echo "browser: $("$CHROMIUM" --version 2>/dev/null)"
BROWSER=("$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-extensions
         --no-first-run --user-data-dir="$WORK/profile" --virtual-time-budget=5000)

# browse NAME PAGE [HASH]: the DOM after the page's scripts ran -> $WORK/NAME.dom, the browser's log -> NAME.log
browse() {
  timeout 120 "${BROWSER[@]}" --enable-logging=stderr --v=0 --dump-dom "file://$2${3:+#$3}" >"$WORK/$1.dom" 2>"$WORK/$1.log"
}
# screenshot NAME PAGE [HASH] -> $WORK/NAME.png
screenshot() {
  timeout 120 "${BROWSER[@]}" --hide-scrollbars --window-size=1200,900 --screenshot="$WORK/$1.png" "file://$2${3:+#$3}" \
    >/dev/null 2>"$WORK/$1.shot.log"
}
# page_problem NAME CARDS: says what is wrong with a browsed page (nothing when it rendered all CARDS cards cleanly)
page_problem() {
  local dom="$WORK/$1.dom" log="$WORK/$1.log"
  if [ ! -s "$dom" ]; then echo "no DOM from chromium: $(tail -n 3 "$log")"; return; fi
  if grep -q '<html[^>]* data-error=' "$dom"; then echo "script error: $(grep -o 'data-error="[^"]*"' "$dom")"; return; fi
  # the page writes nothing to the console: any message from it is a problem, an uncaught exception above all
  if grep -E 'CONSOLE.*source: file://|Uncaught' "$log"; then echo "console messages (above)"; return; fi
  if ! grep -q '<body[^>]* data-ready="1"' "$dom"; then echo "the script did not finish (no data-ready)"; return; fi
  if ! grep -q "<body[^>]* data-cards=\"$2\"" "$dom"; then echo "expected $2 cards: $(grep -o '<body[^>]*>' "$dom")"; return; fi
}
check_page() {  # check_page NAME CARDS WHAT
  local problem
  problem=$(page_problem "$1" "$2")
  [ -z "$problem" ] && pass "$3" || fail "$3: $problem"
}
# not_blank PNG: decodes the screenshot (plain Python, no imaging package) and requires a page with content: many
# colours, and no single colour covering 90% of it. Prints the figures.
not_blank() {
  python3 - "$1" <<'EOF'
import collections, struct, sys, zlib
data = open(sys.argv[1], "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit("not a PNG")
pos, idat = 8, b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    chunk = data[pos + 8:pos + 8 + length]
    pos += 12 + length
    if kind == b"IHDR":
        width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
    elif kind == b"IDAT":
        idat += chunk
if depth != 8 or colour_type not in (2, 6) or interlace:
    sys.exit("unexpected PNG format (depth %d, colour type %d)" % (depth, colour_type))
bpp = 3 if colour_type == 2 else 4
stride = width * bpp
raw = zlib.decompress(idat)
previous = bytearray(stride)
colours = collections.Counter()
for y in range(height):
    start = y * (stride + 1)
    kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
    if kind == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 255
    elif kind == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, previous))
    elif kind == 3:
        for i in range(stride):
            line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + previous[i]) // 2) & 255
    elif kind == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = previous[i], (previous[i - bpp] if i >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    previous = line
    if y % 2 == 0:
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, 2 * bpp))
total = sum(colours.values())
top = colours.most_common(1)[0][1] / total
print("%dx%d, %d colours, the commonest covers %.0f%%" % (width, height, len(colours), 100 * top))
sys.exit(0 if len(colours) >= 200 and top < 0.9 else 1)
EOF
}
# expect_error NAME PATTERN CMD...: a non-zero exit (no signal) whose last stderr line is "sat: ..." matching PATTERN
expect_error() {
  local name="$1" pattern="$2" rc last
  shift 2
  "$@" >"$WORK/out" 2>"$WORK/err"
  rc=$?
  last=$(tail -n 1 "$WORK/err")
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then fail "$name: exit $rc: $(cat "$WORK/err")"; return; fi
  if ! grep -qE "^sat: " <<<"$last" || ! grep -qE "$pattern" <<<"$last"; then fail "$name: '$last' does not match '$pattern'"; return; fi
  pass "$name: $last"
}
# cards_in FILE: the data-* attributes of each card in document order, one card a line (for sort and filter checks)
cards_in() { grep -o '<article class="card"[^>]*>' "$1"; }

# --- a tiny data set and briefly trained models ------------------------------------------------------------
"$SAT" synth --out "$WORK/train" --images 300 --seed 11 >/dev/null || fail "synth train"
"$SAT" synth --out "$WORK/val" --images 40 --seed 12 >/dev/null || fail "synth val"
# Hostile text: a reference with markup and quotes, and a photo whose file name has them.
python3 - "$WORK/val" <<'EOF' || fail "making the hostile captions"
import json, os, sys
folder = sys.argv[1]
path = os.path.join(folder, "captions.json")
data = json.load(open(path))
hostile = "o'k \"<script>&x\".png"  # no slash: not allowed in a file name
os.rename(os.path.join(folder, "images", data["images"][1]["file_name"]), os.path.join(folder, "images", hostile))
data["images"][1]["file_name"] = hostile
first = data["images"][0]["id"]
for a in data["annotations"]:
    if a["image_id"] == first:
        a["caption"] = ("<script>document.documentElement.dataset.injected='1'</script>"
                        "<img src=x onerror=\"document.documentElement.dataset.injected='2'\"> \"quoted\" & 'single'")
        break
json.dump(data, open(path, "w"))
EOF
# The soft-attention model learns enough in 3 epochs for maps with a shape; the others only need to exist.
COMMON=(--data "$WORK/train" --val-data "$WORK/val" --seed 3 --penalty 0 --val-limit 20)
ls "$WORK/train/images" | head -n 100 >"$WORK/small.txt"
"$SAT" train "${COMMON[@]}" --captions-per-image 2 --coverage true --out "$WORK/soft" --epochs 3 --lr 2e-3 \
  >/dev/null 2>"$WORK/train.log" || { fail "train"; tail -n 5 "$WORK/train.log"; }
"$SAT" train "${COMMON[@]}" --train-split "$WORK/small.txt" --captions-per-image 1 --attention hard --hard-window 3 \
  --out "$WORK/hard" --epochs 1 >/dev/null 2>&1 || fail "train hard attention"
"$SAT" train "${COMMON[@]}" --train-split "$WORK/small.txt" --captions-per-image 1 --attention none --out "$WORK/none" \
  --epochs 1 >/dev/null 2>&1 || fail "train without attention"

# --- the soft-attention report --------------------------------------------------------------------------------
PAGE="$WORK/soft.html"
"$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/val" --out "$PAGE" >"$WORK/report.out" 2>"$WORK/report.err" \
  && [ -s "$PAGE" ] && pass "report: $(cat "$WORK/report.out")" || fail "report: $(cat "$WORK/report.err")"
echo "report size: $(stat -c %s "$PAGE") bytes for 40 photos"
# the corpus scores are sat eval's, and the per-photo CIDEr-D terms average to the corpus CIDEr-D
"$SAT" eval --model "$WORK/soft/model.sat" --data "$WORK/val" --json >"$WORK/eval.json"
EVAL_CIDER=$(python3 -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["CIDEr"])' "$WORK/eval.json")
grep -q "<tr><th>CIDEr-D</th><td>$EVAL_CIDER</td></tr>" "$PAGE" && pass "corpus CIDEr-D as sat eval: $EVAL_CIDER" \
  || fail "corpus CIDEr-D differs from sat eval's $EVAL_CIDER: $(grep -o '<tr><th>CIDEr-D</th><td>[^<]*' "$PAGE")"
MEAN=$(cards_in "$PAGE" | grep -o 'data-cider="[^"]*"' | cut -d'"' -f2 | python3 -c 'import sys; v = [float(x) for x in sys.stdin]; print("%.4f" % (sum(v) / len(v)))')
python3 -c "import sys; sys.exit(0 if abs($MEAN - $EVAL_CIDER) < 2e-4 else 1)" && pass "the photos' CIDEr-D average to the corpus score" || fail "mean per-photo CIDEr-D $MEAN, corpus $EVAL_CIDER"
# the object table's rows are sat eval's counts (photos, named, false mentions, photos no reference names it in)
python3 - "$WORK/eval.json" "$PAGE" <<'PY' && pass "object table as sat eval's" || fail "object table differs from sat eval's"
import json, re, sys
objects = json.load(open(sys.argv[1]))["objects"]
page = open(sys.argv[2]).read()
table = re.search(r'<div class="objects">(.*?)</table>', page, re.S).group(1)
names = re.findall(r'<th(?: class="pool")? data-object="([^"]+)">', table)
count = lambda key: [int(v) for v in re.findall(r"<td[^>]*>(\d+)</td>",
                                                re.search(r'<tr data-count="%s">(.*?)</tr>' % key, table).group(1))]
rows = {name: list(v) for name, v in zip(names, zip(count("photos"), count("named"), count("false"), count("none")))}
expected = {g["name"]: [g["photos"], g["named"], g["false_mentions"], g["unnamed_photos"]]
            for g in objects["groups"] + [objects["rare"]]}
sys.exit(0 if len(rows) == 13 and all(len(count(k)) == 13 for k in ("photos", "named", "false", "none"))
         and rows == expected else 1)
PY
if grep -Eq 'https?://|(src|href)="//' "$PAGE"; then fail "the page names an external address"; else pass "self-contained: no external address"; fi
ls "$WORK"/soft.html.tmp* >/dev/null 2>&1 && fail "a temporary file was left behind" || pass "written atomically, nothing left behind"

browse soft "$PAGE"
check_page soft 40 "the page renders its 40 cards without a script error or console message"
grep -q 'data-injected' "$WORK/soft.dom" && fail "markup in a reference ran in the page" || pass "markup in a reference did not run"
grep -qF "<li>&lt;script&gt;document.documentElement.dataset.injected='1'&lt;/script&gt;&lt;img src=x" "$WORK/soft.dom" \
  && grep -qF '"quoted" &amp; '"'single'</li>" "$WORK/soft.dom" && pass "the reference is shown as text" \
  || fail "the hostile reference is not shown as text"
grep -qF "<h2>o'k \"&lt;script&gt;&amp;x\".png</h2>" "$WORK/soft.dom" && pass "a file name with quotes and markup is shown as text" \
  || fail "the hostile file name: $(grep -o '<h2>o[^/]*' "$WORK/soft.dom")"

# a word clicked (#demo pins the first word of the first card): its map drawn on the canvas
browse demo "$PAGE" demo
check_page demo 40 "#demo renders cleanly"
canvas=$(grep -o '<canvas[^>]*data-drawn=[^>]*>' "$WORK/demo.dom" | head -n 1)
sum=$(grep -o 'data-drawn-sum="[0-9.]*"' <<<"$canvas" | grep -o '[0-9.]*')
[ -n "$canvas" ] && grep -q 'data-drawn="0"' <<<"$canvas" && python3 -c "import sys; sys.exit(0 if float('${sum:-0}') > 0 else 1)" \
  && pass "the first word's attention map is drawn (drawn map sum $sum)" || fail "no map drawn: '$canvas'"
grep -q 'class="word active"' "$WORK/demo.dom" && pass "the word shows as selected" || fail "no active word"
screenshot demo "$PAGE" demo
stats=$(not_blank "$WORK/demo.png") && pass "the screenshot shows a page: $stats" || fail "blank screenshot: $stats"

# sorting and filtering (the view can be set from the address)
browse sorted "$PAGE" "sort=cider-asc"
check_page sorted 40 "sorted by CIDEr-D renders cleanly"
cards_in "$WORK/sorted.dom" | grep -o 'data-cider="[^"]*"' | cut -d'"' -f2 >"$WORK/ciders"
python3 -c "import sys; v=[float(x) for x in open(sys.argv[1])]; sys.exit(0 if len(v)==40 and v==sorted(v) and v[0]<v[-1] else 1)" "$WORK/ciders" \
  && pass "sorted by CIDEr-D, worst first ($(head -n 1 "$WORK/ciders") .. $(tail -n 1 "$WORK/ciders"))" || fail "not sorted: $(tr '\n' ' ' <"$WORK/ciders")"
browse by_file "$PAGE" "sort=file"
cards_in "$WORK/by_file.dom" | grep -o 'data-file="[^"]*"' >"$WORK/files"
LC_ALL=C sort -c "$WORK/files" 2>/dev/null && [ "$(wc -l <"$WORK/files")" -eq 40 ] && pass "sorted by file name" || fail "not sorted by file name"
# filtered on the last word of the first card's caption, from that card's CIDEr-D up: that card stays, others go
first=$(cards_in "$PAGE" | head -n 1)
WORD=$(grep -o 'data-caption="[^"]*"' <<<"$first" | cut -d'"' -f2 | awk '{print $NF}')
MIN=$(grep -o 'data-cider="[^"]*"' <<<"$first" | cut -d'"' -f2 | python3 -c "import math, sys; print(math.floor(float(sys.stdin.read()) * 1000) / 1000)")
browse filtered "$PAGE" "q=$WORD&min=$MIN"
check_page filtered 40 "filtered renders cleanly"
expected=$(cards_in "$PAGE" | python3 -c "
import re, sys
n = 0
for line in sys.stdin:
    text = re.search(r'data-file=\"([^\"]*)\"', line)[1] + chr(10) + re.search(r'data-caption=\"([^\"]*)\"', line)[1]
    n += '$WORD' in text and float(re.search(r'data-cider=\"([^\"]*)\"', line)[1]) >= $MIN
print(n)")
shown=$(grep -o '<body[^>]* data-shown="[0-9]*"' "$WORK/filtered.dom" | grep -o 'data-shown="[0-9]*"' | grep -o '[0-9]*')
visible=$(cards_in "$WORK/filtered.dom" | grep -vc ' hidden')
[ "$shown" = "$expected" ] && [ "$visible" = "$expected" ] && [ "$expected" -ge 1 ] && [ "$expected" -lt 40 ] \
  && pass "filtered on '$WORD' with CIDEr-D from $MIN: $shown of 40 shown" || fail "filter '$WORD' from $MIN: shown $shown, visible $visible, expected $expected"

# --- hard attention: the glimpse box; no attention: no map ------------------------------------------------
"$SAT" report --model "$WORK/hard/model.sat" --data "$WORK/val" --limit 8 --beam 2 --out "$WORK/hard.html" >/dev/null 2>&1 \
  || fail "report of the hard-attention model"
browse hard "$WORK/hard.html" demo
check_page hard 8 "the hard-attention page renders its 8 cards (--limit 8)"
grep -Eq '<canvas[^>]*data-drawn="0"[^>]*data-box="[0-9]+,[0-9]+"' "$WORK/hard.dom" \
  && pass "hard attention: the glimpse box is drawn ($(grep -o 'data-box="[^"]*"' "$WORK/hard.dom" | head -n 1))" || fail "no glimpse box"
"$SAT" report --model "$WORK/none/model.sat" --data "$WORK/val" --limit 5 --out "$WORK/none.html" >/dev/null 2>&1 \
  || fail "report of the model without attention"
browse none "$WORK/none.html" demo
check_page none 5 "the page of a model without attention renders"
grep -q "there is no map to show" "$WORK/none.dom" && ! grep -q '<canvas' "$WORK/none.dom" \
  && pass "without attention the page says there is no map" || fail "the no-attention page"

# --- captions from a feature cache equal captions from the photos ---------------------------------------------
ENC="$ROOT/models/inception_v3.sat"
"$SAT" extract --data "$WORK/val" --out "$WORK/val.feat" --size 96 --cut mixed2 --dtype f32 >/dev/null 2>&1 || fail "extract"
"$SAT" train "${COMMON[@]}" --train-split "$WORK/small.txt" --encoder "$ENC" --encoder-size 96 --cut mixed2 --out "$WORK/pre" \
  --epochs 1 --embed 32 --hidden 32 --attn 32 >/dev/null 2>&1 || fail "train from the pretrained encoder"
"$SAT" report --model "$WORK/pre/model.sat" --data "$WORK/val" --features "$WORK/val.feat" --limit 12 --out "$WORK/cached.html" >/dev/null 2>&1 &&
  "$SAT" report --model "$WORK/pre/model.sat" --data "$WORK/val" --limit 12 --out "$WORK/encoded.html" >/dev/null 2>&1 &&
  cmp -s <(cards_in "$WORK/cached.html") <(cards_in "$WORK/encoded.html") && grep -q "the feature cache $WORK/val.feat" "$WORK/cached.html" \
  && [ "$(grep -o 'src="data:image/jpeg;base64,/9j/' "$WORK/cached.html" | wc -l)" -eq 12 ] \
  && pass "--features: the same captions and scores as from the photos, thumbnails still shown" || fail "--features report"
browse cached "$WORK/cached.html" demo
check_page cached 12 "the page made from the feature cache renders"
expect_error "feature cache of another encoder" "^sat: $WORK/val.feat: feature cache was made by a different encoder" \
  "$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/val" --features "$WORK/val.feat" --out "$WORK/x.html"

# --- unreadable photos and errors -----------------------------------------------------------------------------
cp -r "$WORK/val" "$WORK/valbad" && printf 'not a png' >"$WORK/valbad/images/000003.png"
"$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/valbad" --out "$WORK/bad.html" >/dev/null 2>"$WORK/bad.err"
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$(wc -l <"$WORK/bad.err")" -eq 2 ] \
  && grep -q "^sat: $WORK/valbad/images/000003.png: cannot decode image" "$WORK/bad.err" \
  && tail -n 1 "$WORK/bad.err" | grep -q "^sat: report: 39 photos in $WORK/bad.html, 1 unreadable left out (named above)$" \
  && pass "an unreadable photo is named, left out, and the exit is non-zero: $(tail -n 1 "$WORK/bad.err")" \
  || fail "unreadable photo: exit $rc: $(cat "$WORK/bad.err")"
browse bad "$WORK/bad.html"
check_page bad 39 "the page without the unreadable photo renders its 39 cards"
grep -q "images/000003.png: cannot decode image" "$WORK/bad.dom" && pass "the page lists the unreadable photo" || fail "the page does not list the unreadable photo"
expect_error "missing model" "^sat: $WORK/nope.sat: " "$SAT" report --model "$WORK/nope.sat" --data "$WORK/val" --out "$WORK/x.html"
mkdir -p "$WORK/broken" && cp -r "$WORK/val/images" "$WORK/broken/" && printf '{"images": [' >"$WORK/broken/captions.json"
expect_error "malformed captions" "^sat: $WORK/broken/captions.json: " "$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/broken" --out "$WORK/x.html"
printf '000001.png\n' >"$WORK/one.txt" && cp -r "$WORK/val" "$WORK/valone" && printf '' >"$WORK/valone/images/000001.png"
expect_error "a set of one unreadable photo: its own error alone" "^sat: $WORK/valone/images/000001.png: empty file" \
  "$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/valone" --split "$WORK/one.txt" --out "$WORK/x.html"
[ "$(wc -l <"$WORK/err")" -eq 1 ] && pass "... on one line" || fail "one unreadable photo: $(cat "$WORK/err")"
expect_error "unwritable output" "^sat: $WORK/no/such/dir/r.html" "$SAT" report --model "$WORK/soft/model.sat" --data "$WORK/val" \
  --limit 2 --out "$WORK/no/such/dir/r.html"
[ ! -e "$WORK/x.html" ] && pass "no page written on an error" || fail "a page was written despite the error"

# --- negative controls: the checks above can fail ----------------------------------------------------------------
sed 's/var gh = data.grid\[0\]/var gh = data.no_such_field[0]/' "$PAGE" >"$WORK/broken.html"
cmp -s "$PAGE" "$WORK/broken.html" && fail "negative control: could not break the page's script"
browse broken "$WORK/broken.html" demo
problem=$(page_problem broken 40)
[ -n "$problem" ] && pass "negative control: a page whose script throws is caught ($problem)" || fail "negative control: a broken script passed"
printf '<!DOCTYPE html><html><body></body></html>\n' >"$WORK/blank.html"
screenshot blank "$WORK/blank.html"
stats=$(not_blank "$WORK/blank.png") && fail "negative control: a blank page passed as not blank ($stats)" \
  || pass "negative control: a blank page is caught ($stats)"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
