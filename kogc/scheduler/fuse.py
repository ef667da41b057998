"""IR -> fused ops: group IR nodes into the units a task computes, and decide what is stored.

A fused op is built around one "heavy" node (a matvec, attention) and absorbs the cheap work
around it: the RMSNorm or SwiGLU that makes its input (prologue), RoPE, the KV-cache write, the
residual add and the LM head's partial argmax (epilogue). What a fused op reads from another
fused op lives in a buffer; everything else stays in registers. Every IR node must be covered by
exactly one fused op, or `fuse` raises SchedulerError naming the node and its source line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.executor import XIELU_CONSTANTS
from ..ir.graph import Graph, Node, Op
from .config import ESIZE, TileConfig, tile_rows
from .errors import SchedulerError

# prologues: how a matvec forms its input vector (a gated kind: act(gate) * up of two stored vectors)
PLAIN, RMSNORM, LAYERNORM, ATTN_COMBINE = "plain", "rmsnorm", "layernorm", "attn_combine"
# the gated MLP's activation act(gate) * up, one kind per act: a prologue, or an epilogue whose rows come in
# (gate, up) pairs of two weights on the same input and which stores the product
GATED = {Op.SILU: "silu_mul", Op.GELU: "gelu_mul", Op.GELU_TANH: "gelu_tanh_mul", Op.RELU: "relu_mul",
         Op.RELU2: "relu2_mul"}
GATED_KINDS = frozenset(GATED.values())
# an epilogue storing act(its rows) (a plain MLP's first matvec: GPT-NeoX's, Starcoder2's, OPT's, Nemotron's), one
# kind per act
ACT_STORE = {Op.SILU: "silu_store", Op.GELU: "gelu_store", Op.GELU_TANH: "gelu_tanh_store", Op.RELU: "relu_store",
             Op.RELU2: "relu2_store", Op.XIELU: "xielu_store"}
# epilogues: what it does with its result rows (or a gated kind)
STORE, ROPE_STORE, ROPE_CACHE, CACHE, RESIDUAL, STORE_ARGMAX = (
    "store", "rope_store", "rope_cache", "cache", "residual", "store_argmax")
# a LayerNorm's missing weight and bias: constant vectors (norm_constant)
NORM_ONES, NORM_ZEROS = "#ones", "#zeros"
# lane selectors of a residual term: this lane's, the other lanes' sum, all lanes' sum
OWN, OTHERS, ALL = "own", "others", "all"


@dataclass
class Term:
    value: str        # a lane-batched matvec output
    select: str       # OWN | OTHERS | ALL
    coef: float


@dataclass
class FusedOp:
    kind: str                    # embed | matvec | attention | head_norm | residual | normed_residual | final_norm
                                 # | argmax
    node: str                    # the IR node it is built around
    lanes: int                   # 0: one instance; L: one per lane
    p: dict = field(default_factory=dict)
    source: str = ""
    layer: int | None = None


def _linear_form(n: Node, by: dict[str, Node]) -> list[Term] | None:
    """The value as a sum of lane-selected matvec outputs, or None if it is not one."""
    if n.op is Op.MATVEC and n.type.lanes:
        return [Term(n.name, OWN, 1.0)]
    if n.op is Op.SCALE:
        inner = _linear_form(by[n.inputs[0]], by)
        return None if inner is None else [Term(t.value, t.select, t.coef * n.attrs["factor"]) for t in inner]
    if n.op is Op.LANE_SUM_OTHERS and by[n.inputs[0]].op is Op.MATVEC:
        return [Term(n.inputs[0], OTHERS, 1.0)]
    if n.op is Op.BROADCAST_LANES and by[n.inputs[0]].op is Op.LANE_SUM and by[by[n.inputs[0]].inputs[0]].op is Op.MATVEC:
        return [Term(by[n.inputs[0]].inputs[0], ALL, 1.0)]
    if n.op in (Op.ADD, Op.SUB):
        a, b = (_linear_form(by[i], by) for i in n.inputs)
        if a is None or b is None:
            return None
        sign = -1.0 if n.op is Op.SUB else 1.0
        return a + [Term(t.value, t.select, sign * t.coef) for t in b]
    return None


def _scaled_norm(n: Node, by: dict[str, Node]) -> tuple[Node, Node] | None:
    """n = rmsnorm(h) * g with g a weight: (the rmsnorm, g), or None."""
    if n.op is not Op.MUL:
        return None
    a, b = (by[i] for i in n.inputs)
    if a.op is Op.PARAM:
        a, b = b, a
    return (a, b) if a.op is Op.RMSNORM and b.op is Op.PARAM else None


def _norm_input(n: Node, by: dict[str, Node]) -> tuple[str, str, float, list[str]] | None:
    """x = rmsnorm(h) * g over the whole vector, g a weight, or rmsnorm(h) alone (NanoChat's norms have no weight:
    g a constant of ones): (h, g, eps, the nodes it makes up)."""
    if n.op is Op.RMSNORM and not n.attrs.get("group"):
        return n.inputs[0], f"{NORM_ONES}.{n.type.shape[0]}", n.attrs["eps"], [n.name]
    scaled = _scaled_norm(n, by)
    if scaled is None or scaled[0].attrs.get("group"):
        return None
    norm, g = scaled
    return norm.inputs[0], g.name, norm.attrs["eps"], [n.name, norm.name, g.name]


def norm_constant(value: str) -> float | None:
    """The constant a LayerNorm's missing weight (1) or bias (0) stands for, where `value` names one, else None."""
    return {NORM_ONES: 1.0, NORM_ZEROS: 0.0}.get(value.split(".")[0])


