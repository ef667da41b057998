"""A hand-written decode step of a model's shapes: the strongest baseline kogc is timed against.

A plain Llama-shaped step with the model's sizes (one lane: a Laneformer's lanes change how its sums are
made, not the bytes): fused QKV and gate/up matrices, F.rms_norm, SDPA over a KV cache trimmed to the
positions in use (a sliding window's layer over its window), the LM head and its maximum; random fp16 weights (it times the shape, not a model).
The model's forms where they change the work: F.layer_norm (GPT-NeoX, Phi, StableLM, Starcoder2, GPT-2, OPT), a
plain MLP act(W1 h) then W2, attention and MLP in parallel from one residual, a learned position embedding.
`kogc bench` replays it in ONE CUDA graph, alone and after torch.compile; `kogc bench --gpus G` runs it
Megatron-style on G ranks (heads, KV heads and MLP split, the LM head by vocabulary, an all-reduce after
the attention output and after the MLP: kogc.bench.tp)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ir.executor import xielu
from ..scheduler.fuse import ACT_STORE, CACHE, GATED_KINDS, LAYERNORM, RMSNORM, ROPE_CACHE, ROPE_STORE


@dataclass(frozen=True)
class Shapes:
    hidden: int
    layers: int
    heads: int          # query heads, all lanes
    kv_heads: int       # all lanes
    head_dim: int
    ffn: int            # MLP width, all lanes
    vocab: int
    qkv_bias: bool = False   # Q, K and V with a bias (Qwen2)
    qk_norm: bool = False    # q and k normed per head before RoPE (Qwen3)
    act: str = "silu"        # the MLP's activation: silu, gelu, gelu_tanh (Gemma), relu (OPT), relu2 (Nemotron) or
                             # xielu (Apertus)
    windows: tuple = ()      # per layer, a sliding window's positions (0: all); () for none
    layer_norm: bool = False  # F.layer_norm (weight and bias) instead of F.rms_norm
    gated: bool = True       # act(gate) * up; False: a plain MLP, act(W1 h)
    parallel: bool = False   # x + attention(norm(x)) + MLP(norm(x)) (GPT-NeoX, Phi)
    pos_embed: bool = False  # a learned position embedding added to the token's (GPT-2, OPT)


def shapes_of(schedule) -> Shapes:
    """The model's sizes from its scheduled fused ops (whatever wrote the model: the IR is the same)."""
    att = [op for op in schedule.ops if op.kind == "attention"]
    # the MLP's width (and its gated kind): W1/W3 pairs' rows, or W2's inputs where it forms act(gate) * up itself
    mvs = [op for op in schedule.ops if op.kind == "matvec"]
    mlp = [(op.p["n"], op.p["epilogue"]) for op in mvs if op.p["epilogue"] in GATED_KINDS] or \
        [(op.p["k"], op.p["prologue"]) for op in mvs if op.p["prologue"] in GATED_KINDS]
    plain = [op for op in mvs if op.p["epilogue"] in ACT_STORE.values()]      # a plain MLP's first matvec
    if not mlp and plain:
        mlp = [(op.p["n"], op.p["epilogue"]) for op in plain]
    head = [op for op in schedule.ops if op.kind == "matvec" and op.p["epilogue"] == "store_argmax"]
    emb = [op for op in schedule.ops if op.kind == "embed"]
    if not (att and mlp and head and emb):
        raise ValueError("a hand-written step needs attention, an MLP, an LM head and an embedding")
    a = att[0]
    lanes = max(a.lanes, 1)
    # parallel: the MLP's first matvec normalizes the residual attention's projections read (no add between)
    normed = {op.p["x"] for op in mvs if op.p["prologue"] in (RMSNORM, LAYERNORM) and op.p["epilogue"] in
              (ROPE_CACHE, ROPE_STORE, CACHE)}
    first_mlp = plain or [op for op in mvs if op.p["epilogue"] in GATED_KINDS]
    return Shapes(hidden=head[0].p["k"], layers=len(att), heads=a.p["kv_heads"] * a.p["group"] * lanes,
                  kv_heads=a.p["kv_heads"] * lanes, head_dim=a.p["head_dim"], ffn=mlp[0][0] * lanes,
                  vocab=head[0].p["n"], qkv_bias=any(op.kind == "matvec" and op.p["bias"] for op in schedule.ops),
                  qk_norm=any(op.kind == "head_norm" for op in schedule.ops),
                  act=mlp[0][1].removesuffix("_mul").removesuffix("_store"),
                  windows=tuple(op.p.get("window", 0) for op in att) if any(op.p.get("window") for op in att) else (),
                  layer_norm=any(op.p["prologue"] == LAYERNORM for op in mvs), gated=not plain,
                  parallel=bool(first_mlp) and first_mlp[0].p.get("x") in normed,
                  pos_embed=any(op.p.get("pos_table") for op in emb))


def shapes_of_model(model) -> Shapes:
    """A model's sizes: a Laneformer's from its config, any other decoder's from its fused ops (kogc.scheduler.fuse
    of its IR, without a schedule)."""
    from types import SimpleNamespace

    from ..frontend import to_ir
    from ..scheduler.fuse import fuse
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "kv_heads"):
        return shapes_of_config(cfg)
    return shapes_of(SimpleNamespace(ops=fuse(to_ir(model))))


