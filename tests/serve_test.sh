#!/usr/bin/env bash
# sat serve over loopback: good requests (raw bytes, multipart, attention, explicit search) answer the CLI's caption;
# bad ones (empty, not an image, truncated JPEG, over --max-bytes, bad parameters, wrong method or path) get a 4xx
# JSON error and the server keeps serving; a burst over a queue of 1 gets 503s; concurrent requests are batched and
# get the captions single ones get; /metrics counts what was sent; SIGTERM lets accepted requests finish, exit 0.
set -u
SAT="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK=$(mktemp -d)
MODEL="$ROOT/models/flickr8k-inception.sat"
PHOTO="$ROOT/examples/dog_and_man.jpg"
SCENE="$ROOT/examples/scene.png"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
SERVER=""
pids=()
cleanup() { [ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# start_server LOG ARGS...: sets SERVER (pid) and URL
start_server() {
  local log="$1"; shift
  "$SAT" serve --model "$MODEL" --port 0 "$@" 2>"$log" &
  SERVER=$!
  URL=""
  for _ in $(seq 1 600); do
    URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" 2>/dev/null | head -n 1)
    [ -n "$URL" ] && return 0
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
  done
  fail "sat serve did not start: $(cat "$log")"; echo "$failures failure(s)"; exit 1
}
# post NAME [curl args...] -> $WORK/NAME.body, prints the status
post() { local name="$1"; shift; curl -s -m 120 -o "$WORK/$name.body" -w '%{http_code}' "$@"; }
json_field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d$2)" "$WORK/$1.body" 2>/dev/null; }

cli_caption=$("$SAT" caption "$PHOTO" --model "$MODEL" 2>/dev/null)
cli_scene=$("$SAT" caption "$SCENE" --model "$MODEL" 2>/dev/null)
cli_greedy=$("$SAT" caption "$PHOTO" --model "$MODEL" --beam 1 2>/dev/null)
cli_diverse=$("$SAT" caption "$PHOTO" --model "$MODEL" --beam 4 --beam-groups 2 --diversity 3 2>/dev/null)
cli_include=$("$SAT" caption "$PHOTO" --model "$MODEL" --include grass 2>/dev/null)
[ -n "$cli_caption" ] || { fail "sat caption gave nothing"; exit 1; }

# --max-wait: every request let in whatever the machine's pace (admission by expected wait: tests/attack_test.py)
start_server "$WORK/serve.log" --max-bytes 200000 --max-wait 3600
pass "listening at $URL"
s=$(post raw -X POST --data-binary @"$PHOTO" "$URL/caption")
[ "$s" = 200 ] && [ "$(json_field raw "['caption']")" = "$cli_caption" ] && pass "raw bytes: the CLI's caption" || fail "raw bytes: $s $(cat "$WORK/raw.body")"
s=$(post multi -F "note=x" -F "image=@$PHOTO" "$URL/caption")
[ "$s" = 200 ] && [ "$(json_field multi "['caption']")" = "$cli_caption" ] && pass "multipart file: the CLI's caption" || fail "multipart: $s $(cat "$WORK/multi.body")"
s=$(post greedy -X POST --data-binary @"$PHOTO" "$URL/caption?beam=1&attention=1")
if [ "$s" = 200 ] && [ "$(json_field greedy "['caption']")" = "$cli_greedy" ] && \
   [ "$(json_field greedy "['attention'][0]['rows']*0+len(d['attention'])==len(d['words'])")" = True ] && \
   python3 -c "import json,sys; d=json.load(open(sys.argv[1])); g=d['attention'][0]; assert len(g['weights'])==g['rows']*g['cols'] and abs(sum(g['weights'])-1)<1e-3" "$WORK/greedy.body"; then
  pass "beam=1&attention=1: the CLI's greedy caption, one attention grid per word, each summing to 1"
else fail "beam=1&attention=1: $s $(head -c 300 "$WORK/greedy.body")"; fi

s=$(post include -X POST --data-binary @"$PHOTO" "$URL/caption?include=grass")
[ "$s" = 200 ] && [ "$(json_field include "['caption']")" = "$cli_include" ] && grep -qw grass <<<"$cli_include" &&
  pass "include=grass: the CLI's --include caption ($cli_include)" || fail "include=grass: $s $(cat "$WORK/include.body") (CLI: $cli_include)"
s=$(post diverse -X POST --data-binary @"$PHOTO" "$URL/caption?beam=4&beam_groups=2&diversity=3")
[ "$s" = 200 ] && [ "$(json_field diverse "['caption']")" = "$cli_diverse" ] && pass "beam_groups=2&diversity=3: the CLI's diverse caption" ||
  fail "beam_groups: $s $(cat "$WORK/diverse.body")"
s=$(post cands -X POST --data-binary @"$PHOTO" "$URL/caption?beam=4&candidates=2")
if [ "$s" = 200 ] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
c = d['candidates']
assert 1 <= len(c) <= 2 and c[0]['rank'] == 1 and c[0]['chosen'] and c[0]['caption'] == d['caption'], c
assert all(x['total'] == x['score'] and x['agreement'] == 0 for x in c), c
assert [x['score'] for x in c] == sorted((x['score'] for x in c), reverse=True), c
" "$WORK/cands.body"; then pass "candidates=2: the beam's best two, the kept one first"
else fail "candidates=2: $s $(head -c 300 "$WORK/cands.body")"; fi

# bad requests: status and a JSON error each
check_error() {  # NAME STATUS curl args...
  local name="$1" want="$2"; shift 2
  local s; s=$(post "$name" "$@")
  local e; e=$(json_field "$name" "['error']")
  [ "$s" = "$want" ] && [ -n "$e" ] && pass "$name: $s $e" || fail "$name: status $s (want $want): $(head -c 200 "$WORK/$name.body")"
}
head -c 5000 "$PHOTO" > "$WORK/truncated.jpg"
head -c 300000 /dev/urandom > "$WORK/big.bin"
check_error empty 400 -X POST "$URL/caption"
check_error garbage 400 -X POST --data-binary "not an image at all" "$URL/caption"
check_error truncated 400 -X POST --data-binary @"$WORK/truncated.jpg" "$URL/caption"
# a TIFF without its photometric tag: OpenCV's reader complains on stderr (its logger, and imdecode through std::cerr)
python3 -c "import struct, sys; open(sys.argv[1], 'wb').write(b'II*\0\x08\0\0\0' + struct.pack('<H', 3) +
  b''.join(struct.pack('<HHII', t, 3 if t < 273 else 4, 1, v) for t, v in ((256, 64), (257, 64), (273, 9999))) + bytes(4))" "$WORK/bad.tif"
