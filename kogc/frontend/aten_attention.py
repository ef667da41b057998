"""The KV cache and attention for kogc.frontend.aten: cache writes at the position, the cache seen
through views (GQA's repeated heads, k transposed), scaled_dot_product_attention and attention
written out, each checked by evaluating what depends on the position. A mixin of AtenLowering."""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from ..ir.graph import Op, ValueType
from .aten_values import (CASTS, DTYPE_NAMES, MATMUL, REORDER, SAME, SOFTMAX, Cache, Const, PosFn, Scores, Vec, aten,
                          flat_args, meta, op_name, short, squeezed)
from .probe import alibi_of, causal_allowed, probe_positions, window_of


class AttentionLowering:
    def kv_write(self, n: fx.Node):
        cache = n.args[0]
        c = self.env.get(cache)
        if not isinstance(c, Const) or c.name is None:
            self.fail(f"{op_name(n)} must write a KV-cache buffer of the model")
        *lead, S, hd = c.tensor.shape       # (one KV head is a size-1 axis too: not squeezed away)
        if not lead or sum(d != 1 for d in lead) > 1 or S == 1 or hd == 1:
            self.fail(f"KV cache {c.name} of shape {list(c.tensor.shape)}: kogc supports [1, kv_heads, positions, head_dim]")
        kv = math.prod(lead)
        seq_dim = c.tensor.dim() - 2
        if n.target in (aten.index_copy_.default, aten.index_copy.default):
            dim, index, values = n.args[1], n.args[2], n.args[3]
            if dim % c.tensor.dim() != seq_dim:
                self.fail(f"the KV cache {c.name} is written along axis {dim}, not its positions (axis {seq_dim})")
        else:
            indices, values = n.args[1], n.args[2]
            if len(indices) != seq_dim + 1 or any(i is not None for i in indices[:seq_dim]):
                self.fail(f"the KV cache {c.name} must be written as cache[..., pos, :] = x")
            index = indices[seq_dim]
        if not isinstance(self.env.get(index), PosFn):
            self.fail(f"the KV cache {c.name} must be written at an index computed from the position")
        self.max_pos = self.max_pos or S
        for p in probe_positions(S):
            got = self.posgraph.value(index, p).reshape(-1).tolist()
            if got != [p]:
                self.fail(f"the KV cache {c.name} is written at {got} for position {p}, not at the position")
        x = self.vec(values)
        vm = meta(values)
        if squeezed(vm.shape) != squeezed((kv, hd)):
            self.fail(f"the value written into {c.name} has shape {list(vm.shape)}, not [kv_heads={kv}, head_dim={hd}]")
        dtype = DTYPE_NAMES[c.tensor.dtype]
        saved, self.scope = self.scope, c.name.rsplit(".", 1)[0]
        attrs = {"name": c.name}
        if x in self.half_rotated:   # the kernel's rows hold head dims (j, j + hd/2) as pairs (2j, 2j + 1)
            attrs["view"] = [["rope_half_rows", hd] + ([self.half_rotated[x]] if self.half_rotated[x] else [])]
        state = self.emit(Op.STATE, [], attrs, ValueType((kv, S, hd), dtype, 1), hint=short(c.name))
        self.scope = saved
        w = self.emit(Op.KV_WRITE, [state, x, self.pos_ir], hint="kv_write")
        probe = (torch.arange(kv, dtype=torch.int32)[:, None, None] * S + torch.arange(S, dtype=torch.int32)[:, None]
                 ).expand(kv, S, hd).reshape(c.tensor.shape)
        out = Cache(w, kv, S, hd, probe)
        self.env[cache] = out        # later reads of the buffer see this step's write
        return out

    def cache_view(self, n: fx.Node):
        c = next(self.env[a] for a in flat_args(n) if isinstance(self.env.get(a), Cache))
        if n.target not in SAME and n.target not in REORDER and n.target not in (aten.repeat_interleave.self_int, aten.repeat.default):
            self.fail(f"unsupported op {op_name(n)} on a KV cache (only views, head repeats and attention)")
        args = [c.probe if isinstance(a, fx.Node) and self.env.get(a) is c else a for a in n.args]
        if n.target in CASTS:
            return c
        probe = n.target(*args, **{k: v for k, v in n.kwargs.items() if k != "output_size"})
        return Cache(c.ir, c.kv, c.S, c.hd, probe)

    def heads(self, c: Cache, nq: int, transposed: bool, gqa: bool = False) -> None:
        """Check that a viewed cache gives query head h the rows of KV head h // (nq / kv), all positions
        in order (the IR's GQA); transposed: [.., hd, S] (k^T)."""
        p = c.probe
        if transposed:
            p = p.transpose(-1, -2)
        if p.dim() < 3 or p.shape[-2:] != (c.S, c.hd):
            self.fail(f"attention over a KV cache seen as {list(c.probe.shape)}, not [.., heads, positions, head_dim]")
        p = p.reshape(-1, c.S, c.hd)
        h = p.shape[0]
        if gqa and h == c.kv:
            return
        if h != nq or nq % c.kv:
            self.fail(f"attention of {nq} query heads over {h} cache heads ({c.kv} KV heads)")
        g = nq // c.kv
        want = ((torch.arange(nq) // g)[:, None] * c.S + torch.arange(c.S)[None, :]).to(p.dtype)
        if not bool((p == want[:, :, None]).all()):
            self.fail("query heads must use the KV heads repeated in order (repeat_interleave or expand "
                      "over a new axis after the KV-head axis)")

    def mask_window(self, mask, kind: str) -> int:
        """The window a causal mask keeps (0: every position up to pos); anything else is refused."""
        if mask is None:
            self.fail("attention over a static KV cache needs a causal mask (without one it reads unwritten rows)")
        if not isinstance(self.env.get(mask), PosFn):
            self.fail("an attention mask that depends on more than the position is not supported")

        def allowed_at(p):
            m = self.posgraph.value(mask, p)
            return causal_allowed(m, kind == "additive") if kind != "fill" else ~m.bool()
        try:
            window = window_of(allowed_at, self.max_pos)
        except ValueError as e:
            self.fail(str(e))
        except RuntimeError as e:       # (the mask's ops hold this step's sizes: Falcon-RW's ALiBi bias)
            self.fail(f"the attention mask cannot be evaluated at other positions than the captured one "
                      f"({str(e).splitlines()[0]})")
        if window is None:
            self.fail(f"the attention mask is neither causal nor a sliding window (each position p attending "
                      f"0..p, or the last W positions up to p) over the cache's {self.max_pos} positions")
        return window

    def check_scale(self, q: str, scale: float, hd: int) -> None:
        """The kernel's attention scales by 1/sqrt(head_dim); another scale (Granite's attention_multiplier)
        is folded into the query: into the rows of the projection that makes it (and its bias), or into the
        per-head norm's scale after it, the last linear step before RoPE, a rotation."""
        factor = scale * math.sqrt(hd)
        if abs(factor - 1.0) <= 1e-5:
            return
        node = self.by_name(q)
        before = self.by_name(node.inputs[0]) if node.op is Op.ROPE else node
        if before.op is Op.MATVEC:
            weights = [before.inputs[0]] + list(before.inputs[2:])      # the projection's rows and bias
        elif before.op is Op.MUL and self.by_name(before.inputs[1]).op is Op.PARAM:
            weights = [before.inputs[1]]                                 # a per-head norm's scale
        else:
            self.fail(f"attention scaled by {scale} (not 1/sqrt(head_dim) = {1 / math.sqrt(hd):.6g}): kogc folds "
                      f"the factor into the query's projection, and this query is not one's output")
        uses = self.use_counts()
        inner = [before.name] if before.name != q else []      # (the query itself: attention is not emitted yet)
        read_twice = any(len(f.users) != 1 for f, v in self.env.items() if isinstance(v, Vec) and v.ir == q)
        if read_twice or uses.get(q, 0) or any(uses.get(x, 0) != 1 for x in inner + weights):
            self.fail(f"attention scaled by {scale}: kogc folds the factor into the query's projection, which "
                      f"here feeds more than the attention")
        for w in weights:
            self.scale_param(w, factor)

    def alibi(self, bias: fx.Node, heads: int, positions: int) -> dict:
        """A constant added to the scores, [heads, positions] after its views: ALiBi (kogc.frontend.probe.alibi_of),
        from its fp32 values (before the cast to the model's dtype, where the model rounds it: BLOOM's)."""
        if isinstance(self.env[bias], PosFn):        # the same at every position, or it is no ALiBi
            at = [self.posgraph.value(bias, p) for p in probe_positions(self.max_pos or 1)]
            if any(not torch.equal(a, at[0]) for a in at):
                self.fail("a function of the position added to attention scores that is neither a mask nor ALiBi")
            values, rounded, src = at[0], False, None
        else:
            values, rounded, src = self.env[bias].tensor, False, bias
        while values.dtype != torch.float32 and isinstance(src, fx.Node) and (src.target in SAME or src.target in CASTS):
            inner = self.env.get(src.args[0])
            if not isinstance(inner, Const):
                break
            if src.target in CASTS and inner.tensor.dtype == torch.float32 and inner.tensor.numel() == values.numel():
                values, rounded = inner.tensor.reshape(values.shape), True
                break
            src = src.args[0]
        if values.dtype != torch.float32 or values.numel() != heads * positions:
            self.fail(f"a constant of shape {list(values.shape)} added to attention scores: only ALiBi (a bias per "
                      f"query head and key position, computed in fp32) is supported")
        found = alibi_of(values.reshape(heads, positions))
        if found is None:
            self.fail("a constant added to attention scores that is not ALiBi (slope_h * (k + c) for each query head h "
                      "and key position k) is not supported")
        return {**found, **({"rounded": True} if rounded else {})}

    def attention(self, q: str, k: Cache, v: Cache, window: int, softcap: float = 0.0, alibi: dict | None = None) -> Vec:
        attrs = {**({"window": window} if window else {}), **({"softcap": softcap} if softcap else {}),
                 **({"alibi": alibi} if alibi else {})}
        return Vec(self.emit(Op.ATTENTION, [q, k.ir, v.ir, self.pos_ir], attrs or None, hint="attn"))

    def sdpa(self, n: fx.Node):
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        a = dict(zip(names, n.args))
        a.update(n.kwargs)
        q = self.vec(a["query"])
        k, v = self.env.get(a["key"]), self.env.get(a["value"])
        if not (isinstance(k, Cache) and isinstance(v, Cache)):
            self.fail("scaled_dot_product_attention must attend over the KV cache")
        qm = meta(a["query"])
        if len(squeezed(qm.shape)) > 2 or qm.shape[-2] != 1:
            self.fail(f"attention of a query of shape {list(qm.shape)}: one token at a time only")
        nq, hd = qm.numel() // qm.shape[-1], qm.shape[-1]
        if a.get("is_causal"):
            self.fail("is_causal=True with one query attends only position 0 of the cache (top-left causal); "
                      "pass a mask of positions <= pos instead")
        if a.get("dropout_p", 0.0):
            self.fail("attention dropout is not supported")
        for c in (k, v):
            self.heads(c, nq, False, bool(a.get("enable_gqa")))
        window = self.mask_window(a.get("attn_mask"), "bool" if meta(a.get("attn_mask")) is not None and
                                  meta(a["attn_mask"]).dtype == torch.bool else "additive")
        if a.get("scale") is not None:
            self.check_scale(q, a["scale"], hd)
        return self.attention(q, k, v, window)

    def written_attention(self, n: fx.Node):
        t, args = n.target, n.args
        k = [self.env.get(x) if isinstance(x, fx.Node) else x for x in args]
        if t is aten.baddbmm.default and isinstance(k[0], Const) and isinstance(k[2], Cache):
            if n.kwargs.get("beta", 1) != 1:
                self.fail(f"{op_name(n)} of attention scores with beta {n.kwargs['beta']}: only the bias as it is")
            qm = meta(args[1])
            self.heads(k[2], qm.numel() // qm.shape[-1], True)
            return Scores(self.vec(args[1]), k[2], scale=float(n.kwargs.get("alpha", 1)), bias=args[0])
        if t in MATMUL and isinstance(k[1], Cache) and not isinstance(k[0], Scores):
            qm = meta(args[0])
            nq = qm.numel() // qm.shape[-1]
            self.heads(k[1], nq, True)
            return Scores(self.vec(args[0]), k[1])
        if not isinstance(k[0], Scores):
            if t in MATMUL:
                self.fail(f"{op_name(n)} of two activations is only supported inside attention (q @ k^T, p @ v)")
            self.fail(f"unsupported op {op_name(n)} on attention scores")
        s = k[0]
        if t in CASTS or t in SAME:
            return s
        if t in (aten.mul.Tensor, aten.div.Tensor) and isinstance(k[1], (int, float)) and not s.probs and s.bias is None:
            f = 1.0 / k[1] if t is aten.div.Tensor else k[1]
            if s.tanh and not s.softcap and t is aten.mul.Tensor:       # c * tanh(..): a soft cap of c
                return dataclasses.replace(s, softcap=float(f))
            if not s.tanh:
                return dataclasses.replace(s, scale=s.scale * f)
        if t is aten.tanh.default and not (s.tanh or s.probs or s.mask):
            return dataclasses.replace(s, tanh=True)
        if t is aten.add.Tensor and isinstance(k[1], PosFn) and s.bias is None and not (s.probs or s.tanh):
            first = self.posgraph.value(args[1], 0)
            if first.is_floating_point() and bool((first.abs() < 1e4).all()):
                return dataclasses.replace(s, bias=args[1])     # finite everywhere: no mask (MPT's ALiBi, sliced)
        if t is aten.add.Tensor and isinstance(k[1], PosFn) and s.mask is None:
            return dataclasses.replace(s, mask=(args[1], "additive"))
        if t is aten.add.Tensor and isinstance(k[1], Const) and s.bias is None and not (s.probs or s.tanh):
            return dataclasses.replace(s, bias=args[1])        # (MPT's ALiBi)
        if t in (aten.masked_fill.Scalar, aten.masked_fill.Tensor) and isinstance(k[1], PosFn) and s.mask is None:
            if not (isinstance(args[2], float) and args[2] <= -1e4):
                self.fail("masked_fill of attention scores must fill with -inf")
            return dataclasses.replace(s, mask=(args[1], "fill"))
        if t in SOFTMAX and not s.probs:
            if args[1] % meta(args[0]).dim() != meta(args[0]).dim() - 1:
                self.fail("softmax of attention scores must be over the cache positions (the last axis)")
            return dataclasses.replace(s, probs=True)
        if t in MATMUL and s.probs and isinstance(k[1], Cache):
            self.heads(k[1], self.types[s.q].shape[0] // s.k.hd, False)
            window = self.mask_window(s.mask[0] if s.mask else None, s.mask[1] if s.mask else "")
            if s.tanh and not s.softcap:
                self.fail("tanh of attention scores is supported as a soft cap, c * tanh(scores / c)")
            # c * tanh(scale * q.k): the kernel's scores (q.k / sqrt(hd), the query's projection scaled by
            # scale * c * sqrt(hd)) capped as c * tanh(scores / c)
            self.check_scale(s.q, s.scale * (s.softcap or 1.0), s.k.hd)
            alibi = self.alibi(s.bias, self.types[s.q].shape[0] // s.k.hd, s.k.S) if s.bias is not None else None
            return self.attention(s.q, s.k, k[1], window, s.softcap, alibi)
        self.fail(f"unsupported op {op_name(n)} on attention scores")


# ---------------------------------------------------------------- weights seen through views
