#!/usr/bin/env python3
"""PyTorch peer for bench/optim_step: torch.optim's step (1.13's defaults: the single-tensor
for-loop code; foreach=None means False on 1.13) and zero_grad over the parameters of an MLP
(784-1024-1024-10: 1.86 M parameters in 6 tensors), 1 CPU thread, with gradients set once.
usage: torch_optim_step.py WIDTHS ITERS RUNS CASE...   (RUNS: bench_optim_step asks for 1 per start, the
       sides taking turns; CASE: sgd, sgd_momentum, sgd_nesterov_wd,
       adam, adamw, adamw_amsgrad, zero_grad: 1.13's zero_grad(), which
       zeroes the gradients in place)
prints: its environment (bench_env.py), then per case
<case>.step_us=<median of RUNS runs, microseconds per step> <case>.min_us=<fastest> <case>.max_us=<slowest>"""
import sys, time
import torch
import bench_env
torch.set_num_threads(1)
bench_env.print_environment()
widths = [int(w) for w in sys.argv[1].split("-")]
iters, runs = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
layers = []
for i in range(len(widths) - 1):
    layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    if i + 2 < len(widths):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)
params = list(model.parameters())
grads = [torch.randn_like(p) * 1e-3 for p in params]


def make(case):
    if case == "sgd": return torch.optim.SGD(params, lr=0.01)
    if case == "sgd_momentum": return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if case == "sgd_nesterov_wd": return torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if case == "adam": return torch.optim.Adam(params, lr=1e-3)
    if case == "adamw": return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2)
    if case == "adamw_amsgrad": return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, amsgrad=True)
    if case == "zero_grad": return torch.optim.SGD(params, lr=0.01)
    raise SystemExit(f"unknown case {case}")


for case in sys.argv[4:]:
    opt = make(case)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    if case == "zero_grad":  # 1.13's default: set_to_none=False, the gradients are zeroed in place
        fn = lambda: opt.zero_grad()
    else:
        fn = opt.step
    with torch.no_grad():
        for _ in range(max(5, iters // 10)): fn()
        samples = []
        for _ in range(runs):
            t = time.perf_counter()
            for _ in range(iters): fn()
            samples.append((time.perf_counter() - t) / iters)
    med, lo, hi = bench_env.summary(samples)
    print(f"{case}.step_us={med * 1e6:.2f} {case}.min_us={lo * 1e6:.2f} {case}.max_us={hi * 1e6:.2f}", flush=True)
