#!/usr/bin/python3
"""Generates the PyTorch parity fixtures under tests/fixtures/ (committed).

Run with Debian's python3-torch (PyTorch 1.13): /usr/bin/python3 scripts/make_fixtures.py
The library and its tests never need torch; only this script does.
"""
import os
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


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    mlp_parity("relu", "mlp_relu_parity.npz")
    mlp_parity("tanh", "mlp_tanh_parity.npz")
    cross_entropy_parity()
    print("fixtures written to", os.path.normpath(OUT))
