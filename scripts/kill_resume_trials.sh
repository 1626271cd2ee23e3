#!/usr/bin/env bash
# kill -9 of a random worker at a random step, N trials (default 20): each job runs under
# phalanx-run --max-restarts 2 --nproc-per-node 2 with checkpoints every 3 steps and
# --resume; a trial passes when the job exits 0, its log shows a resume at a step > 0, and
# the final weights (--save) are bit-identical to an uninterrupted run's.
#   scripts/kill_resume_trials.sh [BUILD_DIR] [TRIALS]
set -u
BUILD=${1:-build}
TRIALS=${2:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN="$ROOT/$BUILD/bin/phalanx-run"
TRAIN="$ROOT/$BUILD/bin/phalanx-train"
[ -x "$RUN" ] && [ -x "$TRAIN" ] || { echo "kill_resume_trials: build phalanx-run and phalanx-train in $BUILD first" >&2; exit 2; }
W=$(mktemp -d /tmp/phalanx_kill_trials.XXXXXX)
trap 'rm -rf "$W"' EXIT

. "$ROOT/scripts/trial_support.sh"
extract_case_study "$ROOT" "$W"
"$TRAIN" --help >/dev/null 2>&1 || true
# A model wide enough that a step takes about a millisecond: the kill then lands in the
# middle of training, not after it (the textbook's 64-32-10 runs 96 steps in 0.1 s).
EPOCHS=${PHALANX_TRIAL_EPOCHS:-16}; STEPS=$((EPOCHS * 8))
OPTS="--train-x $W/x.npy --train-y $W/y.npy --model 64-1024-1024-10 --global-batch 64 --lr 0.05 --momentum 0.9 --warmup-steps 6 --seed 5 --epochs $EPOCHS"

newest_step() {
  ls "$1" 2>/dev/null | sed -n 's/^checkpoint-0*\([0-9][0-9]*\)\(\.[0-9]*\)\{0,1\}\.npz$/\1/p' | sort -n | tail -1
}

"$RUN" --nproc-per-node 2 "$TRAIN" $OPTS --save "$W/ref.npz" > "$W/ref.log" 2>&1 || { cat "$W/ref.log"; exit 1; }

pass=0; resumed_steps=()
for t in $(seq 1 "$TRIALS"); do
  D="$W/t$t"; target=$((6 + RANDOM % (STEPS - 12)))
  start=$(date +%s.%N)
  "$RUN" --max-restarts 2 --nproc-per-node 2 "$TRAIN" $OPTS --checkpoint-dir "$D" --checkpoint-every 3 --resume \
    --save "$D.npz" > "$D.log" 2>&1 &
  launcher=$!
  killed=""
  while kill -0 "$launcher" 2>/dev/null; do
    s=$(newest_step "$D"); s=${s:-0}
    if [ "$s" -ge "$target" ]; then
      mapfile -t ws < <(pgrep -P "$launcher" -f phalanx-train)
      if [ "${#ws[@]}" -eq 2 ]; then
        victim=${ws[$((RANDOM % 2))]}
        kill -9 "$victim" 2>/dev/null && killed="$victim (newest checkpoint at step $s)" && break
      fi
    fi
    sleep 0.002
  done
  wait "$launcher"; code=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  resumed=$(grep -o 'resumed at step [0-9]*' "$D.log" | head -1 | grep -o '[0-9]*$')
  ok=no
  if [ -n "$killed" ] && [ "$code" -eq 0 ] && [ "${resumed:-0}" -gt 0 ] && same_weights "$W/ref.npz" "$D.npz"; then
    ok=yes; pass=$((pass + 1)); resumed_steps+=("$resumed")
  fi
  printf 'trial %2d: target step %3d, killed %s, exit %d, resumed at step %s, %.1f s, bit-identical+complete: %s\n' \
    "$t" "$target" "${killed:-nothing (job ended first)}" "$code" "${resumed:-none}" "$secs" "$ok"
  [ "$ok" = yes ] || { echo "--- log of trial $t:"; tail -20 "$D.log"; }
done
echo "kill_resume_trials: $pass of $TRIALS jobs completed, resumed at a step > 0 and ended bit-identical (resume steps: ${resumed_steps[*]:-})"
[ "$pass" -eq "$TRIALS" ]
