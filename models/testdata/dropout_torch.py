"""Dropout as torch.nn.functional.dropout computes it, given pipetrain's mask.

F.dropout draws its mask from PyTorch's generator; to compare the op, the
mask is pipetrain's, read from argv[1], and applied as F.dropout applies
its own in training: the mask in the input's dtype, divided by 1 - p, times
the input. Writes the output and the gradient of sum(output * R) with
respect to the input to argv[2].
"""
import json
import sys

import torch

inp = json.load(open(sys.argv[1]))
dtype = {"float32": torch.float32, "float64": torch.float64}[inp["dtype"]]
shape, p = inp["shape"], inp["p"]
x = torch.tensor(inp["x"], dtype=dtype).reshape(shape).requires_grad_(True)
noise = torch.tensor(inp["mask"], dtype=dtype).reshape(shape).div_(1 - p)
out = x * noise
(out * torch.tensor(inp["r"], dtype=dtype).reshape(shape)).sum().backward()
json.dump({"out": out.detach().reshape(-1).tolist(), "input_grad": x.grad.reshape(-1).tolist()}, open(sys.argv[2], "w"))