def _layer_norm_input(n: Node) -> tuple[str, str, str, float] | None:
    """x = layernorm(h) * g + b, the op's own weight and bias: (h, g, b, eps); None where n is no LayerNorm. A
    weight or bias it lacks (OLMo's norms have neither, Cohere's no bias) is a constant vector of ones or zeros,
    `#ones.D` / `#zeros.D`, held among the kernel's small vectors."""
    if n.op is not Op.LAYERNORM:
        return None
    d = n.type.shape[0]
    g, b = (list(n.inputs[1:]) + [f"{NORM_ONES}.{d}", f"{NORM_ZEROS}.{d}"][len(n.inputs) - 1:])[:2]
    return n.inputs[0], g, b, n.attrs["eps"]


def fuse(graph: Graph, cfg=None) -> list[FusedOp]:
    """cfg (TileConfig): the tile size and weight format, which decide where a gated pair pays."""
    cfg = cfg or TileConfig()
    by = graph.by_name()
    users = graph.users()
    paired = lambda mul: _paired(mul, by, users, graph, cfg)      # noqa: E731
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    covered: set[str] = set()
    ops: list[FusedOp] = []

    def take(*names):
        covered.update(names)

    def add(kind, node, lanes, **p):
        ops.append(FusedOp(kind, node.name, lanes, p, node.source, node.layer))

    residual_done: set[str] = set()
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.PARAM, Op.STATE, Op.OUTPUT):
            take(n.name)
        elif n.op is Op.BROADCAST_LANES and (emb := _embedding(by[n.inputs[0]], by)) is not None:
            table, pos_table, nodes = emb
            take(n.name, *nodes)
            # a norm of the embedding alone (BLOOM's word_embeddings_layernorm, NanoChat's RMSNorm): formed by the
            # embed task
            normed = _embedding_norm(n, by, users)
            if normed is not None:
                take(*normed.pop("nodes"))
                add("embed", n, n.type.lanes, table=table, pos_table=pos_table, **normed)
            else:
                add("embed", n, n.type.lanes, table=table, pos_table=pos_table, out=n.name)
        elif n.op is Op.MATVEC and n.name not in covered:      # (covered: the up half of a gated pair)
            ops.append(_matvec(n, by, users, order, take, residual_done, paired))
        elif n.op is Op.ROPE and n.name not in covered and \
                (head_norm := _head_norm_input(n, by) or _post_rope_norm(n, by, users)) is not None:
            x, g, eps, norm, mul = head_norm
            take(n.name, norm.name, mul.name)
            hd = n.attrs["head_dim"]
            # whole: one norm over all the heads (OLMo2's), not one per head (the same where there is one head);
            # rope_first: RoPE, then the norm and its scale (HunYuan's), else the norm, its scale, then RoPE
            p = dict(x=x, g=g, eps=eps, heads=n.type.shape[0] // hd, head_dim=hd,
                     whole=not norm.attrs.get("group") and n.type.shape[0] > hd, rope_first=norm.inputs[0] == n.name)
            out = mul if p["rope_first"] else n
            kvw = [u for u in users[out.name] if u.op is Op.KV_WRITE]
            if kvw:
                take(kvw[0].name)
                p.update(cache=kvw[0].inputs[0], out=None)
            else:
                p.update(cache=None, out=out.name)
            add("head_norm", n, n.type.lanes, **p)
        elif n.op is Op.ATTENTION:
            q, kw, vw = (by[i] for i in n.inputs[:3])
            kv, _, hd = kw.type.shape
            take(n.name)
            add("attention", n, n.type.lanes, q=q.name, k_cache=kw.inputs[0], v_cache=vw.inputs[0],
                kv_heads=kv, head_dim=hd, group=n.type.shape[0] // (kv * hd), max_pos=kw.type.shape[1],
                window=n.attrs.get("window", 0), softcap=n.attrs.get("softcap", 0.0), alibi=n.attrs.get("alibi"))
        elif n.op is Op.ADD and n.name not in residual_done:
            terms = _residual_terms(n, by)
            if terms is not None:
                stream, terms = terms
                take(n.name, *_form_nodes(by[[i for i in n.inputs if i != stream][0]], by))
                add("residual", n, n.type.lanes, h=stream, out=n.name, terms=terms)
            elif (normed := _normed_increment(n, by)) is not None:
                stream, (x, g, eps, nodes), inc = normed
                take(n.name, *nodes)
                add("normed_residual", n, n.type.lanes, h=stream, x=x, g=g, eps=eps, out=n.name)
        elif n.op is Op.LANE_MEAN:
            src = _norm_input(by[n.inputs[0]], by)
            layer = _layer_norm_input(by[n.inputs[0]])
            if src is not None:
                h, g, eps, nodes = src
                take(n.name, *nodes)
                add("final_norm", n, 0, h=h, g=g, eps=eps, out=n.name, norm=RMSNORM)
            elif layer is not None:
                h, g, b, eps = layer
                take(n.name, n.inputs[0])
                add("final_norm", n, 0, h=h, g=g, b=b, eps=eps, out=n.name, norm=LAYERNORM)
        elif n.op is Op.ARGMAX:
            take(n.name)
            add("argmax", n, 0, logits=n.inputs[0], out=n.name)
    missing = [n for n in graph.nodes if n.name not in covered]
    if missing:
        n = missing[0]
        raise SchedulerError(f"no fused task covers IR node {n.name} ({n.op.value}) from {n.source or '?'}")
    return ops


