"""An independent reference of the Laneformer (shared/design/LANEFORMER.md) against examples/laneformer.py.

`reference_step` is written straight from the spec's pseudo-code: explicit Python loops over
lanes and heads, float64 math, its own KV cache, and the checkpoint key names of the spec's
table. Nothing from examples/laneformer.py is used except the config class, `build`, and the
checkpoint functions under test.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys

import pytest
import torch

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)

import laneformer as lf  # noqa: E402

F64 = torch.float64


# ---------------------------------------------------------------- the reference, from the spec


def _kv_heads(cfg) -> int:
    return cfg.num_key_value_heads if cfg.num_key_value_heads is not None else cfg.num_attention_heads


def _rmsnorm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    # x / sqrt(mean(x^2) + eps), then times the scale
    return x / torch.sqrt((x * x).mean() + eps) * scale


def _norm_scale(sd: dict, prefix: str, cfg, lane: int) -> torch.Tensor:
    if cfg.replicated_rmsn_scale:
        return sd[prefix + ".weight"].to(F64)          # [D], shared by the lanes
    return sd[prefix + ".scale"].to(F64)[lane]          # [L, D] -> row of this lane


def _rope_head(x: torch.Tensor, p: int, hd: int, theta: float) -> torch.Tensor:
    """One head [hd]: pair (x[2j], x[2j+1]) rotated by angle p * theta^(-2j/hd)."""
    out = torch.empty_like(x)
    for j in range(hd // 2):
        ang = p * theta ** (-2.0 * j / hd)
        c, s = math.cos(ang), math.sin(ang)
        x0, x1 = x[2 * j], x[2 * j + 1]
        out[2 * j] = x0 * c - x1 * s
        out[2 * j + 1] = x0 * s + x1 * c
    return out


def _reduce(X: list, i: int, l: int, cfg) -> torch.Tensor:
    """R(X, i, l): X[i][j] is lane j's [D] output of layer i."""
    L, d = cfg.num_lanes, cfg.broadcast_delay
    if i < d:
        if cfg.use_early_comm:
            total = torch.zeros_like(X[i][l])
            for j in range(L):
                total = total + X[i][j]
            return total
        return math.sqrt(L) * X[i][l]
    if not cfg.use_comm:
        return math.sqrt(L) * X[i][l]
    total = X[i][l].clone()
    for j in range(L):
        if j != l:
            total = total + X[i - d][j]
    return total


def reference_step(state_dict: dict, cfg, token: int, pos: int, cache: dict) -> torch.Tensor:
    """One decode step of LANEFORMER.md (batch 1); returns float64 logits [V].

    `cache` is this function's own: cache[(i, "k")][kv_head] is a dict pos -> [hd] (same for "v").
    """
    sd = state_dict
    L, D, N = cfg.num_lanes, cfg.hidden_size, cfg.num_hidden_layers
    H, Hkv = cfg.num_attention_heads, _kv_heads(cfg)
    hd = D // H
    Hl, Hkvl = H // L, Hkv // L          # query / KV heads per lane
    group = H // Hkv                      # query heads per KV head
    eps, theta = cfg.norm_eps, cfg.rope_theta
    token, pos = int(token), int(pos)

    e = sd["model.tok_embeddings.weight"].to(F64)[token]
    h = [e.clone() for _ in range(L)]
    A: list = []
    M: list = []
    for i in range(N):
        pre = f"model.layers.{i}."
        Wq = sd[pre + "attention.wq.weight"].to(F64)
        Wk = sd[pre + "attention.wk.weight"].to(F64)
        Wv = sd[pre + "attention.wv.weight"].to(F64)
        Wo = sd[pre + "attention.wo.weight"].to(F64)
        W1 = sd[pre + "feed_forward.w1.weight"].to(F64)
        W2 = sd[pre + "feed_forward.w2.weight"].to(F64)
        W3 = sd[pre + "feed_forward.w3.weight"].to(F64)
        kc = cache.setdefault((i, "k"), [dict() for _ in range(Hkv)])
        vc = cache.setdefault((i, "v"), [dict() for _ in range(Hkv)])

        # -- attention: first every lane's K/V (a lane's query heads only read its own KV heads,
        #    but the cache is global by KV-head number, so write all before reading any)
        qs = []
        for l in range(L):
            a = _rmsnorm(h[l], _norm_scale(sd, pre + "attention_norm", cfg, l), eps)
            q = Wq[l] @ a
            k = Wk[l] @ a
            v = Wv[l] @ a
            q_heads = []
            for hh in range(Hl):
                q_heads.append(_rope_head(q[hh * hd:(hh + 1) * hd], pos, hd, theta))
            qs.append(q_heads)
            for kk in range(Hkvl):
                g = l * Hkvl + kk                       # global KV head, lane-major
                kc[g][pos] = _rope_head(k[kk * hd:(kk + 1) * hd], pos, hd, theta)
                vc[g][pos] = v[kk * hd:(kk + 1) * hd].clone()
        A.append([])
        for l in range(L):
            outs = []
            for hh in range(Hl):
                gh = l * Hl + hh                        # global query head
                kvh = gh // group
                qv = qs[l][hh]
                scores = [float(qv @ kc[kvh][t]) * hd ** -0.5 for t in range(pos + 1)]
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = sum(w)
                o = torch.zeros(hd, dtype=F64)
                for t in range(pos + 1):
                    o = o + (w[t] / z) * vc[kvh][t]
                outs.append(o)
            A[i].append(Wo[l] @ torch.cat(outs))
        h = [h[l] + _reduce(A, i, l, cfg) for l in range(L)]

        # -- feed-forward
        M.append([])
        for l in range(L):
            mm = _rmsnorm(h[l], _norm_scale(sd, pre + "ffn_norm", cfg, l), eps)
            a1 = W1[l] @ mm
            zz = a1 * torch.sigmoid(a1) * (W3[l] @ mm)
            M[i].append(W2[l] @ zz)
        h = [h[l] + _reduce(M, i, l, cfg) for l in range(L)]

    x = torch.zeros(D, dtype=F64)
    for l in range(L):
        x = x + _rmsnorm(h[l], _norm_scale(sd, "model.norm", cfg, l), eps)
    x = x / L
    return sd["lm_head.weight"].to(F64) @ x


