#!/usr/bin/python3
"""Exports the textbook case study's data and initial weights from PyTorch 1.13 (committed as
examples/data/seed_case_study.npz). Run with Debian's python3-torch:
    /usr/bin/python3 scripts/make_example_data.py
It reproduces ../shared/anchors/seed_lr.py: torch.manual_seed(0); x = randn(512, 64);
y = randint(0, 10, (512,)); the model 64-32-10 made right after torch.manual_seed(0).
It also records PyTorch's own final losses for the three configurations."""
import os
import numpy as np
import torch
import torch.nn as nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data")
torch.manual_seed(0)
x = torch.randn(512, 64)
y = torch.randint(0, 10, (512,))
make_model = lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def run(lr, bs, epochs=30):
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for i in range(0, 512, bs):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + bs]), y[i:i + bs]).backward()
            opt.step()
    return nn.functional.cross_entropy(model(x), y).item()


torch.manual_seed(0)
init = make_model().state_dict()
out = {"x": x.numpy(), "y": y.numpy().astype(np.int64)}
for k, v in init.items():
    out[k] = v.numpy()
out["torch_final_loss"] = np.array([run(0.1, 64), run(0.1, 256), run(0.4, 256)], dtype=np.float32)
os.makedirs(OUT, exist_ok=True)
np.savez(os.path.join(OUT, "seed_case_study.npz"), **out)
print("PyTorch final losses (single, direct, linear):", out["torch_final_loss"])