def _embedding_norm(n: Node, by: dict[str, Node], users) -> dict | None:
    """The embedding's only reader a LayerNorm, or an RMSNorm (scaled or not), of it alone: the embed task's
    parameters for it (out, g, b, eps, norm) and the nodes it makes up, else None."""
    us = users[n.name]
    if len(us) != 1 or n.type.lanes > 1:
        return None
    if us[0].op is Op.LAYERNORM:
        _, g, b, eps = _layer_norm_input(us[0])
        return dict(out=us[0].name, g=g, b=b, eps=eps, norm=LAYERNORM, nodes=[us[0].name])
    if us[0].op is not Op.RMSNORM or us[0].attrs.get("group"):
        return None
    last, g, nodes = _with_scale(us[0], by, users)
    return dict(out=last.name, g=g, b=None, eps=us[0].attrs["eps"], norm=RMSNORM, nodes=nodes)


def _with_scale(norm: Node, by: dict[str, Node], users) -> tuple[Node, str, list[str]]:
    """An RMSNorm with its scale: its only reader norm * g with g a weight, else none (NanoChat's norms: a constant
    of ones): (the scaled value's node, g, the nodes they make up)."""
    after = users[norm.name]
    scaled = _scaled_norm(after[0], by) if len(after) == 1 else None
    if scaled is not None and scaled[0] is norm:
        return after[0], scaled[1].name, [norm.name, after[0].name, scaled[1].name]
    return norm, f"{NORM_ONES}.{norm.type.shape[0]}", [norm.name]


