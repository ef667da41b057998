"""The Megatron-style tensor-parallel baseline on G GPUs: a Llama-shaped decoder of the preset's sizes
(heads, KV heads and MLP split over the ranks, the LM head by vocabulary), an NCCL all-reduce after
the attention output and after the MLP, the whole step in ONE CUDA graph per rank. Random weights:
it times the shape, not a model (one lane: a Laneformer's lanes only change how its sums are made).
Run inside a process group of G ranks, one GPU each."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def tp_graph_step(cfg, context: int, device: str, seed: int = 0):
    """`run(i)` replaying one decode step of the TP=world stack (one CUDA graph), and its weight bytes
    per GPU. cfg: the preset's config (hidden_size, num_hidden_layers, heads, intermediate_size,
    vocab_size, max_position_embeddings)."""
    import torch.distributed as dist
    W = dist.get_world_size()
    D, NL, H, KV = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.kv_heads
    FF, V = cfg.intermediate_size, cfg.vocab_size
    if H % W or KV % W or FF % W:
        raise ValueError(f"heads {H}, KV heads {KV} and MLP width {FF} must split over {W} GPUs")
    hd, h_, kv_, f_ = D // H, H // W, KV // W, FF // W
    ctx = min(cfg.max_position_embeddings, context + 256)
    gen = torch.Generator(device=device).manual_seed(seed + dist.get_rank())
    dt = torch.float16

    def mk(*s):
        return torch.randn(*s, device=device, dtype=dt, generator=gen) / math.sqrt(s[-1])
    wqkv = [mk((h_ + 2 * kv_) * hd, D) for _ in range(NL)]
    wo = [mk(D, h_ * hd) for _ in range(NL)]
    w13 = [mk(2 * f_, D) for _ in range(NL)]
    w2 = [mk(D, f_) for _ in range(NL)]
    emb, head = mk(V, D), mk(V // W, D)
    kc = torch.zeros(NL, kv_, ctx, hd, device=device, dtype=dt)
    vc = torch.zeros_like(kc)
    mask = torch.full((ctx,), float("-inf"), device=device, dtype=dt)
    mask[:context + 1] = 0
    ones = torch.ones(D, device=device, dtype=dt)
    tok = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.tensor([context], device=device)

    def step():
        x = emb[tok]
        for i in range(NL):
            h = F.rms_norm(x, (D,), ones)
            q, k, v = (h @ wqkv[i].t()).split([h_ * hd, kv_ * hd, kv_ * hd], -1)
            kc[i].index_copy_(1, pos, k.view(kv_, 1, hd))
            vc[i].index_copy_(1, pos, v.view(kv_, 1, hd))
            o = F.scaled_dot_product_attention(q.view(1, h_, 1, hd), kc[i][None], vc[i][None],
                                               attn_mask=mask[None, None, None], enable_gqa=True)
            a = o.reshape(1, -1) @ wo[i].t()
            dist.all_reduce(a)
            x = x + a
            h = F.rms_norm(x, (D,), ones)
            g, u = (h @ w13[i].t()).chunk(2, -1)
            m = (F.silu(g) * u) @ w2[i].t()
            dist.all_reduce(m)
            x = x + m
        lg = F.rms_norm(x, (D,), ones) @ head.t()
        best = lg.max(-1).values
        dist.all_reduce(best, op=dist.ReduceOp.MAX)      # the token's exchange: one more collective

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        step()
    nbytes = sum(t.numel() * 2 for t in wqkv + wo + w13 + w2 + [head])
    return (lambda i: graph.replay()), nbytes
