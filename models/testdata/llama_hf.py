"""Hugging Face's LlamaForCausalLM written out in PyTorch, for llama_torch_test.go.

The formulas are those of transformers' modeling_llama.py: LlamaRMSNorm,
rotate_half and apply_rotary_pos_emb with LlamaRotaryEmbedding's inv_freq,
LlamaMLP, repeat_kv and eager attention with a causal mask. Reads the
config, the parameters under their Hugging Face names and layouts, the token
ids and a weight matrix R from argv[1]; writes the logits and the gradients
of sum(logits * R) with respect to every parameter to argv[2].
"""
import json
import math
import sys

import torch

torch.manual_seed(0)
inp = json.load(open(sys.argv[1]))
cfg = inp["config"]
B, L, H = cfg["batch"], cfg["context"], cfg["width"]
nh, nkv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
eps, theta, layers = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["layers"]


def tensor(d, grad):
    t = torch.tensor(d["data"], dtype=torch.float32).reshape(d["shape"])
    return t.requires_grad_(grad)


P = {name: tensor(d, True) for name, d in inp["params"].items()}
ids = torch.tensor(inp["ids"], dtype=torch.long).reshape(B, L)
R = tensor(inp["r"], False)


def rms_norm(h, weight):  # LlamaRMSNorm.forward
    h32 = h.to(torch.float32)
    variance = h32.pow(2).mean(-1, keepdim=True)
    h32 = h32 * torch.rsqrt(variance + eps)
    return weight * h32.to(h.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rotary(position_ids):  # LlamaRotaryEmbedding, default rope_type
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(h, n_rep):
    b, kvh, s, d = h.shape
    if n_rep == 1:
        return h
    h = h[:, :, None, :, :].expand(b, kvh, n_rep, s, d)
    return h.reshape(b, kvh * n_rep, s, d)


def linear(h, name):
    return torch.nn.functional.linear(h, P[name])


def attention(h, pre, cos, sin):  # LlamaAttention with eager_attention_forward
    q = linear(h, pre + "q_proj.weight").view(B, L, nh, hd).transpose(1, 2)
    k = linear(h, pre + "k_proj.weight").view(B, L, nkv, hd).transpose(1, 2)
    v = linear(h, pre + "v_proj.weight").view(B, L, nkv, hd).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    w = torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5)
    mask = torch.full((L, L), float("-inf")).triu(1)
    w = torch.nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    o = torch.matmul(w, v).transpose(1, 2).reshape(B, L, nh * hd)
    return linear(o, pre + "o_proj.weight")


def mlp(h, pre):  # LlamaMLP
    gate = torch.nn.functional.silu(linear(h, pre + "gate_proj.weight"))
    return linear(gate * linear(h, pre + "up_proj.weight"), pre + "down_proj.weight")


cos, sin = rotary(torch.arange(L)[None, :].expand(B, L))
h = torch.nn.functional.embedding(ids, P["model.embed_tokens.weight"])
for i in range(layers):
    pre = "model.layers.%d." % i
    h = h + attention(rms_norm(h, P[pre + "input_layernorm.weight"]), pre + "self_attn.", cos, sin)
    h = h + mlp(rms_norm(h, P[pre + "post_attention_layernorm.weight"]), pre + "mlp.")
h = rms_norm(h, P["model.norm.weight"])
head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
logits = torch.nn.functional.linear(h, head).reshape(B * L, -1)
(logits * R).sum().backward()
out = {"logits": logits.detach().flatten().tolist(),
       "grads": {n: p.grad.flatten().tolist() for n, p in P.items()}}
json.dump(out, open(sys.argv[2], "w"))
