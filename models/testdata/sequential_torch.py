"""The sequential model of sequential_test.go written as a PyTorch nn.Sequential.

Reads the state_dict (loaded with strict=True, so the names must be exactly
the module's), the input batch and a weight matrix R from argv[1]; writes the
output and the gradients of sum(output * R) with respect to every parameter
and to the input to argv[2].
"""
import json
import sys

import torch
from torch import nn


class Residual(nn.Sequential):
    """A residual group: its input plus its layers' output."""

    def forward(self, x):
        return x + super().forward(x)


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.4) for older PyTorch: w * x / sqrt(mean(x^2) + eps)."""

    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def block():
    return Residual(nn.LayerNorm(6), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6, bias=False))


model = nn.Sequential(
    nn.Conv2d(2, 3, 3, stride=2, padding=1),
    nn.GELU(approximate="tanh"),
    nn.MaxPool2d(2),
    nn.Conv2d(3, 4, 2, padding=1),
    nn.AvgPool2d(2),
    nn.Flatten(),
    nn.Linear(4, 6),
    block(),
    block(),
    RMSNorm(6, 1e-5),
    Residual(nn.Linear(6, 6), nn.Sigmoid(), Residual(nn.SiLU())),
    nn.ReLU(),
    nn.Linear(6, 3),
)

inp = json.load(open(sys.argv[1]))


def tensor(d):
    return torch.tensor(d["data"], dtype=torch.float32).reshape(d["shape"])


model.load_state_dict({name: tensor(d) for name, d in inp["params"].items()}, strict=True)
x = tensor(inp["x"]).reshape(-1, 2, 9, 8).requires_grad_(True)
out = model(x)
(out * tensor(inp["r"])).sum().backward()
json.dump({
    "out": out.detach().reshape(-1).tolist(),
    "grads": {name: p.grad.reshape(-1).tolist() for name, p in model.named_parameters()},
    "input_grad": x.grad.reshape(-1).tolist(),
}, open(sys.argv[2], "w"))
