#!/usr/bin/env python3
"""PyTorch 1.13's side of phalanx-train --model gpt:...: the same GPT (nanogpt.py), the same
windows in the same order, the same AdamW groups and rate schedule, one process at the same
global batch; prints the validation loss after each epoch, to compare with phalanx-train's.

  torch_gpt_train.py --model gpt:4-4-128:128 --dataset fortunes --global-batch 16 --world 2 \\
      --epochs 1 --lr 2e-3 --weight-decay 0.1 --beta2 0.99 --warmup-steps 100 --lr-schedule cosine \\
      --seed 0 --save-init init.npz

--save-init writes the initial weights first (nanoGPT's init from torch.manual_seed(--seed));
give them to phalanx-train as --init so both start from the same point. --world is the number
of phalanx-train workers whose data order to follow (their global batches, --drop-last).
Only what phalanx-train would do with these options is done: no dropout, no gradient
clipping unless --clip-grad-norm. Prints `epoch E: train loss X, validation loss Y` and a
last line `val_loss=Y`.
"""
import argparse
import warnings
import math
import sys
import time

import torch

import nanogpt

# SequentialLR steps its cosine with an explicit epoch at the milestone (as Phalanx mirrors).
warnings.filterwarnings("ignore", message="The epoch parameter")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", required=True, help="fortunes or text:F1,F2")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--clip-grad-norm", type=float, default=0.0)
    p.add_argument("--stride", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--save-init", default="")
    p.add_argument("--init", default="")
    p.add_argument("--save", default="")
    return p.parse_args()


def schedule(opt, warmup, total):
    """phalanx-train's: LinearLR from 1/2 to 1 over the warmup, then cosine to 0 at the last step."""
    parts, milestones = [], []
    if warmup > 0:
        parts.append(torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, end_factor=1.0, total_iters=warmup))
    if total is not None:
        parts.append(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, total - warmup)))
    if len(parts) == 2:
        return torch.optim.lr_scheduler.SequentialLR(opt, parts, milestones=[warmup])
    return parts[0] if parts else None


def main():
    a = parse()
    torch.set_num_threads(1)
    dims, context = a.model[4:].split(":")
    layers, heads, width = (int(v) for v in dims.split("-"))
    context = int(context)
    files = nanogpt.fortune_files() if a.dataset == "fortunes" else a.dataset[5:].split(",")
    train_part, val_part = nanogpt.split(nanogpt.load_text(files))
    x, y = nanogpt.windows(train_part, context, a.stride or context)
    vx, vy = nanogpt.windows(val_part, context, context)
    torch.manual_seed(a.seed)
    model = nanogpt.GPT(layers, heads, width, context)
    if a.init:
        nanogpt.load_npz(model, a.init)
    if a.save_init:
        nanogpt.save_npz(model, a.save_init)
    opt = model.optimizer(a.lr, a.weight_decay, (a.beta1, a.beta2))
    steps_per_epoch = len(nanogpt.global_batches(len(x), a.global_batch, a.world, a.seed, 0, False))
    total = steps_per_epoch * a.epochs
    sched = schedule(opt, a.warmup_steps, total if a.lr_schedule == "cosine" else None)
    print(f"torch_gpt_train: {len(x)} windows, model {a.model}, {steps_per_epoch} steps an epoch, "
          f"global batch {a.global_batch} in {a.world} workers' order; torch {torch.__version__}", flush=True)
    step, t0 = 0, time.time()
    val = float("nan")
    for epoch in range(a.epochs):
        model.train()
        losses = []
        for batch in nanogpt.global_batches(len(x), a.global_batch, a.world, a.seed, epoch, not a.no_shuffle):
            idx = torch.tensor(batch)
            _, loss = model(x[idx], y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if a.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)
            opt.step()
            if sched:
                sched.step()
            losses.append(loss.item())
            step += 1
            if a.max_steps and step >= a.max_steps:
                break
        model.eval()
        with torch.no_grad():
            total_loss = 0.0
            for b in range(0, len(vx), 16):
                _, l = model(vx[b:b + 16], vy[b:b + 16])
                total_loss += l.item() * vx[b:b + 16].numel()
            val = total_loss / vx.numel()
        print(f"epoch {epoch + 1}: train loss {sum(losses) / len(losses):.4f}, validation loss {val:.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)
        if a.max_steps and step >= a.max_steps:
            break
    if a.save:
        nanogpt.save_npz(model, a.save)
    print(f"val_loss={val:.6f}")


if __name__ == "__main__":
    sys.exit(main())