def shapes_of_config(cfg) -> Shapes:
    """From a Laneformer config (hidden_size, num_hidden_layers, num_attention_heads, kv_heads,
    intermediate_size, vocab_size)."""
    return Shapes(cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.kv_heads,
                  cfg.hidden_size // cfg.num_attention_heads, cfg.intermediate_size, cfg.vocab_size)


def step_fn(s: Shapes, context: int, device: str, seed: int = 0, world: int = 1, rank: int = 0, all_reduce=None,
            dtype=torch.float16):
    """(step(), the weight bytes one rank reads per step): one decode step at position `context` of a
    random model of shapes `s`, this rank's share of `world` (all_reduce(t) sums t over the ranks;
    all_reduce(t, "max") takes the maximum)."""
    D, NL, H, KV, hd, FF, V = s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab
    if H % world or KV % world or FF % world or V % world:
        raise ValueError(f"heads {H}, KV heads {KV}, MLP width {FF} and vocabulary {V} must split over {world} ranks")
    h_, kv_, f_ = H // world, KV // world, FF // world
    ctx = context + 256          # the KV cache trimmed to the positions in use (and some room)
    gen = torch.Generator(device=device).manual_seed(seed + rank)

    def mk(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen) / math.sqrt(shape[-1])
    wqkv = [mk((h_ + 2 * kv_) * hd, D) for _ in range(NL)]
    bqkv = [mk((h_ + 2 * kv_) * hd) if s.qkv_bias else None for _ in range(NL)]
    wo = [mk(D, h_ * hd) for _ in range(NL)]
    w13 = [mk((2 if s.gated else 1) * f_, D) for _ in range(NL)]
    w2 = [mk(D, f_) for _ in range(NL)]
    emb, head = mk(V, D), mk(V // world, D)
    pemb = mk(ctx, D) if s.pos_embed else None
    kc = torch.zeros(NL, kv_, ctx, hd, device=device, dtype=dtype)
    vc = torch.zeros_like(kc)
    rows = {w: attended_rows(context, w, ctx, device, dtype) for w in set(s.windows or [0])}
    first, layer_masks = zip(*(rows[w] for w in s.windows or [0] * NL))
    ones = torch.ones(D, device=device, dtype=dtype)
    zeros = torch.zeros(D, device=device, dtype=dtype)
    ones_hd = torch.ones(hd, device=device, dtype=dtype)
    tok = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.tensor([context], device=device)
    reduce = all_reduce or (lambda t, op="sum": None)
    act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu,
           "relu2": lambda t: torch.square(F.relu(t)),
           # (Apertus's constants at their initial values: the work, not the values, is what is timed)
           "xielu": lambda t: xielu(t, dict(alpha_p=0.8, alpha_n=0.8, beta=0.5, eps=-1e-6))}[s.act]

    def norm(x):
        return F.layer_norm(x, (D,), ones, zeros) if s.layer_norm else F.rms_norm(x, (D,), ones)

    def mlp(h, i):
        if not s.gated:
            return act(h @ w13[i].t()) @ w2[i].t()
        g, u = (h @ w13[i].t()).chunk(2, -1)
        return (act(g) * u) @ w2[i].t()

    def step():
        x = emb[tok] + pemb[pos] if s.pos_embed else emb[tok]
        for i in range(NL):
            h = norm(x)
            q, k, v = F.linear(h, wqkv[i], bqkv[i]).split([h_ * hd, kv_ * hd, kv_ * hd], -1)
            if s.qk_norm:
                q, k = F.rms_norm(q.view(h_, hd), (hd,), ones_hd), F.rms_norm(k.view(kv_, hd), (hd,), ones_hd)
            kc[i].index_copy_(1, pos, k.view(kv_, 1, hd))
            vc[i].index_copy_(1, pos, v.view(kv_, 1, hd))
            lo = first[i]
            o = F.scaled_dot_product_attention(q.view(1, h_, 1, hd), kc[i][None, :, lo:], vc[i][None, :, lo:],
                                               attn_mask=layer_masks[i][None, None, None], enable_gqa=True)
            a = o.reshape(1, -1) @ wo[i].t()
            if s.parallel:      # (one all-reduce of both sublayers' sum)
                m = mlp(h, i) + a
                reduce(m)
                x = x + m
                continue
            reduce(a)
            x = x + a
            m = mlp(norm(x), i)
            reduce(m)
            x = x + m
        lg = norm(x) @ head.t()
        best = lg.max(-1).values
        reduce(best, "max")          # the token's exchange: one more collective
        return best

    nbytes = sum(t.numel() * t.element_size() for t in wqkv + wo + w13 + w2 + [head])
    return step, nbytes


def attended_rows(context: int, window: int, ctx: int, device: str, dtype) -> tuple[int, torch.Tensor]:
    """(first cache row, additive mask of the rows from there) for a layer attending positions 0..context, or
    with a sliding window of W its last W: the cache sliced from a multiple of 16 rows (so that the slice stays
    aligned for SDPA's kernels on the GPU), the mask of its own (a slice of a shared one at an odd row was not)."""
    start = max(0, context + 1 - window) if window else 0
    first = start // 16 * 16
    mask = torch.full((ctx - first,), float("-inf"), device=device, dtype=dtype)
    mask[start - first:context + 1 - first] = 0
    return first, mask


def graph_of(step, compiled: bool = False):
    """`run(i)` replaying `step` captured in ONE CUDA graph; compiled: torch.compile
    (mode="max-autotune-no-cudagraphs") first, the graph then being the one capture."""
    from .stacks import capture
    graph = capture(torch.compile(step, mode="max-autotune-no-cudagraphs") if compiled else step)
    return lambda i: graph.replay()


def handwritten_graph_step(shapes: Shapes, context: int, device: str, compiled: bool = False, seed: int = 0):
    """The bench's rows: the hand-written step of the model's shapes in one CUDA graph."""
    if device != "cuda":
        raise RuntimeError("CUDA graphs need a GPU")
    step, _ = step_fn(shapes, context, device, seed)
    return graph_of(step, compiled)
