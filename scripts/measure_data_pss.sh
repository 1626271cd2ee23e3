#!/usr/bin/env bash
# Sums the proportional set size (PSS, /proc/PID/smaps_rollup) of every phalanx-train
# process while a command runs, sampled every 0.05 s, and reports the median and the peak
# of the sums and the peak per worker. The processes are read one after the other, so a
# sample taken while a worker starts or exits (maps or unmaps shared data) can count a
# shared page more than once: the median is the steady state, the peak an upper bound. Usage: scripts/measure_data_pss.sh COMMAND [ARGS...]
# e.g. scripts/measure_data_pss.sh build/bin/phalanx-run --nproc-per-node 2 \
#        build/bin/phalanx-train --dataset fashion-mnist --model 784-256-10 --epochs 1
set -u
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1 &
cmd=$!
peak_sum=0; peak_one=0; samples=0; sums=()
while kill -0 "$cmd" 2>/dev/null; do
  sum=0
  # this command's phalanx-train processes only (other jobs on the host are not counted)
  kids=$(pgrep -P "$cmd"); all="$kids"
  for k in $kids; do all="$all $(pgrep -P "$k")"; done
  for pid in $all; do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = phalanx-train ] || continue
    kb=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null)
    [ -n "$kb" ] || continue
    sum=$((sum + kb)); [ "$kb" -gt "$peak_one" ] && peak_one=$kb
  done
  [ "$sum" -gt "$peak_sum" ] && peak_sum=$sum
  [ "$sum" -gt 0 ] && sums+=("$sum")
  samples=$((samples + 1))
  sleep 0.05
done
wait "$cmd"; rc=$?
cat "$out"
median=0
if [ ${#sums[@]} -gt 0 ]; then median=$(printf '%s\n' "${sums[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'); fi
echo "PSS of the workers: median $((median / 1024)) MB, peak $((peak_sum / 1024)) MB, largest worker $((peak_one / 1024)) MB ($samples samples, exit $rc)"
exit $rc
