#!/usr/bin/env python3
"""PyTorch peer for bench/attention: causal attention forward + backward as PyTorch 1.13 has
to write it (it has no F.scaled_dot_product_attention): softmax(q k^T * scale + mask) v, which
holds the [B, H, T, T] scores and weights. 1 CPU thread.
usage: torch_attention.py time T B H E ITERS RUNS   prints step_us=<median> min_us= max_us=
       torch_attention.py mem  T B H E              prints peak_bytes=<resident-set growth of the
                                                    first step beyond the inputs> (a fresh process:
                                                    the peak RSS is reset through /proc/self/clear_refs)
Both print the environment line (bench_env.py) first."""
import math
import re
import sys
import time

import torch

import bench_env

torch.set_num_threads(1)
bench_env.print_environment()
mode, t, b, h, e = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
q = torch.randn(b, h, t, e, requires_grad=True)
k = torch.randn(b, h, t, e, requires_grad=True)
v = torch.randn(b, h, t, e, requires_grad=True)
g = torch.randn(b, h, t, e)
mask = torch.full((t, t), float("-inf")).triu(1)  # the causal mask, as nanoGPT's slow path builds it
scale = 1.0 / math.sqrt(e)


def step():
    q.grad = k.grad = v.grad = None
    w = torch.softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1)
    (w @ v).backward(g)


def status_kb(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1))


if mode == "mem":
    before = status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    step()
    print(f"peak_bytes={(status_kb('VmHWM') - before) * 1024}")
else:
    iters, runs = int(sys.argv[6]), int(sys.argv[7])
    for _ in range(2):
        step()  # warm-up
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    med, lo, hi = bench_env.summary(samples)
    print(f"step_us={med:.1f} min_us={lo:.1f} max_us={hi:.1f}")
