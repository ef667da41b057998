"""A Llama decoder in one file, written the common way, not for kogc: complex-number RoPE
(`view_as_complex`), a KV-cache module updated by index assignment, `scaled_dot_product_attention`
with a causal mask and grouped-query heads repeated by `repeat_interleave`.

kogc captures it with torch.export and recognises these idioms over ATen ops (docs/frontend.md).
`kogc_model(...)` returns the decode step: forward(token, pos) -> (logits, next token).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int = 320
    dim: int = 96
    n_layers: int = 2
    n_heads: int = 6
    n_kv_heads: int = 2
    ffn_dim: int = 160
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 64
    tie_embeddings: bool = False
    qkv_bias: bool = False          # Q, K and V projections with a bias (Qwen2)
    qk_norm: bool = False           # an RMSNorm over each head of q and k before RoPE (Qwen3)
    head_dim: int = 0               # 0: dim // n_heads
    dtype: str = "float32"


PRESETS = {
    # widths and head counts that are not powers of two (3 query heads per KV head)
    "tiny": LlamaConfig(),
    # SmolLM2-135M's shapes: width 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, tied
    "smollm2-135m": LlamaConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                                rope_theta=100000.0, max_seq_len=8192, tie_embeddings=True, dtype="float16"),
    # Llama-3.2-1B's shapes (its RoPE without the long-context frequency scaling)
    "llama-3.2-1b": LlamaConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                                rope_theta=500000.0, max_seq_len=8192, tie_embeddings=True, dtype="float16"),
    # Qwen2.5-0.5B's shapes: width 896, 14 query / 2 KV heads of 64, MLP 4864, vocabulary 151936, biased Q/K/V, tied
    "qwen2.5-0.5b": LlamaConfig(vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864,
                                norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=8192, tie_embeddings=True,
                                qkv_bias=True, dtype="float16"),
    # Qwen2.5-1.5B's shapes: width 1536, 12 query / 2 KV heads of 128, MLP 8960, vocabulary 151936, biased Q/K/V, tied
    "qwen2.5-1.5b": LlamaConfig(vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, ffn_dim=8960,
                                norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=8192, tie_embeddings=True,
                                qkv_bias=True, dtype="float16"),
    # Llama-3.2-3B's shapes: width 3072, 24 query / 8 KV heads of 128, MLP 8192, tied (RoPE unscaled, as above)
    "llama-3.2-3b": LlamaConfig(vocab_size=128256, dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192,
                                rope_theta=500000.0, max_seq_len=8192, tie_embeddings=True, dtype="float16"),
    # Qwen3-0.6B's shapes: width 1024, 16 query / 8 KV heads of 128 (wider than the model), MLP 3072, vocabulary
    # 151936, q and k normed per head, tied
    "qwen3-0.6b": LlamaConfig(vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                              ffn_dim=3072, norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=8192,
                              tie_embeddings=True, qk_norm=True, dtype="float16"),
}


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(t, freqs))   # complex64 [end, hd/2]


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, hd]; freqs_cis [T, hd/2] complex."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class KVCache(nn.Module):
    def __init__(self, n_kv_heads: int, max_seq_len: int, head_dim: int, dtype):
        super().__init__()
        shape = (1, n_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """pos [T]; k, v [B, kv, T, hd]: written at their positions, in place."""
        self.k[:, :, pos] = k
        self.v[:, :, pos] = v
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim or c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=c.qkv_bias)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=c.qkv_bias)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=c.qkv_bias)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)
        self.cache = KVCache(c.n_kv_heads, c.max_seq_len, self.head_dim, getattr(torch, c.dtype))
        if c.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(self.head_dim, c.norm_eps), RMSNorm(self.head_dim, c.norm_eps)

    def forward(self, x, pos, freqs_cis, mask):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        keys, values = self.cache.update(pos, k, v)
        rep = self.n_heads // self.n_kv_heads
        keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attention, self.feed_forward = Attention(c), FeedForward(c)
        self.attention_norm, self.ffn_norm = RMSNorm(c.dim, c.norm_eps), RMSNorm(c.dim, c.norm_eps)

    def forward(self, x, pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("freqs_cis", None, persistent=False)
        self.register_buffer("causal_mask", None, persistent=False)
        self.compute_buffers()

    def compute_buffers(self) -> None:
        """The RoPE table and the causal mask, on the module's device (again after `to_empty`)."""
        c = self.config
        device = self.norm.weight.device
        with torch.device(device):
            self.freqs_cis = precompute_freqs_cis(c.head_dim or c.dim // c.n_heads, c.max_seq_len, c.rope_theta)
            self.causal_mask = torch.tril(torch.ones(c.max_seq_len, c.max_seq_len, dtype=torch.bool))

    def forward(self, token: torch.Tensor, pos: torch.Tensor):
        """token, pos: int64 scalars (one decode step). Returns (logits [V], the greedy next token)."""
        tokens, positions = token.reshape(1, 1), pos.reshape(1)
        x = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[positions]
        mask = self.causal_mask[None, None, positions]
        for layer in self.layers:
            x = layer(x, positions, freqs_cis, mask)
        logits = self.output(self.norm(x)).reshape(-1)
        return logits, torch.argmax(logits)

    def reset_cache(self) -> None:
        for layer in self.layers:
            layer.attention.cache.k.zero_()
            layer.attention.cache.v.zero_()


def build(c: LlamaConfig, device="cpu", dtype=None, seed: int | None = 0) -> Llama:
    """A Llama on `device` in `dtype`, with random weights from `seed`, or with seed=None zeros (what tracing
    needs is their shapes; on the meta device: shapes only, no memory). The model is made on meta, then given memory
    and its computed buffers: the layers' own default initialisation, overwritten anyway, is skipped. Each
    parameter's numbers are torch.randn's for its shape, drawn into one reused fp32 buffer, so no fp32 copy of
    the model is made (Llama-3.2-1B's shapes: 28 -> 9 s on 2 cores)."""
    dtype = dtype or getattr(torch, c.dtype)
    c = dataclasses.replace(c, dtype=str(dtype).removeprefix("torch."))     # (the KV cache's dtype too)
    with torch.device("meta"):
        model = Llama(c)
    if device == "meta":            # (Module.to(dtype) would also make the complex RoPE table real)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.requires_grad_(False)
    model.to_empty(device="cpu")
    if c.tie_embeddings:        # (to_empty gives each module its own tensor)
        model.output.weight = model.tok_embeddings.weight
    model.compute_buffers()
    model.reset_cache()
    if seed is None:
        for p in model.parameters():
            p.data = torch.zeros(p.shape, dtype=dtype)
    else:
        gen = torch.Generator().manual_seed(seed)
        scratch = torch.empty(max(p.numel() for p in model.parameters()))
        for name, p in model.named_parameters():
            vals = scratch[:p.numel()].view(p.shape).normal_(generator=gen)
            if name.endswith("norm.weight"):
                vals.mul_(0.1).add_(1.0)
            else:
                vals.div_(math.sqrt(p.shape[-1]))
            p.data = vals.to(dtype, copy=True)
    return model.to(device=device).requires_grad_(False)


def kogc_model(preset: str | None = None, checkpoint: str | None = None, device: str = "cpu",
               dtype: torch.dtype | None = None, seed: int | None = 0, **overrides) -> Llama:
    """The entry point kogc's CLI looks for: a model of a preset's shapes with random weights. `max_len`
    (kogc's --max-len) sets max_seq_len: the KV cache, and the positions eager attention reads."""
    if "max_len" in overrides:
        overrides["max_seq_len"] = overrides.pop("max_len")
    if checkpoint:
        raise ValueError("this example has no checkpoint format; for real Llama checkpoints use "
                         "`--model-dir` (transformers)")
    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return build(dataclasses.replace(PRESETS[preset], **overrides), device=device, dtype=dtype, seed=seed)
