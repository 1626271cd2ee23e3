#!/usr/bin/env python3
"""PyTorch peer for bench/bf16_gemm: one matrix product in bfloat16 or float32, 1 CPU thread,
timed as bench_bf16_gemm times its own (PyTorch 1.13 sends a bf16 product above 16^3 to
oneDNN: its brgemm kernel, AMX on a CPU that has it; float32 goes to its BLAS).
usage: torch_bf16_gemm.py ITERS CASE DTYPE   CASE: mm_1024 | fwd_784 | fwd_1024 | dw_784; DTYPE: bf16 | f32
prints: its environment (bench_env.py), then step_us=<median of 5 runs, us per call> min_us= max_us=,
and the same in this thread's CPU time (time.thread_time: what a shared machine's load does not inflate)
cpu_us= cpu_min_us= cpu_max_us="""
import sys, time
import torch
import torch.nn.functional as F
import bench_env
torch.set_num_threads(1)
bench_env.print_environment()
iters, case, dt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dtype = torch.bfloat16 if dt == "bf16" else torch.float32
torch.manual_seed(0)


def r(*s):
    return torch.randn(*s).to(dtype)


if case == "mm_1024":
    a, b = r(1024, 1024), r(1024, 1024)
    fn = lambda: torch.mm(a, b)
elif case == "fwd_784":  # an MLP's first layer: x [128, 784], W [1024, 784]
    x, w = r(128, 784), r(1024, 784)
    fn = lambda: F.linear(x, w)
elif case == "fwd_1024":
    x, w = r(128, 1024), r(1024, 1024)
    fn = lambda: F.linear(x, w)
elif case == "dw_784":  # its weight gradient: dY^T X, [1024, 784] over the batch of 128
    g, x = r(128, 1024), r(128, 784)
    fn = lambda: torch.mm(g.t(), x)
else:
    raise SystemExit(f"unknown case {case}")

with torch.no_grad():
    for _ in range(max(5, iters // 10)): fn()
    samples, cpu = [], []
    for _ in range(5):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(iters): fn()
        samples.append((time.perf_counter() - t) / iters * 1e6)
        cpu.append((time.thread_time() - c) / iters * 1e6)
    med, lo, hi = bench_env.summary(samples)
    cmed, clo, chi = bench_env.summary(cpu)
    print(f"step_us={med:.3f} min_us={lo:.3f} max_us={hi:.3f} cpu_us={cmed:.3f} cpu_min_us={clo:.3f} cpu_max_us={chi:.3f}")
