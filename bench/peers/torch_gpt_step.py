#!/usr/bin/env python3
"""PyTorch peer for bench/gpt_step: one training step of nanoGPT's GPT (nanogpt.py: the
model re-typed for PyTorch 1.13, attention written out) on random byte tokens, 1 CPU thread:
zero_grad, forward with the loss, backward, AdamW (nanoGPT's two groups) step.
usage: torch_gpt_step.py L-H-W:T BATCH ITERS [RUNS [PRECISION]]   (e.g. 4-4-128:128 16 5 1 bf16)
PRECISION: fp32 (default) or bf16: the forward and the loss under torch.autocast("cpu",
dtype=torch.bfloat16), zero_grad, backward and AdamW outside it (torch.autocast's recipe).
prints: its environment (bench_env.py), then step_us=<median of RUNS runs, microseconds per
step> min_us=<fastest run> max_us=<slowest run>"""
import sys
import time

import torch

import bench_env
import nanogpt

torch.set_num_threads(1)
bench_env.print_environment()
dims, context = sys.argv[1].split(":")
layers, heads, width = (int(v) for v in dims.split("-"))
context = int(context)
batch, iters = int(sys.argv[2]), int(sys.argv[3])
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
precision = sys.argv[5] if len(sys.argv) > 5 else "fp32"
if precision not in ("fp32", "bf16"):
    sys.exit(f"torch_gpt_step.py: PRECISION must be fp32 or bf16, got {precision}")
torch.manual_seed(0)
model = nanogpt.GPT(layers, heads, width, context)
opt = model.optimizer(1e-3, 0.1, (0.9, 0.99))
x = torch.randint(0, 256, (batch, context))
y = torch.randint(0, 256, (batch, context))


def forward_loss():
    if precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x, y)[1]
    return model(x, y)[1]


def step():
    opt.zero_grad(set_to_none=True)
    loss = forward_loss()
    loss.backward()
    opt.step()


for _ in range(1 if precision == "bf16" and iters <= 2 else max(2, iters // 2)):
    step()
samples = []
for _ in range(runs):
    t = time.perf_counter()
    for _ in range(iters):
        step()
    samples.append((time.perf_counter() - t) / iters)
med, lo, hi = bench_env.summary(samples)
print(f"step_us={med * 1e6:.2f} min_us={lo * 1e6:.2f} max_us={hi * 1e6:.2f}")