def _embedding(n: Node, by: dict[str, Node]) -> tuple[str, str | None, list[str]] | None:
    """n = the token's row of a table, or that plus the position's row of another (a learned position
    embedding): (the token's table, the position's table or None, the nodes), or None."""
    at_pos = lambda e: by[e.inputs[1]].op is Op.INPUT and by[e.inputs[1]].attrs.get("index") == 1    # noqa: E731
    if n.op is Op.EMBED and not at_pos(n):
        return n.inputs[0], None, [n.name]
    if n.op is not Op.ADD or not all(by[i].op is Op.EMBED for i in n.inputs):
        return None
    tok, pos = sorted((by[i] for i in n.inputs), key=at_pos)
    if at_pos(tok) or not at_pos(pos):
        return None
    return tok.inputs[0], pos.inputs[0], [n.name, tok.name, pos.name]


def _head_norm_input(rope: Node, by: dict[str, Node]):
    """RoPE's input = rmsnorm over each of its heads of a stored x (Qwen3's q_norm / k_norm), or over the
    whole of x (OLMo2's), times a scale: (x, g, eps, the norm, the mul), or None."""
    n = by[rope.inputs[0]]
    scaled = _scaled_norm(n, by)
    # (a norm over a whole vector has no group: OLMo2's, and one KV head's k in a model that norms per head)
    if scaled is None or (scaled[0].attrs.get("group") or scaled[0].type.shape[0]) not in \
            (rope.attrs["head_dim"], rope.type.shape[0]):
        return None
    norm, g = scaled
    return norm.inputs[0], g.name, norm.attrs["eps"], norm, n


def _post_rope_norm(rope: Node, by: dict[str, Node], users) -> tuple | None:
    """RoPE's output normed over each head (or over all of it), RoPE's only reader, and scaled (HunYuan's q and k
    normed after RoPE) or not (NanoChat's: a scale of ones): (RoPE's input, the scale, eps, the norm, the last
    of them), or None."""
    us = users[rope.name]
    width = rope.type.shape[0]
    if len(us) != 1 or us[0].op is not Op.RMSNORM or \
            (us[0].attrs.get("group") or width) not in (rope.attrs["head_dim"], width):
        return None
    norm = us[0]
    last, g, _ = _with_scale(norm, by, users)
    if last is norm and any(u.op is Op.MUL for u in users[norm.name]):
        return None         # (scaled by something other than a weight)
    return rope.inputs[0], g, norm.attrs["eps"], norm, last


def _form_nodes(n: Node, by) -> list[str]:
    """The IR nodes making up a linear form (to mark them covered)."""
    out = [n.name]
    if n.op in (Op.ADD, Op.SUB, Op.SCALE, Op.LANE_SUM_OTHERS, Op.BROADCAST_LANES, Op.LANE_SUM):
        for i in n.inputs:
            if by[i].op is not Op.MATVEC:
                out += _form_nodes(by[i], by)
    return out


def _residual_terms(n: Node, by) -> tuple[str, list[Term]] | None:
    """ADD(h, increment) where increment is a linear form of matvec outputs: (h, terms)."""
    for stream, inc in (n.inputs, tuple(reversed(n.inputs))):
        if _linear_form(by[stream], by) is None:
            terms = _linear_form(by[inc], by)
            if terms is not None:
                return stream, terms
    return None


def _normed_increment(n: Node, by):
    """ADD(h, rmsnorm(x) * g) with x a matvec's stored output (Gemma 3 norms each sublayer's output before
    the residual add): (h, (x, g, eps), the scaled norm), or None."""
    for stream, inc in (n.inputs, tuple(reversed(n.inputs))):
        norm = _norm_input(by[inc], by)
        if norm is not None and by[norm[0]].op is Op.MATVEC and _linear_form(by[stream], by) is None:
            return stream, norm, by[inc]
    return None