check_error bad_tiff 400 -X POST --data-binary @"$WORK/bad.tif" "$URL/caption"
check_error oversize 413 -X POST --data-binary @"$WORK/big.bin" "$URL/caption"
check_error bad_beam 400 -X POST --data-binary @"$PHOTO" "$URL/caption?beam=0"
check_error bad_norm 400 -X POST --data-binary @"$PHOTO" "$URL/caption?length_norm=abc"
# objects=1 needs a model whose input side is a multiple of 32 (this one takes 299): refused before any work
check_error objects_at_299 400 -X POST --data-binary @"$PHOTO" "$URL/caption?objects=1"
check_error bad_objects 400 -X POST --data-binary @"$PHOTO" "$URL/caption?objects=2"
check_error bad_object_threshold 400 -X POST --data-binary @"$PHOTO" "$URL/caption?objects=1&object_threshold=1.5"
check_error bad_consensus 400 -X POST --data-binary @"$PHOTO" "$URL/caption?consensus_weight=-1"
check_error no_memory 400 -X POST --data-binary @"$PHOTO" "$URL/caption?consensus_weight=2"
grep -q '"flickr8k-inception.sat: has no caption memory' "$WORK/no_memory.body" && ! grep -q "$ROOT" "$WORK"/*.body &&
  pass "consensus_weight on a model without a caption memory: named by the model's file, no answer shows the server's folders" ||
  fail "no_memory: $(cat "$WORK/no_memory.body")"
check_error bad_candidates 400 -X POST --data-binary @"$PHOTO" "$URL/caption?candidates=101"
check_error memory_candidates 400 -X POST --data-binary @"$PHOTO" "$URL/caption?memory_candidates=2"
grep -q 'has no caption memory for memory_candidates' "$WORK/memory_candidates.body" && pass "memory_candidates without a caption memory: named" ||
  fail "memory_candidates: $(cat "$WORK/memory_candidates.body")"
check_error object_evidence 400 -X POST --data-binary @"$PHOTO" "$URL/caption?object_evidence=2"
grep -q 'has no object channels for object_evidence' "$WORK/object_evidence.body" && pass "object_evidence on a model that reads no detector: named" ||
  fail "object_evidence: $(cat "$WORK/object_evidence.body")"
check_error bad_evidence_threshold 400 -X POST --data-binary @"$PHOTO" "$URL/caption?evidence_threshold=2"
check_error relevance_weight 400 -X POST --data-binary @"$PHOTO" "$URL/caption?relevance_weight=1"
grep -q 'has no caption memory for relevance_weight' "$WORK/relevance_weight.body" && pass "relevance_weight without a caption memory: named" ||
  fail "relevance_weight: $(cat "$WORK/relevance_weight.body")"
check_error bad_relevance_weight 400 -X POST --data-binary @"$PHOTO" "$URL/caption?relevance_weight=101"
check_error bad_neighbour_evidence 400 -X POST --data-binary @"$PHOTO" "$URL/caption?neighbour_evidence=1.5"
grep -q 'neighbour_evidence must be a number in \[0, 1\]' "$WORK/bad_neighbour_evidence.body" &&
  pass "neighbour_evidence out of range: named" || fail "bad_neighbour_evidence: $(cat "$WORK/bad_neighbour_evidence.body")"
check_error beam_evidence 400 -X POST --data-binary @"$PHOTO" "$URL/caption?beam_evidence=2"
grep -q 'has no object channels for beam_evidence' "$WORK/beam_evidence.body" &&
  pass "beam_evidence on a model that reads no detector: named" || fail "beam_evidence: $(cat "$WORK/beam_evidence.body")"
check_error bad_beam_evidence 400 -X POST --data-binary @"$PHOTO" "$URL/caption?beam_evidence=101"
grep -q 'beam_evidence must be a number in \[0, 100\]' "$WORK/bad_beam_evidence.body" &&
  pass "beam_evidence out of range: named" || fail "bad_beam_evidence: $(cat "$WORK/bad_beam_evidence.body")"
check_error bad_groups 400 -X POST --data-binary @"$PHOTO" "$URL/caption?beam=3&beam_groups=2"
grep -q 'beam groups must divide the beam size (3)' "$WORK/bad_groups.body" && pass "beam_groups that do not divide the beam: named" ||
  fail "bad_groups: $(cat "$WORK/bad_groups.body")"
check_error bad_diversity 400 -X POST --data-binary @"$PHOTO" "$URL/caption?diversity=-1"
check_error unknown_param 400 -X POST --data-binary @"$PHOTO" "$URL/caption?bean=3"
check_error unknown_word 400 -X POST --data-binary @"$PHOTO" "$URL/caption?include=zebrafish"
grep -q "does not know the word 'zebrafish' (include)" "$WORK/unknown_word.body" && pass "include with a word the model does not know: named" ||
  fail "unknown_word: $(cat "$WORK/unknown_word.body")"
check_error no_file 400 -F "note=x" "$URL/caption"
check_error get_caption 405 "$URL/caption"
check_error post_health 405 -X POST "$URL/health"
check_error no_path 404 "$URL/nowhere"
# the answer says what is wrong; the server's log holds only its own lines (no decoder's line without its request)
grep -v '^sat serve: ' "$WORK/serve.log" > "$WORK/foreign.log"
[ -s "$WORK/foreign.log" ] && fail "the server's log holds decoders' lines: $(head -c 300 "$WORK/foreign.log")" ||
  pass "the server's log holds only its own lines"
grep -q 'truncated JPEG' "$WORK/truncated.body" && pass "the truncated JPEG's error is sat's one line" || fail "truncated: $(cat "$WORK/truncated.body")"

# concurrent requests: batched, each the caption a single request gets
for i in $(seq 1 8); do
  if [ $((i % 2)) = 0 ]; then f="$PHOTO"; else f="$SCENE"; fi
  post "c$i" -X POST --data-binary @"$f" "$URL/caption" > "$WORK/c$i.status" & pids+=($!)
done
wait "${pids[@]}"; pids=()
same=1
for i in $(seq 1 8); do
  if [ $((i % 2)) = 0 ]; then want="$cli_caption"; else want="$cli_scene"; fi
  [ "$(cat "$WORK/c$i.status")" = 200 ] && [ "$(json_field "c$i" "['caption']")" = "$want" ] || same=0
done
[ $same = 1 ] && pass "8 concurrent requests: each the CLI's caption of its photo" || fail "concurrent captions differ"

curl -s -m 30 "$URL/metrics" > "$WORK/metrics.txt"
python3 - "$WORK/metrics.txt" <<'PY' && pass "/metrics: Prometheus text, counts what was sent, batches over 1 image" || fail "/metrics: $(head -c 400 "$WORK/metrics.txt")"
import re, sys
text = open(sys.argv[1]).read()
samples = {}
for line in text.splitlines():
    if line.startswith("#") or not line:
        assert re.match(r"# (HELP|TYPE) \w+ ", line) or not line, line
        continue
    m = re.match(r'^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$', line)
    assert m, "not a sample line: " + line
    samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
assert samples['sat_requests_total{code="200"}'] == 6 + 8, samples
assert samples['sat_requests_total{code="400"}'] == 25, samples  # none counted twice (unread bodies drained)
assert samples['sat_requests_total{code="413"}'] == 1, samples
assert samples['sat_requests_total{code="405"}'] == 2 and samples['sat_requests_total{code="404"}'] == 1, samples
assert samples["sat_errors_total"] == 29
assert samples['sat_request_duration_seconds_bucket{le="+Inf"}'] == samples["sat_request_duration_seconds_count"] == 43
assert samples["sat_batch_size_sum"] == 14 and samples["sat_batch_size_count"] < 14, samples  # batched
assert samples["sat_queue_depth"] == 0
PY
s=$(post health "$URL/health")
[ "$s" = 200 ] && [ "$(json_field health "['status']")" = ok ] && [ "$(json_field health "['model']")" = flickr8k-inception.sat ] &&
  pass "still serving after the bad requests: /health ok, the model named by its file" || fail "health: $s $(cat "$WORK/health.body")"

# SIGTERM with requests in flight: they finish, the server exits 0
for i in 1 2 3 4; do post "t$i" -X POST --data-binary @"$PHOTO" "$URL/caption" > "$WORK/t$i.status" & pids+=($!); done
sleep 1  # the four have connected and sent (curl starts slowly on a loaded machine)
kill -TERM "$SERVER"
wait "$SERVER"; rc=$?
wait "${pids[@]}"; pids=()
ok=1; for i in 1 2 3 4; do [ "$(cat "$WORK/t$i.status")" = 200 ] || ok=0; done
[ $rc = 0 ] && [ $ok = 1 ] && grep -q "SIGTERM: finishing" "$WORK/serve.log" && pass "SIGTERM: in-flight requests answered 200, exit 0" || \
  fail "SIGTERM: exit $rc, statuses $(cat "$WORK"/t*.status | tr '\n' ' '), log: $(tail -n 2 "$WORK/serve.log")"
SERVER=""

# a queue of 1 and one image at a time: a burst gets 503 at once for what does not fit, and the rest answers
start_server "$WORK/serve2.log" --queue 1 --max-batch 1 --batch-wait-ms 0
for i in $(seq 1 12); do post "q$i" -X POST --data-binary @"$PHOTO" "$URL/caption" > "$WORK/q$i.status" & pids+=($!); done
wait "${pids[@]}"; pids=()
n200=$(cat "$WORK"/q*.status | grep -o 200 | wc -l); n503=$(cat "$WORK"/q*.status | grep -o 503 | wc -l)
if [ "$n503" -ge 1 ] && [ "$n200" -ge 1 ] && [ $((n200 + n503)) = 12 ] && grep -q '"error":"busy' "$WORK"/q*.body; then
  pass "queue of 1: $n200 answered, $n503 refused with 503 and a JSON error"
else fail "queue of 1: $(cat "$WORK"/q*.status | tr '\n' ' ')"; fi
kill -TERM "$SERVER"; wait "$SERVER"; SERVER=""

# bad flags and a missing model: one line, non-zero exit
out=$("$SAT" serve --model "$WORK/none.sat" --port 0 2>&1); rc=$?
[ $rc -ne 0 ] && [ "$(echo "$out" | wc -l)" = 1 ] && [[ "$out" == "sat: $WORK/none.sat: "* ]] && pass "missing model: $out" || fail "missing model: $rc $out"
"$SAT" serve --model "$MODEL" --port 0 2>"$WORK/s3.log" & p=$!
for _ in $(seq 1 600); do grep -q listening "$WORK/s3.log" && break; sleep 0.1; done
port=$(grep -o '127\.0\.0\.1:[0-9]*' "$WORK/s3.log" | cut -d: -f2)
out=$(timeout 60 "$SAT" serve --model "$MODEL" --port "$port" 2>&1); rc=$?
kill -TERM $p; wait $p
[ $rc -ne 0 ] && [[ "$out" == "sat: serve: cannot listen on 127.0.0.1:$port"* ]] && pass "port in use: $out" || fail "port in use: $rc $out"

echo "$failures failure(s)"
[ $failures -eq 0 ]
