#!/usr/bin/env bash
# Data-parallel training under mpirun (ctest mpi), on this machine over loopback TCP:
#   - one process and 2 ranks, same data, seed and global batch (odd, so the shares differ), give the same weights
#     within TOL (largest difference relative to each tensor's largest weight) for every attention kind, from the
#     feature cache, with fine-tuned encoder blocks and in self-critical training; a different seed or batch does not
#     (the comparison can fail);
#   - a rank killed mid-run: mpirun stops the other within a bounded time, the messages name the rank, and --resume
#     (2 ranks, or one process) ends with the uninterrupted run's weights;
#   - a rank that hangs: the watchdog gives up after --mpi-timeout, naming the exchange and the stopped rank;
#   - bad input under mpirun: one error line per rank that reports it, naming the rank, and no hang.
# Exit 77 (ctest: skipped) with a message when mpirun is not installed.
set -u
SAT="$1"
TOL=1e-3
if ! command -v mpirun >/dev/null 2>&1; then
  echo "skipped: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev, then rebuild with SAT_MPI on)"
  exit 77
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ENC="$ROOT/models/inception_v3.sat"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
# Loopback only; --oversubscribe and no binding so 2 ranks run on any machine (sat gives each its share of the cores).
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include lo -np 2)

# A sat built without MPI refuses to run under mpirun (each rank would train alone): that is all there is to test.
if "${MPI[@]}" "$SAT" train --data "$WORK/none" 2>&1 | grep -q "built without MPI"; then
  echo "skipped: $SAT was built without MPI (SAT_MPI=OFF); under mpirun it refuses, as it should"
  exit 77
fi

"$SAT" synth --out "$WORK/train" --images 48 --seed 21 >/dev/null || fail "synth train"
"$SAT" synth --out "$WORK/val" --images 12 --seed 22 >/dev/null || fail "synth val"
for cut in mixed1 mixed2; do
  for set in train val; do
    "$SAT" extract --data "$WORK/$set" --out "$WORK/${set}_$cut.feat" --size 96 --cut $cut --dtype f32 >/dev/null 2>&1 ||
      fail "extract $set $cut"
  done
done
DATA=(--data "$WORK/train" --val-data "$WORK/val" --encoder "$ENC" --encoder-size 96 --dropout 0.3 --lr 2e-3)
SMALL=(--embed 32 --hidden 32 --attn 32)
F32=(--precision f32)  # the float32 runs agree to TOL (sat train's default is auto: bf16 where the CPU computes it)
CACHE=(--cut mixed2 --features "$WORK/train_mixed2.feat" --val-features "$WORK/val_mixed2.feat")

# same NAME ARGS...: trains with ARGS in one process and on 2 ranks, then compares the checkpoints' weights.
same() {
  local name="$1"
  shift
  rm -rf "$WORK/one" "$WORK/two"
  if ! "$SAT" train "$@" --out "$WORK/one" >"$WORK/one.log" 2>&1; then fail "$name: one process: $(tail -1 "$WORK/one.log")"; return; fi
  if ! "${MPI[@]}" "$SAT" train "$@" --out "$WORK/two" >"$WORK/two.log" 2>&1; then fail "$name: 2 ranks: $(tail -3 "$WORK/two.log")"; return; fi
  local diff
  diff=$("$SAT" model diff "$WORK/one/checkpoint.sat" "$WORK/two/checkpoint.sat" --tolerance "${SAME_TOL:-$TOL}")
  [ $? -eq 0 ] && pass "$name: 1 process = 2 ranks (${diff#*: })" || fail "$name: $diff"
}
same "soft attention, coverage, 2 captions per photo" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --coverage true --captions-per-image 2 --batch 7 --epochs 2 --seed 4
grep -q "^data-parallel: 2 ranks share each batch of 7 photos" "$WORK/two.log" && [ "$(grep -c "^best val" "$WORK/two.log")" -eq 1 ] &&
  pass "2 ranks: one line says so, rank 0 alone prints the result" || fail "2 ranks' output: $(cat "$WORK/two.log")"
[ "$(ls "$WORK/two")" = "$(printf 'checkpoint.sat\nmodel.sat')" ] && pass "2 ranks: only rank 0 wrote into --out, atomically" ||
  fail "files in --out: $(ls "$WORK/two")"
cp "$WORK/one/checkpoint.sat" "$WORK/soft_one.sat"; cp "$WORK/one/model.sat" "$WORK/soft_model.sat"
# bf16 products (float32 sums, weights, Adam and gradient exchange). The ranks' shares sum in another order, as in
# float32, but a value that differs in its last float32 bit can round to the neighbouring bfloat16 (2^-8 apart), and
# Adam carries that on: so the weights agree to bf16's precision, TOL_BF16 (2.5 of its rounding steps), and another
# seed must still differ beyond it. Only where the CPU computes bf16 natively (else sat refuses bf16).
TOL_BF16=1e-2
if "$SAT" train "${DATA[@]}" "${SMALL[@]}" "${CACHE[@]}" --precision bf16 --epochs 0 --out "$WORK/probe" 2>&1 |
    grep -q "no native bfloat16"; then
  echo "skipped: bf16 products (this CPU has no native bfloat16 arithmetic)"