def _matvec(n: Node, by, users, order, take, residual_done, paired) -> FusedOp:
    w, x = by[n.inputs[0]], by[n.inputs[1]]
    p = {"w": w.name, "n": w.type.shape[0], "k": w.type.shape[1], "out": None,
         "bias": n.inputs[2] if len(n.inputs) == 3 else None}
    take(n.name)
    # prologue
    norm = _norm_input(x, by)
    layer = _layer_norm_input(x) if x.type.lanes == n.type.lanes else None
    if norm is not None and x.type.lanes == n.type.lanes:
        p.update(prologue=RMSNORM, x=norm[0], g=norm[1], eps=norm[2])
        take(*norm[3])
    elif layer is not None:
        other = [u for u in users[x.name] if u.op is not Op.MATVEC]
        if other:       # (formed in each reading matvec's prologue, never stored)
            raise SchedulerError(f"a LayerNorm's output ({x.name}) read by {other[0].op.value} {other[0].name}, not "
                                 f"only by linear layers, is not supported, at {x.source or '?'}")
        p.update(prologue=LAYERNORM, x=layer[0], g=layer[1], b=layer[2], eps=layer[3])
        take(x.name)
    elif paired(x) is not None:
        p.update(prologue=PLAIN, x=x.name)      # act(gate) * up, stored by the gated pair's tasks
    elif x.op is Op.MUL and any(by[i].op in GATED for i in x.inputs):
        act = next(by[i] for i in x.inputs if by[i].op in GATED)
        other = next(i for i in x.inputs if i != act.name)
        p.update(prologue=GATED[act.op], x=act.inputs[0], x2=other)
        take(x.name, act.name)
    elif x.op is Op.ATTENTION:
        p.update(prologue=ATTN_COMBINE, x=x.name)
    else:
        p.update(prologue=PLAIN, x=x.name)
    # epilogue
    us = users[n.name]
    pair = _pair_of(n, users, paired)
    if pair is not None:
        gate, up, act, mul = pair
        take(gate.name, up.name, act.name, mul.name)
        p.update(w=gate.inputs[0], w2=up.inputs[0], epilogue=GATED[act.op], out=mul.name)
    elif len(us) == 1 and us[0].op is Op.ROPE and _post_rope_norm(us[0], by, users) is None:
        rope = us[0]
        take(rope.name)
        p.update(head_dim=rope.attrs["head_dim"], rope=rope.name)
        kvw = [u for u in users[rope.name] if u.op is Op.KV_WRITE]
        if kvw:
            take(kvw[0].name)
            p.update(epilogue=ROPE_CACHE, cache=kvw[0].inputs[0], out=None)
        else:
            p.update(epilogue=ROPE_STORE, out=rope.name)
    elif len(us) == 1 and us[0].op is Op.KV_WRITE:
        take(us[0].name)
        p.update(epilogue=CACHE, cache=us[0].inputs[0], head_dim=us[0].type.shape[2])
    elif len(us) == 1 and us[0].op in ACT_STORE and users[us[0].name] and \
            all(u.op is Op.MATVEC for u in users[us[0].name]):
        # act(rows) read only by matvecs (a plain MLP): computed once here, not in every reader's prologue
        take(us[0].name)
        p.update(epilogue=ACT_STORE[us[0].op], out=us[0].name)
        if us[0].op is Op.XIELU:     # (its constants, each layer's own, in the task's arguments)
            p.update(xielu=[us[0].attrs[k] for k in XIELU_CONSTANTS])
    elif any(u.op is Op.ARGMAX for u in us):
        p.update(epilogue=STORE_ARGMAX, out=n.name, softcap=n.attrs.get("softcap", 0.0))
    else:
        p.update(epilogue=STORE, out=n.name)
        # (a biased matvec stores its rows and a residual task adds them: the residual epilogue's
        # arguments leave no slot for a bias)
        # (nor for a LayerNorm's bias, A_NORM_BIAS)
        fused = None if p["bias"] or p["prologue"] == LAYERNORM else _fusable_residual(n, by, users, order)
        if fused is not None:
            add_node, stream, terms = fused
            residual_done.add(add_node.name)
            take(add_node.name, *_form_nodes(by[[i for i in add_node.inputs if i != stream][0]], by))
            own = [t for t in terms if t.value == n.name]
            p.update(epilogue=RESIDUAL, h=stream, res_out=add_node.name, own_coef=own[0].coef,
                     terms=[t for t in terms if t.value != n.name])
    if n.attrs.get("softcap") and p["epilogue"] != STORE_ARGMAX:
        raise SchedulerError(f"a soft cap on {n.name}, a matvec other than the LM head, is not supported, at {n.source or '?'}")
    return FusedOp("matvec", n.name, n.type.lanes, p, n.source, n.layer)


