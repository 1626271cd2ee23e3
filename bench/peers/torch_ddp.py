#!/usr/bin/python3
"""PyTorch peer for bench/ddp_step. Launched once per rank with RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT set (WORLD_SIZE=1 runs the model without DDP).
usage: torch_ddp.py demo EPOCHS        -> the textbook's demo (Linear 64->10, 512 samples, batch 32/rank)
       torch_ddp.py mlp STEPS          -> MLP 784-1024-1024-10, 128 samples/rank, SGD momentum 0.9
prints (rank 0): its environment (bench_env.py), then step_us=<microseconds per step> (one run: the
benchmark launches it once per run and takes the median and spread over the runs)"""
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import bench_env
torch.set_num_threads(1)
mode, count = sys.argv[1], int(sys.argv[2])
W = int(os.environ.get("WORLD_SIZE", "1"))
dist.init_process_group(backend="gloo")
rank = dist.get_rank()
if rank == 0: bench_env.print_environment()
torch.manual_seed(0)
if mode == "demo":
    model = DDP(torch.nn.Linear(64, 10))
    full = TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(full)
    loader = DataLoader(full, batch_size=32, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    def epoch(e):
        sampler.set_epoch(e)
        n = 0
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step(); n += 1
        return n
    epoch(0)
    dist.barrier()
    t = time.perf_counter(); steps = 0
    for e in range(1, count + 1): steps += epoch(e)
    dt = (time.perf_counter() - t) / steps
else:
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    if W > 1: model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(128, 784); y = torch.randint(0, 10, (128,))
    def step():
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    for _ in range(3): step()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(count): step()
    dt = (time.perf_counter() - t) / count
if rank == 0: print(f"step_us={dt * 1e6:.1f}", flush=True)
dist.destroy_process_group()
