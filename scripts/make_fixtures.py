#!/usr/bin/python3
"""Generates the PyTorch parity fixtures under tests/fixtures/ (committed).

Run with Debian's python3-torch (PyTorch 1.13): /usr/bin/python3 scripts/make_fixtures.py
The library and its tests never need torch; only this script does.
"""
import os
import subprocess
import sys
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def np32(t):
    return t.detach().numpy().astype(np.float32)


def mlp_parity(activation, name):
    torch.manual_seed(0)
    act = nn.ReLU() if activation == "relu" else nn.Tanh()
    model = nn.Sequential(nn.Linear(64, 32), act, nn.Linear(32, 10))
    x = torch.randn(16, 64)
    y = torch.randint(0, 10, (16,))
    out = {"x": x.numpy(), "y": y.numpy().astype(np.int64)}
    for k, v in model.state_dict().items():
        out["init." + k] = np32(v)
    logits = model(x)
    out["logits"] = np32(logits)
    for red in ["mean", "sum"]:
        model.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction=red)
        loss.backward()
        out["loss_" + red] = np.array(loss.item(), dtype=np.float32)
        for k, p in model.named_parameters():
            out["grad_" + red + "." + k] = np32(p.grad)
    np.savez(os.path.join(OUT, name), **out)


def cross_entropy_parity():
    torch.manual_seed(1)
    logits = torch.randn(8, 5) * 3
    target = torch.randint(0, 5, (8,))
    out = {"logits": logits.numpy(), "target": target.numpy().astype(np.int64)}
    for red in ["mean", "sum", "none"]:
        l = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(l, target, reduction=red)
        g = torch.ones_like(loss) if red != "none" else torch.linspace(-1, 1, 8)
        loss.backward(g)
        out["loss_" + red] = np32(loss)
        out["grad_" + red] = np32(l.grad)
    out["upstream_none"] = torch.linspace(-1, 1, 8).numpy()
    l = logits.clone().requires_grad_(True)
    ls = F.log_softmax(l, dim=1)
    ls.backward(torch.linspace(-1, 1, 40).reshape(8, 5))
    out["log_softmax"] = np32(ls)
    out["log_softmax_grad"] = np32(l.grad)
    a = torch.randn(6, 4, requires_grad=True)
    b = torch.randn(6, 4)
    m = F.mse_loss(a, b)
    m.backward()
    out["mse_a"] = np32(a)
    out["mse_b"] = b.numpy()
    out["mse_loss"] = np32(m)
    out["mse_grad"] = np32(a.grad)
    np.savez(os.path.join(OUT, "cross_entropy_parity.npz"), **out)


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "sgd_wd_dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, dampening=0.1,
                                                   weight_decay=1e-2),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
}


def optim_parity():
    """20 steps of each optimizer on the same recorded gradients."""
    torch.manual_seed(2)
    shapes = [(5, 3), (3,)]
    init = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(20)]
    out = {}
    for i, t in enumerate(init):
        out[f"init.{i}"] = t.numpy()
    for k, gs in enumerate(grads):
        for i, g in enumerate(gs):
            out[f"grad.{k}.{i}"] = g.numpy()
    for name, make in OPTIMIZERS.items():
        ps = [t.clone().requires_grad_(True) for t in init]
        opt = make(ps)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        for i, p in enumerate(ps):
            out[f"{name}.{i}"] = np32(p)
    np.savez(os.path.join(OUT, "optim_parity.npz"), **out)


def schedule_parity():
    """Learning-rate sequences over 30 steps; doubles stored as their int64 bit patterns."""
    S = torch.optim.lr_scheduler

    def seq(make):
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.4)
        sched = make(opt)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(30):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        return np.array(lrs, dtype=np.float64).view(np.int64)

    out = {
        "linear": seq(lambda o: S.LinearLR(o, start_factor=0.25, total_iters=8)),
        "step": seq(lambda o: S.StepLR(o, step_size=5, gamma=0.5)),
        "multistep": seq(lambda o: S.MultiStepLR(o, milestones=[3, 7, 7, 12], gamma=0.3)),
        "cosine": seq(lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001)),
        "warmup_cosine": seq(lambda o: S.SequentialLR(
            o, [S.LinearLR(o, start_factor=0.1, total_iters=5), S.CosineAnnealingLR(o, T_max=20)],
            milestones=[5])),
    }
    np.savez(os.path.join(OUT, "schedule_parity.npz"), **out)


def sampler_parity():
    """PyTorch's DistributedSampler index sets, no shuffle, for many (N, W, drop_last)."""
    from torch.utils.data.distributed import DistributedSampler
    out = {}
    for n in [1, 2, 3, 4, 5, 7, 8, 10, 13, 16, 17, 100]:
        for w in [1, 2, 3, 4, 5, 8]:
            for drop in [False, True]:
                if drop and n < w and n % w != 0:
                    continue  # every rank would get nothing; Phalanx raises instead
                for r in range(w):
                    s = DistributedSampler(list(range(n)), num_replicas=w, rank=r, shuffle=False,
                                           drop_last=drop)
                    out[f"n{n}_w{w}_d{int(drop)}_r{r}"] = np.array(list(iter(s)), dtype=np.int64)
    np.savez(os.path.join(OUT, "sampler_parity.npz"), **out)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    mlp_parity("relu", "mlp_relu_parity.npz")
    mlp_parity("tanh", "mlp_tanh_parity.npz")
    cross_entropy_parity()
    optim_parity()
    schedule_parity()
    sampler_parity()
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ddp_cnn.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "conv.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "join.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "norm.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "attention.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "transformer_ops.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpt.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "grad_scaler.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "autocast.py"), OUT], check=True)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bf16_matmul.py"), OUT], check=True)
    print("fixtures written to", os.path.normpath(OUT))
