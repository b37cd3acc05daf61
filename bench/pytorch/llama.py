"""The Llama of configs/bench-llama-10m.yaml written plainly in PyTorch, with
Hugging Face's LlamaForCausalLM formulas (LlamaRMSNorm, rotate_half rotary
embeddings, repeat_kv grouped-query attention with a causal mask, the
SwiGLU LlamaMLP, no biases), and trained the way `pipetrain reference`
trains it: the global batch split into micro-batches with their gradients
summed, the loss the mean of the micro-batch losses; Adam. Prints one JSON
line: the median step time over the steps after the warm-up, and samples/s
(a sample is one window of `context` tokens).

    python3 bench/pytorch/llama.py --batch 8 --micro-batches 2 --steps 12 --skip 4 --threads 1

Random byte windows stand in for the text corpus: the time of a step does
not depend on the tokens.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import lmtrain

# The model of configs/bench-llama-10m.yaml: embedding 256x384, 6 blocks of
# 1,573,632 (2 RMSNorm gains; q and o 384x384, k and v 384x128; gate and up
# 384x1024, down 1024x384), a final RMSNorm and an untied head 384x256.
EXPECTED_PARAMS = 9_638_784


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, width, heads, kv_heads, intermediate, eps):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, width // heads
        self.input_layernorm = RMSNorm(width, eps)
        self.q_proj = nn.Linear(width, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, width, bias=False)
        self.post_attention_layernorm = RMSNorm(width, eps)
        self.gate_proj = nn.Linear(width, intermediate, bias=False)
        self.up_proj = nn.Linear(width, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, width, bias=False)

    def attn(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (self.hd ** -0.5) + mask[:t, :t]
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab, context, width, heads, kv_heads, intermediate, layers, eps=1e-6, theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Block(width, heads, kv_heads, intermediate, eps) for _ in range(layers)])
        self.norm = RMSNorm(width, eps)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        hd = width // heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(context).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.full((context, context), float("-inf")).triu(1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.layers:
            x = blk(x, cos, sin, self.mask)
        return self.lm_head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    lmtrain.add_run_args(p, batch=8, micro_batches=2, steps=12, skip=4, lr=0.0003)
    a = p.parse_args()
    if a.steps <= a.skip:
        p.error("--steps must exceed --skip")

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Llama(a.vocab, a.context, a.width, a.heads, a.kv_heads, a.intermediate, a.layers)
    n_params = sum(p.numel() for p in model.parameters())
    default_shape = (a.vocab, a.context, a.width, a.heads, a.kv_heads, a.intermediate, a.layers) == (256, 256, 384, 6, 2, 1024, 6)
    assert not default_shape or n_params == EXPECTED_PARAMS, f"{n_params} parameters, want {EXPECTED_PARAMS}"
    lmtrain.train_and_report(model, a, a.vocab, a.context)

if __name__ == "__main__":
    main()
