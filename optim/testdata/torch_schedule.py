"""Steps torch.optim.lr_scheduler's schedulers through a run and writes the
learning rate each optimizer step used.

Usage: torch_schedule.py IN.json OUT.json

IN: {"kind", "lr", "warmup_steps", "min_lr", "decay_steps", "step_size",
"gamma", "steps"}, as optim.Schedule (decay_steps resolved).
OUT: [learning rate of step s for s in 0..steps-1].

The warmup is LinearLR from 1/(W+1) to 1 over W steps, then SequentialLR
hands over to CosineAnnealingLR (T_max D - W), LinearLR (1 to min_lr/lr
over D - W steps) or StepLR; constant is the warmup alone.
"""

import json
import sys

import torch
from torch.optim import lr_scheduler as sched


def main():
    with open(sys.argv[1]) as f:
        s = json.load(f)
    lr, warmup = s["lr"], s.get("warmup_steps", 0)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    kind = s["kind"]
    span = s.get("decay_steps", 0) - warmup
    after = None
    if kind == "cosine":
        after = sched.CosineAnnealingLR(opt, T_max=span, eta_min=s.get("min_lr", 0.0))
    elif kind == "linear":
        after = sched.LinearLR(opt, start_factor=1.0, end_factor=s.get("min_lr", 0.0) / lr, total_iters=span)
    elif kind == "step":
        after = sched.StepLR(opt, step_size=s["step_size"], gamma=s["gamma"])
    elif kind != "constant":
        raise SystemExit("unknown kind " + kind)
    parts = []
    if warmup > 0:
        parts.append(sched.LinearLR(opt, start_factor=1.0 / (warmup + 1), end_factor=1.0, total_iters=warmup))
    if after is not None:
        parts.append(after)
    if len(parts) == 2:
        scheduler = sched.SequentialLR(opt, parts, milestones=[warmup])
    elif parts:
        scheduler = parts[0]
    else:
        scheduler = None
    out = []
    for _ in range(s["steps"]):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if scheduler is not None:
            scheduler.step()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
