#!/usr/bin/env python3
"""Reads phalanx-train's --tensorboard folder with TensorBoard's own EventAccumulator and
checks it against the same run's --metrics file (JSON Lines): every step record's loss and
learning rate under train/loss and train/lr at that step (as float32), every epoch record's
losses and accuracy under epoch/* at the epoch's last step, the other step tags present,
and one point per step in every tag (a resumed run's repeated steps hidden by purge_step).

  check_tensorboard.py RUN_DIR METRICS.jsonl

Exit 0 when all agree, 1 with the first difference, 77 when TensorBoard is not installed.
"""
import json
import struct
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"SKIPPED: tensorboard: not installed for {sys.executable} ({e})")
    sys.exit(77)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    run_dir, metrics = sys.argv[1], sys.argv[2]
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    events = {t: acc.Scalars(t) for t in tags}
    series = {t: {e.step: e.value for e in events[t]} for t in tags}
    steps, epochs = [], []
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec:
                steps.append(rec)
            elif "epoch" in rec and ("train_loss" in rec or "train_loss_rank0" in rec):
                epochs.append(rec)
    problems = []
    want_step_tags = {"train/loss", "train/lr", "train/grad_norm"}
    timing_tags = {"train/step_seconds", "train/samples_per_second"}  # from each run's second step on
    for t in sorted(timing_tags - tags):
        problems.append(f"tag {t} missing (have {sorted(tags)})")
    for t in sorted(want_step_tags - tags):
        problems.append(f"tag {t} missing (have {sorted(tags)})")
    for rec in steps:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr")):
            got = series.get(tag, {}).get(rec["step"])
            if got is None or got != f32(rec[key]):
                problems.append(f"{tag} at step {rec['step']}: {got} in TensorBoard, {rec[key]} in --metrics")
    for tag in sorted(tags):
        if len(events[tag]) != len(series[tag]):  # a resumed run's steps shown twice (no purge)
            problems.append(f"{tag}: {len(events[tag])} points for {len(series[tag])} steps")
    for tag in want_step_tags & tags:
        if sorted(series[tag]) != [r["step"] for r in steps]:
            problems.append(f"{tag}: steps {sorted(series[tag])[:5]}..., --metrics has {[r['step'] for r in steps][:5]}...")
    last_step = {}  # epoch -> its last step: where the epoch's scalars are
    for rec in steps:
        last_step[rec["epoch"]] = max(last_step.get(rec["epoch"], 0), rec["step"])
    for rec in epochs:
        at = last_step.get(rec["epoch"])
        for tag, key in (("epoch/train_loss", "train_loss"), ("epoch/test_loss", "test_loss"),
                         ("epoch/test_accuracy", "test_acc")):
            if key in rec:
                got = series.get(tag, {}).get(at)
                if got is None or got != f32(rec[key]):
                    problems.append(f"{tag} at epoch {rec['epoch']}: {got} in TensorBoard, {rec[key]} in --metrics")
    if not steps:
        problems.append("the --metrics file has no step records")
    if problems:
        print("\n".join(problems[:20]))
        return 1
    print(f"tensorboard: {len(tags)} tags, {len(steps)} steps and {len(epochs)} epochs agree with --metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