def gated_pair(mul: Node, by, users) -> tuple[Node, Node, Node] | None:
    """mul = act(gate) * up (act: SiLU or GELU) with gate and up matvecs of the same input and shape, each
    used only there: (gate, up, act). One task then multiplies a row of each and stores the product (the
    activation W2 reads) instead of storing both and W2 recomputing it in every task."""
    if mul.op is not Op.MUL:
        return None
    a, b = (by[i] for i in mul.inputs)
    if b.op in GATED:
        a, b = b, a
    if a.op not in GATED or b.op is not Op.MATVEC or by[a.inputs[0]].op is not Op.MATVEC:
        return None
    gate, up = by[a.inputs[0]], b
    same = len(gate.inputs) == len(up.inputs) == 2 and gate.inputs[1] == up.inputs[1] and gate.type == up.type and \
        by[gate.inputs[0]].type.shape == by[up.inputs[0]].type.shape
    used_by = lambda x: [u.name for u in users.get(x.name, [])]     # noqa: E731
    only = used_by(gate) == [a.name] and used_by(a) == [mul.name] and used_by(up) == [mul.name]
    return (gate, up, a) if same and only else None


def _paired(mul: Node, by, users, graph: Graph, cfg) -> tuple[Node, Node, Node] | None:
    """gated_pair(mul) where it pays: where the matvec reading mul (W2) would take at least
    cfg.mlp_pair_inputs inputs per row of its tile (tiles of whole rows, as kogc.scheduler.tile cuts
    them), i.e. where its tasks would repeat act(gate) * up over many inputs for few rows. Measured on
    the H200 at context 1024: Llama-3.2-1B's shapes (8192 inputs / 2 rows) 1.187 -> 1.057 ms per token
    with pairs; SmolLM2's (1536 / 8) 0.679 -> 0.669; laneformer-2b's (1024 / 16, 8 lanes) 1.444 ms with
    pairs against 1.390 (docs/design.md)."""
    pair = gated_pair(mul, by, users)
    w2 = [u for u in users.get(mul.name, []) if u.op is Op.MATVEC]
    if pair is None or len(w2) != 1:
        return None
    n, k = by[w2[0].inputs[0]].type.shape
    es = 1 if cfg.weights == "fp8" else ESIZE[graph.weight_dtype]
    return pair if k // tile_rows(n, k, es, cfg.tile_bytes) >= cfg.mlp_pair_inputs else None


def _pair_of(n: Node, users, paired):
    """(gate, up, act, mul) when matvec n is either half of a gated pair that pays."""
    for u in users.get(n.name, []):
        after = users.get(u.name, [])
        mul = after[0] if u.op in GATED and len(after) == 1 else u
        pair = paired(mul)
        if pair is not None and n.name in (pair[0].name, pair[1].name):
            return pair + (mul,)
    return None


def _fusable_residual(n: Node, by, users, order):
    """The residual ADD this matvec's epilogue can compute: its own rows enter only as OWN, and
    every other term is an older matvec's output (already stored when this one runs)."""
    if not n.type.lanes:
        return None
    for a in (u for u in _walk_users(n, users) if u.op is Op.ADD):
        r = _residual_terms(a, by)
        if r is None:
            continue
        stream, terms = r
        mine = [t for t in terms if t.value == n.name]
        others = [t for t in terms if t.value != n.name]
        if len(mine) == 1 and mine[0].select == OWN and len(others) <= 1 and \
                all(order[t.value] < order[n.name] for t in others):
            return a, stream, terms
    return None


def _walk_users(n: Node, users, depth: int = 3):
    """Users of n, their users, ... up to `depth` steps (where a residual ADD can sit)."""
    out, frontier = [], [n]
    for _ in range(depth):
        frontier = [u for f in frontier for u in users.get(f.name, [])]
        out += frontier
    return out


def is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0
