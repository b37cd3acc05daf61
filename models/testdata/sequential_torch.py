"""The sequential model of sequential_test.go written as a PyTorch nn.Sequential.

Reads the state_dict (loaded with strict=True, so the names must be exactly
the module's), the input batch, a weight matrix R and pipetrain's mask of
each dropout (by module name) from argv[1]; runs the model in training mode,
each dropout applying its given mask as F.dropout applies the one it draws
(the mask divided by 1 - p, times the input); writes the output and the
gradients of sum(output * R) with respect to every parameter and to the
input to argv[2].
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
    return Residual(nn.LayerNorm(6), nn.Linear(6, 6), nn.Tanh(), nn.Dropout(0.2), nn.Linear(6, 6, bias=False))


model = nn.Sequential(
    nn.Conv2d(2, 3, 3, stride=2, padding=1),
    nn.GELU(approximate="tanh"),
    nn.Dropout(0.4),
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
model.train()


def given_mask(mask):
    def hook(module, args, _):
        x = args[0]
        noise = torch.tensor(mask, dtype=x.dtype).reshape(x.shape).div_(1 - module.p)
        return x * noise
    return hook


dropouts = {name: m for name, m in model.named_modules() if isinstance(m, nn.Dropout)}
assert sorted(dropouts) == sorted(inp["masks"]), (sorted(dropouts), sorted(inp["masks"]))
for name, m in dropouts.items():
    m.register_forward_hook(given_mask(inp["masks"][name]))
x = tensor(inp["x"]).reshape(-1, 2, 9, 8).requires_grad_(True)
out = model(x)
(out * tensor(inp["r"])).sum().backward()
json.dump({
    "out": out.detach().reshape(-1).tolist(),
    "grads": {name: p.grad.reshape(-1).tolist() for name, p in model.named_parameters()},
    "input_grad": x.grad.reshape(-1).tolist(),
}, open(sys.argv[2], "w"))
