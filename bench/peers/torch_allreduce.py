#!/usr/bin/python3
"""PyTorch peer for bench/allreduce_sweep: gloo all_reduce, float32 sum in place.
Launched by the bench with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.
usage: torch_allreduce.py [--runs R] [--budget SECONDS] N1 N2 ...   (element counts)
Prints, on rank 0, one line per size and run: n= run= us= (per call, rank 0's clock)
cpu_us= (process CPU time per call, mean over ranks), after its environment (bench_env.py)."""
import sys, time
import torch
import torch.distributed as dist
import bench_env

args = sys.argv[1:]
runs, budget = 5, 0.02
while args and args[0].startswith("--"):
    if args[0] == "--runs": runs = int(args[1])
    elif args[0] == "--budget": budget = float(args[1])
    args = args[2:]
torch.set_num_threads(1)
dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 0: bench_env.print_environment()
w = torch.ones(1)
for _ in range(50): dist.all_reduce(w)  # settle, as the bench's other columns do
for n in [int(a) for a in args]:
    t = torch.ones(n)
    for _ in range(1 if n >= (1 << 22) else 3): dist.all_reduce(t)
    est_us = 40 + n * 4 / 2e3
    iters = int(max(1 if n * 4 > (1 << 20) else 3, min(100000, budget * 1e6 / est_us)))
    for run in range(runs):
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(iters): dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / iters
        cpu = torch.tensor([(time.process_time() - c0) / iters])
        dist.all_reduce(cpu)
        if rank == 0:
            print(f"n={n} run={run} us={dt * 1e6:.3f} cpu_us={cpu.item() / world * 1e6:.3f}", flush=True)
dist.destroy_process_group()
