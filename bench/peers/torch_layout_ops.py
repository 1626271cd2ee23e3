#!/usr/bin/env python3
"""PyTorch peer for bench/layout_ops: the transformer's layout and mask ops at the GPT example's
sizes, 1 CPU thread, each materialised (.contiguous(): Phalanx's permute and split are copies).
usage: torch_layout_ops.py ITERS CASE...
prints: its environment (bench_env.py), then per case
<case>.step_us=<median of 5 runs, microseconds per call> <case>.min_us=<fastest> <case>.max_us=<slowest>"""
import sys, time
import torch
import bench_env
torch.set_num_threads(1)
bench_env.print_environment()
iters = int(sys.argv[1])
torch.manual_seed(0)


def make(case):
    if case == "permute_bthd":
        x = torch.randn(16, 128, 4, 32)
        return lambda: x.permute(0, 2, 1, 3).contiguous()
    if case == "permute_bthd_big":
        x = torch.randn(16, 512, 8, 64)
        return lambda: x.permute(0, 2, 1, 3).contiguous()
    if case == "transpose_1024":
        x = torch.randn(1024, 1024)
        return lambda: x.permute(1, 0).contiguous()
    if case == "transpose_kT":
        x = torch.randn(16, 4, 128, 32)
        return lambda: x.transpose(2, 3).contiguous()
    if case == "split_qkv":
        x = torch.randn(16, 128, 384)
        return lambda: [p.contiguous() for p in x.split(128, dim=2)]
    if case == "cat_qkv":
        xs = [torch.randn(16, 128, 128) for _ in range(3)]
        return lambda: torch.cat(xs, dim=2)
    if case == "masked_fill_causal":
        x = torch.randn(16, 4, 128, 128)
        m = torch.triu(torch.ones(128, 128, dtype=torch.bool), 1)
        return lambda: x.masked_fill(m, float("-inf"))
    raise SystemExit(f"unknown case {case}")


with torch.no_grad():
    for case in sys.argv[2:]:
        fn = make(case)
        for _ in range(max(5, iters // 10)): fn()
        samples = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(iters): fn()
            samples.append((time.perf_counter() - t) / iters * 1e6)
        samples.sort()
        print(f"{case}.step_us={samples[2]:.3f} {case}.min_us={samples[0]:.3f} {case}.max_us={samples[4]:.3f}")
