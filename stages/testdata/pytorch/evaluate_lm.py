"""Computes `pipetrain evaluate`'s figures for a language model from its
weights and a nanoGPT token file (raw little-endian uint16):

    evaluate_lm.py EXPORT VAL_TOKENS OUT_JSON
        a `pipetrain export` file, its module built from the metadata
        (model_spec) as modules.from_spec builds it;
    evaluate_lm.py hf DIR CONTEXT VAL_TOKENS OUT_JSON
        a Hugging Face directory of hf_checkpoint.py's (a Llama or a GPT-2),
        its module built from DIR/config.json, in float64, on windows of
        CONTEXT.

Each module loads its weights with load_state_dict(strict=True); OUT_JSON
gets loss, perplexity, accuracy and tokens as validation_loss computes them:
the function docs/weights.md gives."""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import modules
import safetensors_io as st


def validation_loss(model, tokens, context, batch=64):
    """pipetrain evaluate's figures for a language model on tokens (a 1-D
    tensor of token ids): windows of context+1 consecutive tokens, window i
    being tokens[i*context : i*context + context + 1] (each overlaps the next
    by one token), the last partial window dropped; returns the mean
    cross-entropy over every predicted token, its exp (the perplexity), the
    share of tokens whose most likely prediction is right, and their count."""
    windows = (len(tokens) - 1) // context
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for first in range(0, windows, batch):
            w = torch.stack([tokens[i * context : i * context + context + 1] for i in range(first, min(first + batch, windows))]).long()
            logits = model(w[:, :-1]).flatten(0, 1)
            targets = w[:, 1:].flatten()
            total += F.cross_entropy(logits.double(), targets, reduction="sum").item()
            correct += (logits.argmax(-1) == targets).sum().item()
            count += targets.numel()
    loss = total / count
    return loss, math.exp(loss), correct / count, count


def read_tokens(val):
    return torch.from_numpy(np.fromfile(val, dtype=np.uint16).astype(np.int64))


def write(out, loss, perplexity, accuracy, count):
    with open(out, "w") as f:
        json.dump({"loss": loss, "perplexity": perplexity, "accuracy": accuracy, "tokens": count}, f)


def main_hf(d, context, val, out):
    import hf_checkpoint as hf  # sets float64 as torch's default dtype

    torch.set_num_threads(1)
    c = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(hf.read_safetensors(os.path.join(d, f)))
    model = hf.build(c)
    model.load_state_dict({n: t.to(torch.float64) for n, t in tensors.items()}, strict=True)
    write(out, *validation_loss(model, read_tokens(val), int(context)))


def main(export, val, out):
    torch.set_num_threads(1)
    weights, meta = st.load(export)
    spec = json.loads(meta["model_spec"])
    model = modules.from_spec(spec).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights, strict=True)
    write(out, *validation_loss(model, read_tokens(val), spec["context"]))


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        main_hf(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
