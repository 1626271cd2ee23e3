#!/usr/bin/env bash
# SIGTERM to phalanx-run at a random step mid-training, N trials (default 20): each job runs
# under phalanx-run --nproc-per-node 2 with a --checkpoint-dir but no periodic checkpoints; a
# trial passes when every worker exits within the grace period, the launcher exits 75 naming
# the step it saved, that step's checkpoint verifies, and the job resumed with --resume ends
# with final weights (--save) bit-identical to an uninterrupted run's.
#   scripts/stop_resume_trials.sh [BUILD_DIR] [TRIALS]
set -u
BUILD=${1:-build}
TRIALS=${2:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN="$ROOT/$BUILD/bin/phalanx-run"
TRAIN="$ROOT/$BUILD/bin/phalanx-train"
[ -x "$RUN" ] && [ -x "$TRAIN" ] || { echo "stop_resume_trials: build phalanx-run and phalanx-train in $BUILD first" >&2; exit 2; }
W=$(mktemp -d /tmp/phalanx_stop_trials.XXXXXX)
trap 'rm -rf "$W"' EXIT

. "$ROOT/scripts/trial_support.sh"
extract_case_study "$ROOT" "$W"
EPOCHS=${PHALANX_TRIAL_EPOCHS:-48}; STEPS=$((EPOCHS * 8))
OPTS="--train-x $W/x.npy --train-y $W/y.npy --model 64-1024-1024-10 --global-batch 64 --lr 0.05 --momentum 0.9 --warmup-steps 6 --seed 5 --epochs $EPOCHS"


t0=$(date +%s.%N)
"$RUN" --nproc-per-node 2 "$TRAIN" $OPTS --save "$W/ref.npz" > "$W/ref.log" 2>&1 || { cat "$W/ref.log"; exit 1; }
ref_secs=$(echo "$(date +%s.%N) - $t0" | bc)  # printed at the end

pass=0; steps=()
for t in $(seq 1 "$TRIALS"); do
  D="$W/t$t"
  # A random step between 10 % and 80 % of the job: the signal goes when the job's --metrics
  # file holds that many step records (a clock could land in start-up, or after the end).
  target=$((STEPS / 10 + RANDOM % (STEPS * 7 / 10)))
  "$RUN" --nproc-per-node 2 "$TRAIN" $OPTS --checkpoint-dir "$D" --checkpoint-every 1000000 --resume \
    --metrics "$D.jsonl" > "$D.log" 2>&1 &
  launcher=$!
  while kill -0 "$launcher" 2>/dev/null; do
    n=$(grep -c '"step"' "$D.jsonl" 2>/dev/null)
    [ "${n:-0}" -ge "$target" ] && break
    sleep 0.002
  done
  sent=$(date +%s.%N)
  kill -TERM "$launcher" 2>/dev/null
  wait "$launcher"; code=$?
  secs=$(echo "$(date +%s.%N) - $sent" | bc)
  step=$(sed -n 's/^phalanx-run: stopped by SIGTERM after saving step \([0-9]*\) to .*/\1/p' "$D.log" | head -1)
  ok=no
  if [ "$code" -eq 75 ] && [ -n "$step" ] && [ "$(echo "$secs < 30" | bc)" -eq 1 ] &&
     "$RUN" --nproc-per-node 2 "$TRAIN" $OPTS --checkpoint-dir "$D" --resume --save "$D.npz" > "$D.resume.log" 2>&1 &&
     grep -q "resumed at step $step " "$D.resume.log" && same_weights "$W/ref.npz" "$D.npz"; then
    ok=yes; pass=$((pass + 1)); steps+=("$step")
  fi
  printf 'trial %2d: SIGTERM at step %3d, launcher exit %d after %.2f s, saved step %s, resumed bit-identical: %s\n' \
    "$t" "$target" "$code" "$secs" "${step:-none}" "$ok"
  [ "$ok" = yes ] || { echo "--- log of trial $t:"; tail -20 "$D.log"; }
done
echo "stop_resume_trials: $pass of $TRIALS jobs stopped within the grace period, saved, and resumed bit-identical (saved steps: ${steps[*]:-}; uninterrupted run ${ref_secs} s)"
[ "$pass" -eq "$TRIALS" ]