# ---------------------------------------------------------------- helpers


def _cfg(**kw):
    return dataclasses.replace(lf.PRESETS["tiny"], **kw)


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _eager(model, token: int, pos: int):
    with torch.no_grad():
        logits, nxt = model(torch.tensor(token), torch.tensor(pos))
    return logits.reshape(-1), int(torch.as_tensor(nxt).reshape(-1)[0])


def _compare(cfg, seed: int, steps: int = 6):
    model = lf.build(cfg, seed=seed)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cache: dict = {}
    for p, t in enumerate(_tokens(seed, steps, cfg.vocab_size)):
        got, nxt = _eager(model, t, p)
        ref = reference_step(sd, cfg, t, p, cache)
        assert got.shape == ref.shape == (cfg.vocab_size,)
        assert got.dtype == torch.float32
        rel = (got.to(F64) - ref).norm() / ref.norm()
        assert rel < 1e-5, f"pos {p}: relative error {rel:.3g}"
        assert int(got.argmax()) == int(ref.argmax()), f"pos {p}: argmax differs"
        assert nxt == int(ref.argmax()), f"pos {p}: returned next token differs from argmax"


# ---------------------------------------------------------------- eager vs reference


_GRID = [(L, d, rep) for L in (1, 2, 4) for d in (1, 2) for rep in (True, False)]


@pytest.mark.parametrize("lanes,delay,rep", _GRID, ids=[f"L{L}-d{d}-{'rep' if r else 'lane'}" for L, d, r in _GRID])
def test_matches_reference(lanes, delay, rep):
    seed = 100 + 10 * lanes + 3 * delay + int(rep)
    _compare(_cfg(num_lanes=lanes, broadcast_delay=delay, replicated_rmsn_scale=rep), seed)


_VARIANTS = {
    "no-early-comm-L2-d1": dict(num_lanes=2, broadcast_delay=1, use_early_comm=False),
    "no-early-comm-L4-d2": dict(num_lanes=4, broadcast_delay=2, use_early_comm=False, replicated_rmsn_scale=False),
    "no-comm-L2-d1": dict(num_lanes=2, broadcast_delay=1, use_comm=False),
    "no-comm-L4-d2": dict(num_lanes=4, broadcast_delay=2, use_comm=False, replicated_rmsn_scale=False),
    "no-comm-no-early-L4-d1": dict(num_lanes=4, broadcast_delay=1, use_comm=False, use_early_comm=False),
    "delay-equals-layers": dict(num_lanes=2, broadcast_delay=3),
    "delay-beyond-layers": dict(num_lanes=4, broadcast_delay=5),
    "mha-kv-none": dict(num_lanes=2, num_key_value_heads=None),
    "one-kv-head-per-lane": dict(num_lanes=4, num_key_value_heads=4, replicated_rmsn_scale=False),
    "kv2-L2": dict(num_lanes=2, num_key_value_heads=2, broadcast_delay=2),
    "theta-eps": dict(num_lanes=2, rope_theta=500.0, norm_eps=1e-3),
}


@pytest.mark.parametrize("name", list(_VARIANTS))
def test_variants_match_reference(name):
    seed = 500 + list(_VARIANTS).index(name)
    _compare(_cfg(**_VARIANTS[name]), seed)


