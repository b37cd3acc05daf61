"""Tiny Hugging Face checkpoints written in PyTorch, for hf_test.go.

LlamaForCausalLM and GPT2LMHeadModel are written out here under their
Hugging Face names and layouts (transformers is not needed): modeling_llama's
RMSNorm, half-split rotary embedding, grouped-query attention and SwiGLU;
modeling_gpt2's Conv1D (weights [in, out]), fused c_attn and tanh GELU.

  hf_checkpoint.py make ROOT
      writes ROOT/<case>/ (config.json, model.safetensors or shards and
      model.safetensors.index.json) and ROOT/cases.json: each case's token
      batch and the mean cross-entropy of its module on it, in float64.
  hf_checkpoint.py check DIR TOKENS_JSON OUT_JSON
      builds the module DIR/config.json describes, loads DIR's tensors with
      load_state_dict(strict=True) and writes their loss on the tokens and
      each tensor's dtype and shape.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.set_default_dtype(torch.float64)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
NAMES = {v: k for k, v in DTYPES.items()}


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim") or c["hidden_size"] // self.h
        self.theta = c.get("rope_theta", 10000.0)
        w = c["hidden_size"]
        self.q_proj = nn.Linear(w, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(w, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(w, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, w, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        inv = 1.0 / (self.theta ** (torch.arange(0, self.d, 2).double() / self.d))
        freqs = torch.outer(torch.arange(t).double(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, self.h * self.d))


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        w, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(w, i, bias=False)
        self.up_proj = nn.Linear(w, i, bias=False)
        self.down_proj = nn.Linear(i, w, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.mlp = LlamaMLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-6))


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = LlamaModel(c)
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, ids):
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h)
        h = self.model.norm(h)
        return F.linear(h, self.model.embed_tokens.weight if self.tied else self.lm_head.weight)


class Conv1D(nn.Module):
    """transformers' Conv1D: a linear map whose weight is [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w, self.h = c["n_embd"], c["n_head"]
        self.c_attn = Conv1D(3 * self.w, self.w)
        self.c_proj = Conv1D(self.w, self.w)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.c_attn(x).split(w, dim=2)
        split = lambda y: y.view(b, t, self.h, w // self.h).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.h)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, w))


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(4 * c["n_embd"], c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], 4 * c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # gelu_new


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c.get("layer_norm_epsilon", 1e-5)
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.mlp = GPT2MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c.get("layer_norm_epsilon", 1e-5))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.tied = c.get("tie_word_embeddings", True)
        if not self.tied:
            self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)

    def forward(self, ids):
        tr = self.transformer
        h = tr.wte(ids) + tr.wpe(torch.arange(ids.shape[1]))
        for block in tr.h:
            h = block(h)
        h = tr.ln_f(h)
        return F.linear(h, tr.wte.weight if self.tied else self.lm_head.weight)


def build(c):
    return {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}[c["model_type"]](c)


def loss(module, tokens):
    t = torch.tensor(tokens)
    logits = module(t[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1)).item()


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        b = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        raw = bytearray(b[8 + n + lo : 8 + n + hi])
        if e["dtype"] == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def save(module, c, out, dtype, shards):
    """Rounds module's parameters to dtype (the module keeps the rounded
    values) and saves them in Hugging Face's layout, in shards files."""
    os.makedirs(out)
    tensors = {}
    for name, p in module.state_dict().items():
        t = p.to(DTYPES[dtype])
        p.copy_(t.to(torch.float64))
        tensors[name] = t
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
        return
    weight_map, size = {}, 0
    per = -(-len(names) // shards)
    for i in range(shards):
        file = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = {n: tensors[n] for n in names[i * per : (i + 1) * per]}
        write_safetensors(os.path.join(out, file), part)
        for n, t in part.items():
            weight_map[n] = file
            size += t.numel() * t.element_size()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f, indent=2)


def randomise(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name and name.endswith("weight") or "ln_f.weight" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 16,
         "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
         "attention_bias": False, "mlp_bias": False, "rope_scaling": None, "tie_word_embeddings": False,
         "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "transformers_version": "4.44.0"}
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 256, "n_embd": 16, "n_layer": 2,
        "n_head": 2, "n_positions": 8, "n_ctx": 8, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
        "scale_attn_weights": True, "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32"}

# name: (config, dtype on disk, shards, pipetrain's dtype)
CASES = {
    "llama-f32": (LLAMA, "F32", 1, "float64"),
    "llama-bf16-sharded": (dict(LLAMA, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
                                torch_dtype="bfloat16"), "BF16", 3, "float32"),
    "gpt2-f32-sharded": (GPT2, "F32", 2, "float64"),
    "gpt2-f16": (dict(GPT2, torch_dtype="float16"), "F16", 1, "float32"),
}


def make(root):
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (3, 9)).tolist()
    out = []
    for name, (c, dtype, shards, pt_dtype) in CASES.items():
        module = build(c)
        randomise(module)
        with torch.no_grad():
            save(module, c, os.path.join(root, name), dtype, shards)
        out.append({"name": name, "dtype": pt_dtype, "loss": loss(module, tokens)})
    with open(os.path.join(root, "cases.json"), "w") as f:
        json.dump({"tokens": tokens, "cases": out}, f)


def check(d, tokens_json, out_json):
    c = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    module = build(c)
    module.load_state_dict({n: t.to(torch.float64) for n, t in tensors.items()}, strict=True)
    tokens = json.load(open(tokens_json))["tokens"]
    with torch.no_grad():
        l = loss(module, tokens)
    json.dump({"loss": l, "tensors": {n: [NAMES[t.dtype], list(t.shape)] for n, t in tensors.items()}}, open(out_json, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(*sys.argv[2:5])
