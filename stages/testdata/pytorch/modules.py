import math

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """pipetrain's mlp: fc0 ... fc<n>, the activation after all but the last."""

    def __init__(self, sizes, activation="relu"):
        super().__init__()
        self.n = len(sizes) - 1
        for i in range(self.n):
            setattr(self, f"fc{i}", nn.Linear(sizes[i], sizes[i + 1]))
        self.act = {"relu": F.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[activation]

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n - 1:
                x = self.act(x)
        return x


class CNN(nn.Module):
    """pipetrain's cnn: per conv layer a 3x3 conv (padding 1), ReLU and 2x2
    max pool; then fc on the flattened (C, H, W) features."""

    def __init__(self, pixels, channels, classes):
        super().__init__()
        self.side = math.isqrt(pixels)
        self.n = len(channels)
        c, h = 1, self.side
        for i, out in enumerate(channels):
            setattr(self, f"conv{i}", nn.Conv2d(c, out, 3, padding=1))
            c, h = out, h // 2
        self.fc = nn.Linear(c * h * h, classes)

    def forward(self, x):  # x: (batch, pixels)
        x = x.view(-1, 1, self.side, self.side)
        for i in range(self.n):
            x = F.max_pool2d(F.relu(getattr(self, f"conv{i}")(x)), 2)
        return self.fc(x.flatten(1))


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, w = x.shape
        split = lambda y: y.view(b, t, self.heads, w // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, w))


class FeedForward(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = FeedForward(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """pipetrain's gpt; tied, the head multiplies by tok_emb.weight and has no
    weight of its own."""

    def __init__(self, vocab, context, width, heads, layers, tie_embeddings=False):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = None if tie_embeddings else nn.Linear(width, vocab, bias=False)

    def forward(self, idx):  # idx: (batch, context) token ids
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.tok_emb.weight.t() if self.head is None else self.head(x)


def from_spec(spec):
    """The module of a pipetrain model spec: the model section of a config,
    as `pipetrain export` records it in the file's metadata (model_spec)."""
    if spec["name"] == "mlp":
        return MLP([spec["input"], *(spec.get("hidden") or []), spec["classes"]], spec.get("activation") or "relu")
    if spec["name"] == "cnn":
        return CNN(spec["input"], spec["channels"], spec["classes"])
    if spec["name"] == "gpt":
        return GPT(spec["vocab"], spec["context"], spec["width"], spec["heads"], spec["layers"], spec.get("tie_embeddings", False))
    raise ValueError(f"unknown model {spec['name']}")
