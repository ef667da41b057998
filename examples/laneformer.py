"""The Laneformer in plain PyTorch: one call = one decode step (batch 1, one token, one position).

Exactly the model of docs/laneformer.md. Tensors carry the lane axis first: the
residual stream is h[L, D] and every lane-batched weight is [L, rows, cols]. A static KV cache
lives in non-persistent buffers, so `state_dict()` holds exactly the published checkpoint keys.

`torch.fx` traces `forward`: the three helpers wrapped with `torch.fx.wrap` (RoPE, the KV-cache
write and attention over the cache) stay single graph nodes, since their bodies index with the
position tensor, which a symbolic trace cannot do. kogc's frontend knows them by name and
signature; everything else is ordinary torch calls.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LaneformerConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    num_hidden_layers: int = 3
    num_attention_heads: int = 8
    num_key_value_heads: int | None = 4
    intermediate_size: int = 128
    num_lanes: int = 2
    broadcast_delay: int = 1
    use_early_comm: bool = True
    use_comm: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_position_embeddings: int = 128
    replicated_rmsn_scale: bool = True
    lm_head_type: str = "replicate"
    pre_norm_lane_agg: bool = False
    sliding_window_n_layers: int = 0
    torch_dtype: str = "float32"
    extra: dict = field(default_factory=dict, repr=False)  # unknown config.json keys, kept for round trips

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def validate(self) -> None:
        """Raise ValueError naming the first field that does not describe a Laneformer we support."""
        c, L = self, self.num_lanes
        if L < 1:
            raise ValueError(f"num_lanes must be >= 1, got {L}")
        if c.hidden_size % c.num_attention_heads:
            raise ValueError(f"hidden_size {c.hidden_size} is not divisible by "
                             f"num_attention_heads {c.num_attention_heads}")
        if c.head_dim % 2:
            raise ValueError(f"head_dim {c.head_dim} must be even for RoPE")
        for name, v in (("num_attention_heads", c.num_attention_heads), ("num_key_value_heads", c.kv_heads),
                        ("intermediate_size", c.intermediate_size)):
            if v % L:
                raise ValueError(f"{name} {v} is not divisible by num_lanes {L}")
        if c.num_attention_heads % c.kv_heads:
            raise ValueError(f"num_attention_heads {c.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {c.kv_heads}")
        if c.broadcast_delay < 1:
            raise ValueError(f"broadcast_delay must be >= 1, got {c.broadcast_delay}")
        if c.lm_head_type != "replicate":
            raise ValueError(f"lm_head_type {c.lm_head_type!r} is not supported (only 'replicate')")
        if c.pre_norm_lane_agg:
            raise ValueError("pre_norm_lane_agg=true is another model; only false is supported")
        if c.sliding_window_n_layers:
            raise ValueError("sliding_window_n_layers must be 0; sliding-window layers are another model")
        if c.torch_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"torch_dtype {c.torch_dtype!r} is not one of float32, float16, bfloat16")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}

    @classmethod
    def from_json(cls, d: dict) -> "LaneformerConfig":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})


PRESETS = {
    # a few layers, a small vocabulary: a step takes milliseconds on CPU
    "tiny": LaneformerConfig(),
    "laneformer-2b": LaneformerConfig(
        vocab_size=128256, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, intermediate_size=8192, num_lanes=8, broadcast_delay=1,
        max_position_embeddings=8192, torch_dtype="float16"),
    # scaling presets for benchmarks (same family, about 0.5B and 7B parameters)
    "laneformer-0.5b": LaneformerConfig(
        vocab_size=128256, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, intermediate_size=4096, num_lanes=8, broadcast_delay=1,
        max_position_embeddings=8192, torch_dtype="float16"),
    "laneformer-7b": LaneformerConfig(
        vocab_size=32000, hidden_size=4096, num_hidden_layers=28, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=16384, num_lanes=8, broadcast_delay=1,
        max_position_embeddings=8192, torch_dtype="float16"),
}


# ---------------------------------------------------------------- helpers kept whole by torch.fx

def rope_interleaved(x: torch.Tensor, pos: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """x [L, n*hd]: rotate pairs (x[2j], x[2j+1]) of every head by pos * theta^(-2j/hd)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim))
    ang = pos.to(torch.float32) * inv_freq
    cos, sin = torch.cos(ang), torch.sin(ang)
    xp = x.float().unflatten(-1, (-1, head_dim // 2, 2))
    x0, x1 = xp[..., 0], xp[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-3).to(x.dtype)


def kv_cache_write(cache: torch.Tensor, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """cache [L, kv, S, hd], x [L, kv*hd]: store x at position pos, in place; returns the cache."""
    # index_copy_ with a device index: no host synchronisation, so a CUDA graph can capture it
    cache.index_copy_(2, pos.reshape(1), x.unflatten(-1, (cache.shape[1], 1, cache.shape[3])))
    return cache


def gqa_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """q [L, nq*hd]; caches [L, kv, S, hd]: each query head attends over positions 0..pos of its KV head."""
    L, kv, S, hd = k_cache.shape
    qh = q.float().unflatten(-1, (kv, -1, hd))                   # [L, kv, group, hd]
    scores = torch.einsum("lkgd,lksd->lkgs", qh, k_cache.float()) * hd ** -0.5
    valid = torch.arange(S, device=q.device) <= pos
    scores = scores.masked_fill(~valid, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("lkgs,lksd->lkgd", probs, v_cache.float())
    return out.flatten(1).to(q.dtype)


for _fn in ("rope_interleaved", "kv_cache_write", "gqa_attention"):
    torch.fx.wrap(_fn)


# ---------------------------------------------------------------- modules

class LaneLinear(nn.Module):
    """One weight per lane, weight [L, out, in]: y[l] = W[l] @ x[l]."""

    def __init__(self, lanes: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(lanes, out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("lnk,lk->ln", self.weight, x)


class LaneRMSNorm(nn.Module):
    """rmsnorm over the model width, scale [D] shared by lanes (`weight`) or one per lane (`scale`)."""

    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        self.eps, self.dim = cfg.norm_eps, cfg.hidden_size
        if cfg.replicated_rmsn_scale:
            self.weight = nn.Parameter(torch.ones(cfg.hidden_size))
        else:
            self.scale = nn.Parameter(torch.ones(cfg.num_lanes, cfg.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.weight if hasattr(self, "weight") else self.scale
        return F.rms_norm(x, (self.dim,), eps=self.eps) * g


class Attention(nn.Module):
    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        L, hd = cfg.num_lanes, cfg.head_dim
        self.head_dim, self.theta = hd, cfg.rope_theta
        self.wq = LaneLinear(L, cfg.num_attention_heads * hd // L, cfg.hidden_size)
        self.wk = LaneLinear(L, cfg.kv_heads * hd // L, cfg.hidden_size)
        self.wv = LaneLinear(L, cfg.kv_heads * hd // L, cfg.hidden_size)
        self.wo = LaneLinear(L, cfg.hidden_size, cfg.num_attention_heads * hd // L)
        cache_shape = (L, cfg.kv_heads // L, cfg.max_position_embeddings, hd)
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)

    def forward(self, a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = rope_interleaved(self.wq(a), pos, self.head_dim, self.theta)
        k = rope_interleaved(self.wk(a), pos, self.head_dim, self.theta)
        k_cache = kv_cache_write(self.k_cache, k, pos)
        v_cache = kv_cache_write(self.v_cache, self.wv(a), pos)
        return self.wo(gqa_attention(q, k_cache, v_cache, pos))


class FeedForward(nn.Module):
    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        L, D, Fl = cfg.num_lanes, cfg.hidden_size, cfg.intermediate_size // cfg.num_lanes
        self.w1, self.w3, self.w2 = LaneLinear(L, Fl, D), LaneLinear(L, Fl, D), LaneLinear(L, D, Fl)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(m)) * self.w3(m))


class Layer(nn.Module):
    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        self.attention, self.feed_forward = Attention(cfg), FeedForward(cfg)
        self.attention_norm, self.ffn_norm = LaneRMSNorm(cfg), LaneRMSNorm(cfg)


class Body(nn.Module):
    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = LaneRMSNorm(cfg)


class Laneformer(nn.Module):
    def __init__(self, cfg: LaneformerConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def reduce(self, X: list[torch.Tensor], i: int) -> torch.Tensor:
        """R(X, i, .) for all lanes at once: X[i] is [L, D], the sublayer outputs of layer i."""
        c, L = self.config, self.config.num_lanes
        if i < c.broadcast_delay:
            if c.use_early_comm:
                return X[i].sum(0, keepdim=True).expand(L, -1)
            return math.sqrt(L) * X[i]
        if not c.use_comm:
            return math.sqrt(L) * X[i]
        old = X[i - c.broadcast_delay]
        return X[i] + (old.sum(0, keepdim=True) - old)

    def forward(self, token: torch.Tensor, pos: torch.Tensor):
        """token, pos: int64 scalars. Returns (logits [V], next token = argmax)."""
        L, D = self.config.num_lanes, self.config.hidden_size
        h = self.model.tok_embeddings(token).expand(L, D)
        A, M = [], []
        for i, layer in enumerate(self.model.layers):
            A.append(layer.attention(layer.attention_norm(h), pos))
            h = h + self.reduce(A, i)
            M.append(layer.feed_forward(layer.ffn_norm(h)))
            h = h + self.reduce(M, i)
        x = self.model.norm(h).mean(0)
        logits = self.lm_head(x)
        return logits, torch.argmax(logits)

    def reset_cache(self) -> None:
        for layer in self.model.layers:
            layer.attention.k_cache.zero_()
            layer.attention.v_cache.zero_()


# ---------------------------------------------------------------- construction and checkpoints

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def init_random(model: Laneformer, seed: int = 0) -> Laneformer:
    """Fresh random weights with activations of order one (so fp16 stays finite over many layers).
    Each parameter's numbers are torch.randn's for its shape, drawn into one reused fp32 buffer and
    rounded into the parameter's dtype: no fp32 copy of the model is made (laneformer-7b: 28 GB)."""
    gen = torch.Generator().manual_seed(seed)
    scratch = torch.empty(max(p.numel() for p in model.parameters()))
    for name, p in model.named_parameters():
        vals = scratch[:p.numel()].view(p.shape).normal_(generator=gen)
        if name.endswith(("norm.weight", "norm.scale")):
            vals.mul_(0.1).add_(1.0)
        else:
            vals.div_(math.sqrt(p.shape[-1]))
        with torch.no_grad():
            p.copy_(vals)
    return model


def build(cfg: LaneformerConfig, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
          seed: int | None = 0) -> Laneformer:
    """A Laneformer on `device`; random weights from `seed` (None: leave uninitialised, e.g. on meta)."""
    dtype = dtype or DTYPES[cfg.torch_dtype]
    if seed is None:
        with torch.device(device):
            model = Laneformer(cfg)
        return model.to(dtype=dtype).requires_grad_(False)
    with torch.device("meta"):      # shapes first, then memory in the model's dtype only
        model = Laneformer(cfg)
    model = model.to(dtype=dtype).to_empty(device="cpu")
    model.reset_cache()
    init_random(model, seed)
    return model.to(device=device).requires_grad_(False)


def save_checkpoint(model: Laneformer, directory: str) -> None:
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(model.config.to_json(), f, indent=2)


def load_checkpoint(directory: str, device: str = "cpu", dtype: torch.dtype | None = None,
                    max_len: int | None = None) -> Laneformer:
    """Load `config.json` + `*.safetensors`; ValueError naming any key or shape that does not fit. max_len:
    positions of the KV cache instead of the config's max_position_embeddings."""
    from safetensors.torch import load_file
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        raise ValueError(f"checkpoint {directory}: no config.json there")
    with open(config) as f:
        cfg = LaneformerConfig.from_json(json.load(f))
    if max_len:
        cfg = dataclasses.replace(cfg, max_position_embeddings=max_len)
    model = build(cfg, device="meta", dtype=dtype, seed=None)
    tensors = {}
    for fname in sorted(os.listdir(directory)):
        if fname.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(directory, fname)))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory} does not fit its config: missing keys {missing[:3]}"
                         f"{'...' if len(missing) > 3 else ''}, unexpected keys {unexpected[:3]}")
    for k, v in expected.items():
        if tuple(tensors[k].shape) != tuple(v.shape):
            raise ValueError(f"checkpoint {directory}: {k} has shape {list(tensors[k].shape)}, "
                             f"the config needs {list(v.shape)}")
    model = model.to_empty(device=device).requires_grad_(False)
    model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in tensors.items()})
    model.reset_cache()
    return model


def kogc_model(preset: str | None = None, checkpoint: str | None = None, device: str = "cpu",
               dtype: torch.dtype | None = None, seed: int | None = 0, **overrides) -> Laneformer:
    """The entry point kogc's CLI looks for: a model from a preset (random weights) or a checkpoint. Overrides
    are config fields (a preset's only), and max_len, the positions of the KV cache (max_position_embeddings)."""
    max_len = overrides.pop("max_len", None)
    if checkpoint:
        if overrides:
            raise ValueError(f"checkpoint {checkpoint}: its config.json sets {', '.join(sorted(overrides))}; "
                             f"they cannot be overridden")
        return load_checkpoint(checkpoint, device=device, dtype=dtype, max_len=max_len)
    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    if max_len:
        overrides["max_position_embeddings"] = max_len
    cfg = dataclasses.replace(PRESETS[preset], **overrides)
    model = build(cfg, device=device, dtype=dtype, seed=seed)
    # the preset's placement profiles hold its task times: a longer or shorter cache changes no task
    if cfg == dataclasses.replace(PRESETS[preset], max_position_embeddings=cfg.max_position_embeddings):
        profiles = placement_profiles(preset)
        if profiles:      # kogc.compile places with the one of its target and tile size, if any
            model.kogc_placement = profiles
    return model


PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")


def placement_profiles(preset: str) -> list[dict]:
    """The placement profiles shipped for a preset, one per target and weight format
    (profiles/<preset>.<target>[.<weights>].json: the mean task bodies of a `kogc bench --profile` run, and
    the placement settings a sweep chose where they are not the defaults: the lane groups' offset, lane homes,
    the context attention is priced at, the hop latency), as kogc's placement reads them."""
    out = []
    for name in sorted(os.listdir(PROFILES)) if os.path.isdir(PROFILES) else []:
        if name.startswith(preset + ".") and name.endswith(".json"):
            with open(os.path.join(PROFILES, name)) as f:
                d = json.load(f)
            if d.get("model") == preset:
                out.append({k: d[k] for k in ("target", "tile_bytes", "weights", "kind_us", "lane_group_stagger",
                                               "lane_homes", "cost_context", "place_latency_us") if k in d})
    return out