else
  SAME_TOL=$TOL_BF16 same "soft attention in bf16 products" "${DATA[@]}" "${SMALL[@]}" "${CACHE[@]}" --precision bf16 --batch 7 --epochs 2 --seed 4
  grep -q "decoder products in bf16" "$WORK/two.log" && pass "2 ranks in bf16: the log says so" || fail "2 ranks in bf16: $(head -5 "$WORK/two.log")"
  cp "$WORK/one/checkpoint.sat" "$WORK/bf16_one.sat"
  rm -rf "$WORK/two"
  "${MPI[@]}" "$SAT" train "${DATA[@]}" "${SMALL[@]}" "${CACHE[@]}" --precision bf16 --batch 7 --epochs 2 --seed 5 --out "$WORK/two" >/dev/null 2>&1
  OUT=$("$SAT" model diff "$WORK/bf16_one.sat" "$WORK/two/checkpoint.sat" --tolerance $TOL_BF16)
  [ $? -eq 1 ] && pass "bf16: another seed differs beyond $TOL_BF16 (${OUT#*: })" || fail "bf16, another seed: $OUT"
fi
same "hard attention (moving-average baseline)" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --attention hard --batch 7 --epochs 2 --seed 4
same "hard attention, 3 samples, Luong order" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --attention hard --hard-samples 3 --order luong --batch 7 --epochs 2 --seed 4
same "local attention, dot score" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --attention local --score dot --batch 7 --epochs 2 --seed 4
same "no attention" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --attention none --batch 7 --epochs 2 --seed 4
same "fine-tuned encoder block (mixed2 on mixed1's cache)" "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" --cut mixed2 --tune-from mixed1 --tune-lr 1e-3 \
  --features "$WORK/train_mixed1.feat" --val-features "$WORK/val_mixed1.feat" --batch 7 --epochs 1 --seed 4
same "self-critical (CIDEr-D) training" "${F32[@]}" --init-from "$WORK/soft_model.sat" --objective cider --scst-samples 3 --metric cider \
  --data "$WORK/train" --val-data "$WORK/val" --features "$WORK/train_mixed2.feat" --val-features "$WORK/val_mixed2.feat" \
  --lr 5e-4 --batch 7 --epochs 1 --seed 4

# The comparison can fail: another seed, or another global batch, is another model.
rm -rf "$WORK/two"
"${MPI[@]}" "$SAT" train "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --coverage true --captions-per-image 2 --batch 7 --epochs 2 --seed 5 --out "$WORK/two" >/dev/null 2>&1
OUT=$("$SAT" model diff "$WORK/soft_one.sat" "$WORK/two/checkpoint.sat" --tolerance $TOL)
[ $? -eq 1 ] && pass "another seed differs beyond the tolerance (${OUT#*: })" || fail "another seed: $OUT"
rm -rf "$WORK/two"
"${MPI[@]}" "$SAT" train "${DATA[@]}" "${SMALL[@]}" "${F32[@]}" "${CACHE[@]}" --coverage true --captions-per-image 2 --batch 8 --epochs 2 --seed 4 --out "$WORK/two" >/dev/null 2>&1
OUT=$("$SAT" model diff "$WORK/soft_one.sat" "$WORK/two/checkpoint.sat" --tolerance $TOL)
[ $? -eq 1 ] && pass "another global batch differs beyond the tolerance (${OUT#*: })" || fail "another batch: $OUT"

