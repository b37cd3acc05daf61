"""The GPT of configs/gpt-small-4stage.yaml written plainly in PyTorch and
trained the way `pipetrain reference` trains it: byte vocabulary 256, context
64, width 64, 4 heads, 4 pre-norm blocks, the head tied to the token
embedding; the global batch split into micro-batches with their gradients
summed, the loss the mean of the micro-batch losses; Adam. Prints one JSON
line: the median step time over the steps after the warm-up, and samples/s
(a sample is one window of `context` tokens).

    python3 bench/pytorch/gpt.py --batch 32 --micro-batches 4 --steps 40 --skip 10 --threads 1

Random byte windows stand in for the text corpus: the time of a step does
not depend on the tokens, and pipetrain's own data feed is timed separately.
"""
import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import lmtrain

# The model of configs/gpt-small-4stage.yaml: embedding 256x64 + positions
# 64x64, 4 blocks of 49,984 (2 LayerNorms, q, k, v and output projections
# with bias, MLP 64-256-64), a final LayerNorm; the head has no parameters of
# its own.
EXPECTED_PARAMS = 220_544


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, eps=1e-5)
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def attn(self, x, mask):
        b, t, w = x.shape
        hd = w // self.heads
        # (b, heads, t, hd)
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, w)
        return self.proj(y)

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        # True above the diagonal: the positions a token may not attend to.
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        h = self.ln_f(x)
        return h @ self.tok.weight.t()  # tied head, no bias


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    lmtrain.add_run_args(p, batch=32, micro_batches=4, steps=40, skip=10, lr=0.003)
    a = p.parse_args()
    if a.steps <= a.skip:
        p.error("--steps must exceed --skip")

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT(a.vocab, a.context, a.width, a.heads, a.layers)
    n_params = sum(p.numel() for p in model.parameters())
    default_shape = (a.vocab, a.context, a.width, a.heads, a.layers) == (256, 64, 64, 4, 4)
    assert not default_shape or n_params == EXPECTED_PARAMS, f"{n_params} parameters, want {EXPECTED_PARAMS}"
    lmtrain.train_and_report(model, a, a.vocab, a.context)

if __name__ == "__main__":
    main()