def test_state_dict_keys_match_spec():
    for rep in (True, False):
        cfg = _cfg(num_lanes=4, replicated_rmsn_scale=rep)
        L, D, V, N = cfg.num_lanes, cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
        H, Hkv, F = cfg.num_attention_heads, _kv_heads(cfg), cfg.intermediate_size
        hd = D // H
        want = {"model.tok_embeddings.weight": (V, D), "lm_head.weight": (V, D)}
        want["model.norm.weight" if rep else "model.norm.scale"] = (D,) if rep else (L, D)
        for i in range(N):
            p = f"model.layers.{i}."
            want[p + "attention.wq.weight"] = (L, H * hd // L, D)
            want[p + "attention.wk.weight"] = (L, Hkv * hd // L, D)
            want[p + "attention.wv.weight"] = (L, Hkv * hd // L, D)
            want[p + "attention.wo.weight"] = (L, D, H * hd // L)
            want[p + "feed_forward.w1.weight"] = (L, F // L, D)
            want[p + "feed_forward.w3.weight"] = (L, F // L, D)
            want[p + "feed_forward.w2.weight"] = (L, D, F // L)
            for n in ("attention_norm", "ffn_norm"):
                want[p + n + (".weight" if rep else ".scale")] = (D,) if rep else (L, D)
        got = {k: tuple(v.shape) for k, v in lf.build(cfg, seed=1).state_dict().items()}
        assert got == want


def test_reference_is_not_trivially_satisfied():
    """Guard: the lane reduction matters (a wrong delay gives different logits)."""
    cfg = _cfg(num_lanes=4, broadcast_delay=1)
    model = lf.build(cfg, seed=7)
    sd = model.state_dict()
    toks = _tokens(7, 3, cfg.vocab_size)
    c1, c2 = {}, {}
    for p, t in enumerate(toks):
        a = reference_step(sd, cfg, t, p, c1)
        b = reference_step(sd, dataclasses.replace(cfg, broadcast_delay=2), t, p, c2)
    assert (a - b).norm() / b.norm() > 1e-3


def test_one_lane_works():
    cfg = _cfg(num_lanes=1)
    model = lf.build(cfg, seed=11)
    assert model.state_dict()["model.layers.0.attention.wq.weight"].shape[0] == 1
    _compare(cfg, seed=12, steps=4)


# ---------------------------------------------------------------- checkpoints


def _run(model, toks):
    out = []
    for p, t in enumerate(toks):
        out.append(_eager(model, t, p))
    return out


@pytest.mark.parametrize("lanes,rep", [(1, True), (2, False), (4, True)])
def test_checkpoint_roundtrip_exact(tmp_path, lanes, rep):
    cfg = _cfg(num_lanes=lanes, broadcast_delay=2, replicated_rmsn_scale=rep)
    seed = 300 + lanes
    model = lf.build(cfg, seed=seed)
    lf.save_checkpoint(model, str(tmp_path))
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = lf.load_checkpoint(str(tmp_path))
    assert loaded.config == model.config
    sd0, sd1 = model.state_dict(), loaded.state_dict()
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k
    toks = _tokens(seed, 4, cfg.vocab_size)
    a, b = _run(model, toks), _run(loaded, toks)
    for (la, na), (lb, nb) in zip(a, b):
        assert torch.equal(la, lb)
        assert na == nb


def test_config_json_roundtrip_keeps_unknown_keys(tmp_path):
    cfg = _cfg(num_lanes=2, broadcast_delay=2, replicated_rmsn_scale=False, rope_theta=20000.0)
    lf.save_checkpoint(lf.build(cfg, seed=21), str(tmp_path / "a"))
    with open(tmp_path / "a" / "config.json") as f:
        j = json.load(f)
    for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "num_lanes", "broadcast_delay", "use_early_comm", "use_comm", "rope_theta",
              "norm_eps", "replicated_rmsn_scale", "lm_head_type", "pre_norm_lane_agg",
              "sliding_window_n_layers"):
        assert k in j, k
    assert j["num_lanes"] == 2 and j["broadcast_delay"] == 2 and j["replicated_rmsn_scale"] is False
    assert j["rope_theta"] == 20000.0
    j["architectures"] = ["LaneformerForCausalLM"]
    j["some_unknown_field"] = {"nested": [1, 2, 3]}
    with open(tmp_path / "a" / "config.json", "w") as f:
        json.dump(j, f)
    m = lf.load_checkpoint(str(tmp_path / "a"))
    assert m.config.num_lanes == 2 and m.config.broadcast_delay == 2 and m.config.rope_theta == 20000.0
    lf.save_checkpoint(m, str(tmp_path / "b"))
    with open(tmp_path / "b" / "config.json") as f:
        j2 = json.load(f)
    assert j2 == j
    assert lf.LaneformerConfig.from_json(j).to_json() == j


def _save_tiny(path, **kw):
    cfg = _cfg(**kw)
    lf.save_checkpoint(lf.build(cfg, seed=31), str(path))
    return cfg


def _edit_config(path, **kw):
    with open(os.path.join(path, "config.json")) as f:
        j = json.load(f)
    j.update(kw)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(j, f)


def test_checkpoint_config_shape_mismatch_names_key(tmp_path):
    _save_tiny(tmp_path, num_lanes=2)
    _edit_config(tmp_path, intermediate_size=256)     # only the feed-forward tensors stop fitting
    with pytest.raises(ValueError) as ei:
        lf.load_checkpoint(str(tmp_path))
    assert re.search(r"model\.layers\.\d+\.feed_forward\.w[123]\.weight", str(ei.value)), str(ei.value)


def test_checkpoint_hidden_size_mismatch_names_key(tmp_path):
    _save_tiny(tmp_path, num_lanes=2)
    _edit_config(tmp_path, hidden_size=32)
    with pytest.raises(ValueError) as ei:
        lf.load_checkpoint(str(tmp_path))
    keys = set(lf.build(_cfg(num_lanes=2), seed=0).state_dict())
    assert any(k in str(ei.value) for k in keys), str(ei.value)


def test_checkpoint_wrong_tensor_shape_names_key(tmp_path):
    from safetensors.torch import load_file, save_file
    _save_tiny(tmp_path, num_lanes=2)
    f = str(tmp_path / "model.safetensors")
    t = load_file(f)
    bad = "model.layers.1.attention.wk.weight"
    t[bad] = torch.randn(2, 8, 64)      # should be [2, 16, 64]
    save_file(t, f)
    with pytest.raises(ValueError, match=re.escape(bad)):
        lf.load_checkpoint(str(tmp_path))


def test_checkpoint_missing_key_names_it(tmp_path):
    from safetensors.torch import load_file, save_file
    _save_tiny(tmp_path, num_lanes=2, replicated_rmsn_scale=False)
    f = str(tmp_path / "model.safetensors")
    t = load_file(f)
    gone = "model.layers.2.feed_forward.w3.weight"
    del t[gone]
    save_file(t, f)
    with pytest.raises(ValueError, match=re.escape(gone)):
        lf.load_checkpoint(str(tmp_path))


def test_checkpoint_norm_kind_mismatch_names_key(tmp_path):
    # per-lane scales saved, config then claims replicated: `...norm.weight` keys are missing
    _save_tiny(tmp_path, num_lanes=2, replicated_rmsn_scale=False)
    _edit_config(tmp_path, replicated_rmsn_scale=True)
    with pytest.raises(ValueError, match=r"norm\.(weight|scale)"):
        lf.load_checkpoint(str(tmp_path))


def test_checkpoint_unexpected_key_rejected(tmp_path):
    from safetensors.torch import load_file, save_file
    _save_tiny(tmp_path, num_lanes=2)
    f = str(tmp_path / "model.safetensors")
    t = load_file(f)
    t["model.rope.freqs"] = torch.randn(4)
    save_file(t, f)
    with pytest.raises(ValueError, match=re.escape("model.rope.freqs")):
        lf.load_checkpoint(str(tmp_path))


def test_checkpoint_with_rejected_config_raises(tmp_path):
    _save_tiny(tmp_path, num_lanes=2)
    _edit_config(tmp_path, pre_norm_lane_agg=True)
    with pytest.raises(ValueError, match="pre_norm_lane_agg"):
        lf.load_checkpoint(str(tmp_path))


# ---------------------------------------------------------------- config validation


@pytest.mark.parametrize("kw,field", [
    (dict(pre_norm_lane_agg=True), "pre_norm_lane_agg"),
    (dict(sliding_window_n_layers=2), "sliding_window_n_layers"),
    (dict(lm_head_type="other"), "lm_head_type"),
    (dict(num_lanes=3), "num_attention_heads"),                    # H = 8 not divisible by 3
    (dict(num_lanes=8, num_key_value_heads=4), "num_key_value_heads"),
    (dict(num_lanes=2, intermediate_size=129), "intermediate_size"),
], ids=["pre_norm_lane_agg", "sliding_window", "lm_head_type", "H%L", "Hkv%L", "F%L"])
def test_validate_rejects(kw, field):
    cfg = _cfg(**kw)
    with pytest.raises(ValueError, match=field):
        cfg.validate()
    with pytest.raises(ValueError, match=field):
        lf.build(cfg, seed=0)


def test_validate_accepts_presets():
    for cfg in lf.PRESETS.values():
        cfg.validate()
    for L in (1, 2, 4, 8):
        _cfg(num_lanes=L, num_key_value_heads=8).validate()
