"""Computes `pipetrain evaluate`'s figures for a language model from a
`pipetrain export` file and a nanoGPT token file (raw little-endian uint16):

    evaluate_lm.py EXPORT VAL_TOKENS OUT_JSON

The module is built from the export's metadata (model_spec) and loaded with
load_state_dict(strict=True); OUT_JSON gets loss, perplexity, accuracy and
tokens as validation_loss computes them: the function docs/weights.md gives."""
import json
import math
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


def main(export, val, out):
    torch.set_num_threads(1)
    weights, meta = st.load(export)
    spec = json.loads(meta["model_spec"])
    model = modules.from_spec(spec).to(next(iter(weights.values())).dtype)
    model.load_state_dict(weights, strict=True)
    tokens = torch.from_numpy(np.fromfile(val, dtype=np.uint16).astype(np.int64))
    loss, perplexity, accuracy, count = validation_loss(model, tokens, spec["context"])
    with open(out, "w") as f:
        json.dump({"loss": loss, "perplexity": perplexity, "accuracy": accuracy, "tokens": count}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
