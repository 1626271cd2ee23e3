#!/usr/bin/env bash
# ctest trainer_tensorboard: phalanx-train --tensorboard on 2 workers, read back with
# TensorBoard's own EventAccumulator (tests/tools/check_tensorboard.py, in the build's
# pyenv that scripts/setup.sh makes) and compared with the same run's --metrics file; then
# a run stopped after a mid-epoch checkpoint and resumed into the same folder, whose steps
# must each appear once; then (root only) a full disk under the event folder. Exit 77
# (skipped) without the pyenv.
#   tensorboard_check.sh PHALANX_RUN PHALANX_TRAIN DATA_DIR PYENV WORK_DIR
set -euo pipefail
run=$1 train=$2 data=$3 pyenv=$4 work=$5
python=$pyenv/bin/python
if ! [ -x "$python" ] || ! "$python" -c "import tensorboard" 2>/dev/null; then
  echo "SKIPPED: tensorboard: no TensorBoard in $pyenv (scripts/setup.sh installs it from PyPI)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
args=(--train-x "$data/seed_case_study.npz:x" --train-y "$data/seed_case_study.npz:y"
      --test-x "$data/seed_case_study.npz:x" --test-y "$data/seed_case_study.npz:y"
      --global-batch 64 --lr 0.1 --momentum 0.9 --seed 3)
"$run" --nproc-per-node 2 "$train" "${args[@]}" --epochs 3 \
  --metrics "$work/full.jsonl" --tensorboard "$work/full"
"$python" "$(dirname "$0")/check_tensorboard.py" "$work/full" "$work/full.jsonl"
# A run that died after step 8 with its last checkpoint at step 5 (step 8's removed, as a
# crash before it was written leaves it), resumed to epoch 3: steps 6-8 are written twice,
# and TensorBoard must show each once (purge_step).
"$run" --nproc-per-node 2 "$train" "${args[@]}" --epochs 1 --checkpoint-dir "$work/ck" --checkpoint-every 5 \
  --metrics "$work/resumed.jsonl" --tensorboard "$work/resumed"
[ -f "$work/ck/checkpoint-0000000008.npz" ] || { echo "expected a checkpoint at step 8"; exit 1; }
rm "$work/ck/checkpoint-0000000008.npz"
"$run" --nproc-per-node 2 "$train" "${args[@]}" --epochs 3 --checkpoint-dir "$work/ck" --resume \
  --metrics "$work/resumed.jsonl" --tensorboard "$work/resumed" | tee "$work/resume.log"
grep -q "resumed at step 5" "$work/resume.log" || { echo "the second run did not resume from step 5"; exit 1; }
[ "$(ls "$work/resumed" | wc -l)" = 2 ] || { echo "expected two event files in $work/resumed"; exit 1; }
"$python" "$(dirname "$0")/check_tensorboard.py" "$work/resumed" "$work/resumed.jsonl"
# A full disk under the event files (a 16 KiB tmpfs; root only): one warning, training goes
# on, the weights are saved, the run ends with the error, and the file stays readable.
if [ "$(id -u)" = 0 ] && mkdir -p "$work/full_disk" && mount -t tmpfs -o size=16k tmpfs "$work/full_disk" 2>/dev/null; then
  set +e
  "$train" "${args[@]}" --epochs 20 --tensorboard "$work/full_disk/run" --save "$work/full_disk_w.npz" \
    > "$work/full_disk.log" 2>&1
  code=$?
  set -e
  n=$("$python" -c "
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
a = EventAccumulator('$work/full_disk/run'); a.Reload(); print(len(a.Scalars('train/loss')))" 2>/dev/null || echo 0)
  umount "$work/full_disk"
  [ "$code" = 1 ] || { cat "$work/full_disk.log"; echo "full disk: expected exit 1, got $code"; exit 1; }
  grep -q "no more TensorBoard events are written, training goes on" "$work/full_disk.log" ||
    { cat "$work/full_disk.log"; echo "full disk: no warning"; exit 1; }
  [ -s "$work/full_disk_w.npz" ] || { echo "full disk: the weights were not saved"; exit 1; }
  [ "$n" -gt 10 ] || { echo "full disk: TensorBoard reads $n steps of the full file"; exit 1; }
  echo "full disk: warned, trained on, saved the weights, exit 1; TensorBoard reads $n steps"
else
  echo "full disk: not run (needs root to mount a small tmpfs)"
fi
rm -rf "$work"
echo "trainer_tensorboard: passed"