# --- a rank killed mid-run, then --resume -----------------------------------------------------------------------
LONG=("${DATA[@]}" "${F32[@]}" "${CACHE[@]}" --embed 64 --hidden 64 --attn 64 --batch 3 --seed 6 --checkpoint-every 2)
"${MPI[@]}" "$SAT" train "${LONG[@]}" --epochs 3 --out "$WORK/straight" >/dev/null 2>&1 || fail "uninterrupted 2-rank run"
# rank_pid MPIRUN_PID RANK: the process mpirun started as that rank (its environment says which)
rank_pid() {
  for child in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$child"; return; }
  done
}
"${MPI[@]}" "$SAT" train "${LONG[@]}" --epochs 3 --out "$WORK/killed" >"$WORK/killed.log" 2>&1 &
mpirun_pid=$!
while [ ! -f "$WORK/killed/checkpoint.sat" ] && kill -0 $mpirun_pid 2>/dev/null; do sleep 0.02; done
victim=$(rank_pid $mpirun_pid 1)
if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
  start=$SECONDS
  while kill -0 $mpirun_pid 2>/dev/null && [ $((SECONDS - start)) -lt 60 ]; do sleep 0.1; done
  if kill -0 $mpirun_pid 2>/dev/null; then
    fail "killed rank 1: the run still hangs after 60 s"
    kill -9 $mpirun_pid
  else
    wait $mpirun_pid
    rc=$?
    took=$((SECONDS - start))
    tr '\r' '\n' <"$WORK/killed.log" >"$WORK/killed.txt"
    # rank 0 says why it stops, unless mpirun ends before it forwards the line
    said=$(grep -m1 "^sat: rank 0 of 2: stopped by mpirun (SIGTERM)" "$WORK/killed.txt")
    [ $rc -ne 0 ] && grep -q "process rank 1 .*exited on signal 9" "$WORK/killed.txt" &&
      pass "rank 1 killed: the run ended in ${took} s (exit $rc), mpirun names rank 1${said:+; rank 0: $said}" ||
      fail "rank 1 killed (exit $rc): $(cat "$WORK/killed.txt")"
  fi
  [ -z "$(pgrep -f "$WORK/killed")" ] && pass "no rank is left running" || fail "ranks left: $(pgrep -af "$WORK/killed")"
  cp "$WORK/killed/checkpoint.sat" "$WORK/killed_checkpoint.sat"
  "${MPI[@]}" "$SAT" train --resume "$WORK/killed/checkpoint.sat" >"$WORK/resume.log" 2>&1 && grep -q "^resuming" "$WORK/resume.log" &&
    OUT=$("$SAT" model diff "$WORK/straight/checkpoint.sat" "$WORK/killed/checkpoint.sat" --tolerance $TOL) &&
    pass "--resume on 2 ranks ends with the uninterrupted run's weights (${OUT#*: })" || fail "resume on 2 ranks: ${OUT:-$(tail -3 "$WORK/resume.log")}"
  mkdir -p "$WORK/alone" && cp "$WORK/killed_checkpoint.sat" "$WORK/alone/checkpoint.sat"
  "$SAT" train --resume "$WORK/alone/checkpoint.sat" >"$WORK/alone.log" 2>&1 &&
    OUT=$("$SAT" model diff "$WORK/straight/checkpoint.sat" "$WORK/alone/checkpoint.sat" --tolerance $TOL) &&
    pass "--resume in one process from the 2 ranks' checkpoint: the same weights (${OUT#*: })" || fail "resume alone: ${OUT:-$(tail -3 "$WORK/alone.log")}"
else
  fail "could not kill rank 1 (the run had ended: $(tail -2 "$WORK/killed.log"))"
fi

# --- a rank that hangs: the watchdog ----------------------------------------------------------------------------
"${MPI[@]}" "$SAT" train "${LONG[@]}" --epochs 30 --mpi-timeout 3 --out "$WORK/hung" >"$WORK/hung.log" 2>&1 &
mpirun_pid=$!
while [ ! -f "$WORK/hung/checkpoint.sat" ] && kill -0 $mpirun_pid 2>/dev/null; do sleep 0.02; done
victim=$(rank_pid $mpirun_pid 1)
if [ -n "$victim" ] && kill -STOP "$victim"; then
  start=$SECONDS
  while kill -0 $mpirun_pid 2>/dev/null && [ $((SECONDS - start)) -lt 60 ]; do sleep 0.1; done
  if kill -0 $mpirun_pid 2>/dev/null; then
    fail "stopped rank 1: the run still hangs after 60 s"
    kill -CONT "$victim"; kill -9 "$victim" $mpirun_pid
  else
    wait $mpirun_pid
    rc=$?
    grep -Eq "^sat: rank 0 of 2: no reply from the other ranks for [0-9]+ s in the gradients of step [0-9]+ \(rank 1 \(pid $victim\) is stopped\); giving up" "$WORK/hung.log" &&
      [ $rc -ne 0 ] && pass "rank 1 stopped: rank 0 gave up after $((SECONDS - start)) s naming it (exit $rc)" ||
      fail "rank 1 stopped (exit $rc): $(tr '\r' '\n' <"$WORK/hung.log" | grep -v '^epoch .*/')"
    [ -z "$(pgrep -f "$WORK/hung")" ] && pass "mpirun ended the stopped rank too" || fail "ranks left: $(pgrep -af "$WORK/hung")"
  fi
else
  fail "could not stop rank 1"
fi

# --- bad input under mpirun: the rank that reports it is named, the run ends -------------------------------------
timeout 60 "${MPI[@]}" "$SAT" train --data "$WORK/nowhere" --out "$WORK/bad" >"$WORK/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -Eq "^sat: rank [01] of 2: $WORK/nowhere: " "$WORK/bad.log" && [ ! -e "$WORK/bad" ] &&
  pass "bad input under mpirun: $(grep -m1 '^sat: ' "$WORK/bad.log")" || fail "bad input under mpirun (exit $rc): $(cat "$WORK/bad.log")"
timeout 60 "${MPI[@]}" "$SAT" train "${DATA[@]}" "${SMALL[@]}" --cut mixed2 --out "$WORK/nocache" >"$WORK/nocache.log" 2>&1
grep -q "^sat: rank [01] of 2: train: $WORK/nocache/features.feat is missing: under mpirun, make the feature cache first" "$WORK/nocache.log" &&
  pass "a missing feature cache under mpirun is refused" || fail "missing cache under mpirun: $(cat "$WORK/nocache.log")"

echo "mpi test: $failures failure(s)"
[ $failures -eq 0 ]
