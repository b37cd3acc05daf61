"""Runs torch.optim's own optimizer over the parameters and gradients a Go
test gives, and writes the parameters after every step.

Usage: torch_optim.py IN.json OUT.json

IN: {"name": "sgd" | "adam" | "adamw", "lr", "momentum", "beta1", "beta2",
"eps", "weight_decay", "decay_exclude": [patterns], "params": [{"name",
"shape", "data"}], "grads": [[flat gradient per parameter] per step],
"lrs": [learning rate per step]}.
OUT: [[flat parameter per parameter] per step], float32 values as numbers.

Weight decay goes to the parameters of one group, the others to a group
without decay, as nanoGPT's configure_optimizers builds them: by default
the parameters named *.weight of two dimensions or more decay; patterns in
decay_exclude (fnmatch) replace that rule.
"""

import fnmatch
import json
import sys

import torch


def decays(name, dims, exclude):
    if exclude:
        return not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    return dims >= 2 and (name == "weight" or name.endswith(".weight"))


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    params = [torch.tensor(p["data"], dtype=torch.float32).reshape(p["shape"]) for p in spec["params"]]
    for p in params:
        p.requires_grad_(True)
    wd, exclude = spec.get("weight_decay", 0.0), spec.get("decay_exclude") or []
    decayed = [p for p, d in zip(params, spec["params"]) if decays(d["name"], len(d["shape"]), exclude)]
    kept = [p for p, d in zip(params, spec["params"]) if not decays(d["name"], len(d["shape"]), exclude)]
    groups = [g for g in ({"params": decayed, "weight_decay": wd}, {"params": kept, "weight_decay": 0.0}) if g["params"]]
    name, lr = spec["name"], spec["lr"]
    if name == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=spec.get("momentum", 0.0))
    elif name == "adam":
        opt = torch.optim.Adam(groups, lr=lr, betas=(spec["beta1"], spec["beta2"]), eps=spec["eps"])
    elif name == "adamw":
        opt = torch.optim.AdamW(groups, lr=lr, betas=(spec["beta1"], spec["beta2"]), eps=spec["eps"])
    else:
        raise SystemExit("unknown optimizer " + name)
    out = []
    for step, grads in enumerate(spec["grads"]):
        for g in opt.param_groups:
            g["lr"] = spec["lrs"][step]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=torch.float32).reshape(p.shape)
        opt.step()
        out.append([p.detach().reshape(-1).tolist() for p in params])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
