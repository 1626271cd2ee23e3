#!/usr/bin/env python3
"""PyTorch peer for bench/conv_step: zero_grad + forward + cross-entropy + backward of a small CNN
(the C++ side builds the same), 1 CPU thread.
usage: torch_conv_step.py CASE BATCH ITERS RUNS   (CASE: cnn = Conv(1,32,3,p1)-ReLU-MaxPool2-Conv(32,64,3,p1)-
ReLU-MaxPool2-Flatten-Linear(3136,10) on [B,1,28,28]; conv2 = Conv(32,64,3,p1) on [B,32,14,14], loss sum)
prints: its environment (bench_env.py), then step_us=<median> min_us=<fastest run> max_us=<slowest run>"""
import sys, time
import torch
import torch.nn as nn
import bench_env
torch.set_num_threads(1)
bench_env.print_environment()
case, batch, iters, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
if case == "cnn":
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 10))
    x = torch.randn(batch, 1, 28, 28)
else:
    model = nn.Conv2d(32, 64, 3, padding=1)
    x = torch.randn(batch, 32, 14, 14)
y = torch.randint(0, 10, (batch,))
def step():
    model.zero_grad()
    out = model(x)
    loss = nn.functional.cross_entropy(out, y) if case == "cnn" else out.sum()
    loss.backward()
for _ in range(3): step()  # warm-up
samples = []
for _ in range(runs):
    t = time.perf_counter()
    for _ in range(iters): step()
    samples.append((time.perf_counter() - t) / iters * 1e6)
med, lo, hi = bench_env.summary(samples)
print(f"step_us={med:.1f} min_us={lo:.1f} max_us={hi:.1f}")
