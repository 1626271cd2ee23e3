#!/usr/bin/python3
"""PyTorch peer for bench/ddp_step. Launched once per rank with RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT set (WORLD_SIZE=1 runs the model without DDP).
usage: torch_ddp.py demo EPOCHS        -> the textbook's demo (Linear 64->10, 512 samples, batch 32/rank)
       torch_ddp.py mlp STEPS          -> MLP 784-1024-1024-10, 128 samples/rank, SGD momentum 0.9
       torch_ddp.py mlp STEPS HOOK INIT FINAL -> the same with comm hook HOOK (none|fp16|bf16:
                                          default_hooks' fp16/bf16_compress_hook), each rank its own
                                          batch (seed 100 + rank); rank 0 writes its flat float32
                                          weights to INIT before the warm-up and to FINAL at the end,
                                          and prints elements=<gradients all-reduced per step>
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
    hook = sys.argv[3] if len(sys.argv) > 3 else None
    if W > 1: model = DDP(model)
    if hook in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook_fn = getattr(default_hooks, hook + "_compress_hook")
        if hook == "bf16":
            # 1.13's DDP refuses a hook *named* bf16_compress_hook unless CUDA 11+ and NCCL
            # 2.10+ are present (_check_comm_hook tests hook.__name__); the same function under
            # another name runs on gloo, which reduces bfloat16 on the CPU.
            def bf16_on_gloo(state, bucket): return default_hooks.bf16_compress_hook(state, bucket)
            hook_fn = bf16_on_gloo
        model.register_comm_hook(None, hook_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if hook is not None: torch.manual_seed(100 + rank)
    x = torch.randn(128, 784); y = torch.randint(0, 10, (128,))
    def flat(): return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    if hook is not None and rank == 0:
        flat().tofile(sys.argv[4])
        print(f"elements={sum(p.numel() for p in model.parameters())}", flush=True)
    def step():
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    try:
        for _ in range(3): step()
    except RuntimeError as e:  # 1.13's gloo has no bfloat16 allreduce: "Invalid scalar type"
        if rank == 0: print("peer_error=" + str(e).splitlines()[0][:160], flush=True)
        sys.exit(0)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(count): step()
    dt = (time.perf_counter() - t) / count
if rank == 0: print(f"step_us={dt * 1e6:.1f}", flush=True)
if mode == "mlp" and hook is not None and rank == 0: flat().tofile(sys.argv[5])
dist.destroy_process_group()
