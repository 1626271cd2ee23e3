#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (the device tool's H200): builds with the
# CUDA and NCCL plugins, runs the GPU suite, trains the textbook's model on the GPU through
# NCCL, and benchmarks the MLP step against PyTorch on the same GPU. Meant to finish within
# 10 minutes; writes its log to $OUT/gpu-check.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$LOG") 2>&1
nvidia-smi -L || { echo "gpu-check: no GPU here"; exit 1; }
BUILD=build-gpu
if ! command -v cmake >/dev/null || ! dpkg -s libgloo-dev >/dev/null 2>&1; then scripts/setup.sh >/dev/null; fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPHALANX_WITH_CUDA=ON -DPHALANX_WITH_NCCL=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" >/dev/null || { echo "gpu-check: build failed"; exit 1; }
echo "== GPU suite"; "$BUILD"/tests/cuda_tests; rc=$?
echo "== CPU-side CUDA checks"; "$BUILD"/tests/cuda_cpu_side_tests || rc=1
python3 - <<'PY' || echo "gpu-check: numpy missing, the training check below will fail"
import numpy as np
d = np.load("examples/data/seed_case_study.npz")
np.save("/tmp/phalanx_x.npy", d["x"]); np.save("/tmp/phalanx_y.npy", d["y"])
np.savez("/tmp/phalanx_init.npz", **{k: d[k] for k in ["0.weight", "0.bias", "2.weight", "2.bias"]})
PY
echo "== the textbook's single run on the GPU (NCCL, world of one; PyTorch 1.13 on CPU: 1.5834)"
"$BUILD"/bin/phalanx-train --train-x /tmp/phalanx_x.npy --train-y /tmp/phalanx_y.npy --init /tmp/phalanx_init.npz \
  --global-batch 64 --lr 0.1 --epochs 30 --no-shuffle --eval-train --device cuda --backend nccl | tail -2 || rc=1
echo "== the case study's example on the GPU (one process)"
"$BUILD"/examples/lr_scaling_study --device cuda --check || rc=1
echo "== MLP step, GPU, against PyTorch CUDA on the same GPU"
"$BUILD"/bench/bench_mlp_step --device cuda || rc=1
echo "gpu-check: exit $rc"
exit $rc
