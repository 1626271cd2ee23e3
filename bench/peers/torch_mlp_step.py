#!/usr/bin/env python3
"""PyTorch peer for bench/mlp_step: zero_grad + forward + backward + torch.optim.SGD step of an
MLP, 1 CPU thread, on DEVICE (the C++ side does the same with optim::SGD).
usage: torch_mlp_step.py WIDTHS BATCH ITERS [DEVICE [RUNS [PRECISION]]]   (WIDTHS like 784-1024-1024-10;
DEVICE cpu, cuda or cuda:0; RUNS 5 by default: bench_mlp_step asks for 1 per start, the sides taking
turns; PRECISION fp32 (default) or bf16: the forward and the loss under
torch.autocast(DEVICE type, dtype=torch.bfloat16), backward and step outside it)
prints: its environment (bench_env.py), then step_us=<median of RUNS runs, microseconds per step>
min_us=<fastest run> max_us=<slowest run>, then the breakdown of RUNS more runs timed phase by phase:
zero_us= forward_us= backward_us= optimizer_us= (each the median over the runs of its mean per step;
forward includes the loss)"""
import sys, time
import torch
import bench_env
torch.set_num_threads(1)
bench_env.print_environment()
widths = [int(w) for w in sys.argv[1].split("-")]
batch, iters = int(sys.argv[2]), int(sys.argv[3])
device = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cpu")
runs = int(sys.argv[5]) if len(sys.argv) > 5 else 5
precision = sys.argv[6] if len(sys.argv) > 6 else "fp32"
if precision not in ("fp32", "bf16"):
    sys.exit(f"torch_mlp_step.py: PRECISION must be fp32 or bf16, got {precision}")
def forward_loss():
    if precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return torch.nn.functional.cross_entropy(model(x), y)
    return torch.nn.functional.cross_entropy(model(x), y)
torch.manual_seed(0)
layers = []
for i in range(len(widths) - 1):
    layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    if i + 2 < len(widths):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(batch, widths[0], device=device); y = torch.randint(0, widths[-1], (batch,), device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
def step():
    opt.zero_grad()
    forward_loss().backward()
    opt.step()
for _ in range(max(2 if precision == "bf16" else 5, iters // 10)): step()
samples = []
for _ in range(runs):
    t = time.perf_counter()
    for _ in range(iters): step()
    sync()
    samples.append((time.perf_counter() - t) / iters)
med, lo, hi = bench_env.summary(samples)
print(f"step_us={med * 1e6:.2f} min_us={lo * 1e6:.2f} max_us={hi * 1e6:.2f}")
phases = {"zero": [], "forward": [], "backward": [], "optimizer": []}
for _ in range(runs):
    acc = dict.fromkeys(phases, 0.0)
    for _ in range(iters):
        t0 = time.perf_counter()
        opt.zero_grad()
        t1 = time.perf_counter()
        loss = forward_loss()
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        opt.step()
        sync()
        t4 = time.perf_counter()
        acc["zero"] += t1 - t0; acc["forward"] += t2 - t1; acc["backward"] += t3 - t2; acc["optimizer"] += t4 - t3
    for k in phases:
        phases[k].append(acc[k] / iters)
print(" ".join(f"{k}_us={bench_env.summary(v)[0] * 1e6:.2f}" for k, v in phases.items()))
