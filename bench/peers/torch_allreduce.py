#!/usr/bin/python3
"""PyTorch peer for bench/allreduce_sweep: gloo all_reduce, float32, one line per size.
Launched by the bench with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.
usage: torch_allreduce.py N1 N2 ...   (element counts)"""
import sys, time
import torch
import torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group(backend="gloo")
rank = dist.get_rank()
for n in [int(a) for a in sys.argv[1:]]:
    t = torch.randn(n)
    for _ in range(3): dist.all_reduce(t)
    iters = max(3, min(200, int(2e8 // (n * 4 + 1))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters): dist.all_reduce(t)
    dt = (time.perf_counter() - t0) / iters
    if rank == 0:
        print(f"n={n} us={dt * 1e6:.2f}", flush=True)
dist.destroy_process_group()
