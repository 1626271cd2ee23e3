#!/usr/bin/env bash
# Two launchers on one machine as two nodes (2 + 2 workers), against one launcher with the
# same 4 workers on shared memory: phalanx-train's time per step (its summary's training
# seconds / steps, set-up excluded), median of RUNS runs with the fastest and slowest, and
# the ratio to the one-launcher step. The textbook's MLP 64-32-10, global batch 8 (64 steps
# an epoch), SGD. Each two-launcher case runs with the default waits (they block when the
# machine's ranks outnumber its cores) and with PHALANX_GLOO_BUSY_POLL=1 (always spin: the
# behaviour before), so the effect of the choice shows in one run. The bar: within 5x.
#
#   bench/two_launchers.sh [BUILD_DIR] [RUNS] [EPOCHS]
set -u
BUILD=${1:-build}; RUNS=${2:-5}; EPOCHS=${3:-30}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN="$ROOT/$BUILD/bin/phalanx-run"; TRAIN="$ROOT/$BUILD/bin/phalanx-train"
[ -x "$RUN" ] && [ -x "$TRAIN" ] || { echo "two_launchers: build phalanx-run and phalanx-train in $BUILD first" >&2; exit 2; }
W=$(mktemp -d /tmp/phalanx_two_launchers.XXXXXX); trap 'rm -rf "$W"' EXIT
. "$ROOT/scripts/trial_support.sh"
extract_case_study "$ROOT" "$W"
OPTS="--train-x $W/x.npy --train-y $W/y.npy --model 64-32-10 --global-batch 8 --lr 0.1 --epochs $EPOCHS --seed 3"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"

per_step() {  # ms per step from rank 0's summary line [0] {..."seconds":S,"steps":N,...}
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    at = line.find('{')
    if at >= 0 and '"final_train_loss"' in line:
        j = json.loads(line[at:])
        print("%.4f" % (1000 * j["seconds"] / j["steps"]))
        break
PY
}
one() { "$RUN" --nproc-per-node 4 "$TRAIN" $OPTS > "$W/one.log" 2>&1 && per_step "$W/one.log"; }
two() {  # $1: backend option (may be empty); extra environment before
  local port=$((20000 + RANDOM % 20000))
  env "$@" PHALANX_RDZV_TOKEN=bench "$RUN" --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 \
    --master-port $port "$TRAIN" $OPTS $BACKEND > "$W/n1.log" 2>&1 &
  local n1=$!
  env "$@" PHALANX_RDZV_TOKEN=bench "$RUN" --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 \
    --master-port $port "$TRAIN" $OPTS $BACKEND > "$W/n0.log" 2>&1
  wait $n1
  per_step "$W/n0.log"
}
stats() { sort -g | awk '{v[NR]=$1} END {printf "%.4f [%.4f, %.4f]", v[int((NR+1)/2)], v[1], v[NR]}'; }
median() { echo "$1" | cut -d' ' -f1; }

printf '%-44s %s\n' "case (ms per step: median [fastest, slowest])" "ratio to one launcher"
base=$(for i in $(seq "$RUNS"); do one; done | stats)
printf '%-44s %s\n' "one launcher, 4 workers (auto: shm)" "$base"
for BACKEND in "" "--backend gloo"; do
  for mode in default spin; do
    extra=(); [ $mode = spin ] && extra=(PHALANX_GLOO_BUSY_POLL=1)
    r=$(for i in $(seq "$RUNS"); do two "${extra[@]}" X=1; done | stats)
    printf '%-44s %s  %.1fx\n' "2 launchers x 2 (${BACKEND:-auto: hierarchical}, $mode)" "$r" \
      "$(echo "$(median "$r") / $(median "$base")" | bc -l)"
  done
done
