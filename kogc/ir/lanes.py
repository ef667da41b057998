"""An ordinary decoder as L lanes: tensor parallelism in the Laneformer's terms, so that `--gpus` spreads it.

A one-lane decoder (kogc.frontend.aten) becomes a Laneformer whose every layer sums its lanes at once (the
Laneformer's early layers, `docs/laneformer.md`): lane l holds the l-th of L equal groups of KV heads with
their query heads, and the l-th slice of the MLP's width. The residual stream, its norms and the final norm
are the same on every lane ("replicated"); a matvec of a replicated input is cut by rows (Q, K, V, the MLP's
first matrices: each lane's output is its slice, "split"); a matvec of a split input is cut by columns (the
attention's output projection, the MLP's last matrix: each lane's output is a partial sum, "partial"), and a
residual add of a partial sum takes the sum over all lanes (LANE_SUM, then BROADCAST_LANES). Weights and the
KV caches are the model's, seen through view steps (`lanes`, `lane_cols`, `lane_heads`, `tile`; kogc.ir.views); a
tied LM head reads the embedding's table as a PARAM of its own (`rows 0 V`), which the ranks cut by vocabulary.
The fp16 partial sums are rounded before they are added, as in any tensor-parallel stack.

A biased output projection or last MLP matrix keeps its bias on the first lane alone (`lane_first`: added once to
the lanes' sum); parallel attention and MLP blocks (their partial sums added before the residual: GPT-NeoX's,
Phi's) add each sum over the lanes to h in turn.

Refused with one line: norms of a partial sum (Gemma 2 and 3's sublayer output norms), a norm over all heads at
once (OLMo 2's), ALiBi (a slope per query head), KV head or width counts L does not divide."""
from __future__ import annotations

import dataclasses

from ..errors import KogcError
from .graph import ACTIVATION_OPS, Graph, Node, Op, ValueType
from .typing import infer
from .verify import verify
from .views import view_name

REPLICATED, SPLIT, PARTIAL, SHARED = "replicated", "split", "partial", "shared"
# ops computed lane by lane: the result keeps its input's kind
LANEWISE = (Op.SCALE, *ACTIVATION_OPS, Op.ROPE)


class LanesError(KogcError):
    """A one-lane decoder that cannot be cut into lanes (tensor parallelism over `--gpus`)."""


def heads_as_lanes(graph: Graph, L: int) -> Graph:
    """The one-lane `graph` as L lanes (the module doc). L == 1 or a graph with lanes already: unchanged."""
    if L == 1 or graph.meta.get("num_lanes", 1) != 1:
        return graph
    by = graph.by_name()
    kind: dict[str, str] = {}
    weight_role: dict[str, str] = {}      # a lane PARAM -> "rows" | "cols" | "first" (a bias on lane 0 alone)
    terms: dict[str, list[str]] = {}      # a partial sum -> the matvecs whose outputs it adds
    users = graph.users()

    def fail(n: Node, why: str):
        raise LanesError(f"--gpus {L}: {why} ({n.name}, {n.source or '?'})")

    def role(param: str, r: str, n: Node):
        if weight_role.setdefault(param, r) != r:
            fail(n, f"the weight {by[param].attrs['name']} is cut both by rows and by columns")

    for n in graph.nodes:
        ks = [kind.get(i, SHARED) for i in n.inputs]
        lane_ins = {k for k in ks if k != SHARED}
        if n.op is Op.STATE:
            kind[n.name] = "cache"
        elif n.op is Op.PARAM:
            if n.type.lanes:
                kind[n.name] = "weight"
        elif n.op in (Op.INPUT, Op.OUTPUT):
            pass
        elif n.op is Op.LANE_MEAN:
            if ks[0] != REPLICATED:
                fail(n, "the final norm of a value that is not the residual stream")
        elif not n.type.lanes:
            pass                                      # the embedding, the LM head, the argmax: as they are
        elif n.op is Op.ATTENTION and n.attrs.get("alibi"):
            fail(n, "attention with ALiBi (a slope per query head) is not cut over GPUs")
        elif n.op is Op.BROADCAST_LANES:
            kind[n.name] = REPLICATED
        elif n.op is Op.MATVEC:
            x = ks[1]
            if x == REPLICATED:
                kind[n.name] = SPLIT
                for w in n.inputs[:1] + n.inputs[2:]:
                    role(w, "rows", n)
            elif x == SPLIT:
                kind[n.name] = PARTIAL
                terms[n.name] = [n.name]
                role(n.inputs[0], "cols", n)
                if len(n.inputs) == 3:          # its bias on the first lane alone: added once to the lanes' sum
                    role(n.inputs[2], "first", n)
            else:
                fail(n, f"a linear layer of a {x} value")
        elif n.op is Op.KV_WRITE:
            if ks[1] != SPLIT:
                fail(n, "the cache is written from a value that is not one projection's rows")
            kind[n.name] = SPLIT
        elif n.op is Op.ATTENTION:
            if {ks[0], ks[1], ks[2]} != {SPLIT}:
                fail(n, "attention of values that are not projections' rows")
            kv = by[n.inputs[1]].type.shape[0]
            if kv % L:
                fail(n, f"{L} GPUs do not divide the {kv} KV heads (each GPU takes whole KV heads with their "
                        f"query heads)")
            kind[n.name] = SPLIT
        elif n.op in LANEWISE:
            kind[n.name] = ks[0]
        elif n.op in (Op.RMSNORM, Op.LAYERNORM):
            if ks[0] == SPLIT and n.op is Op.RMSNORM and n.attrs.get("group"):
                kind[n.name] = SPLIT                  # a norm per head (Qwen3's q and k norms)
            elif ks[0] == REPLICATED:
                kind[n.name] = REPLICATED
            else:
                fail(n, "a norm of a projection's whole output (over all heads, or of a partial sum) is not cut "
                        "over GPUs")
        elif n.op is Op.MUL:
            if lane_ins == {REPLICATED} or lane_ins == {SPLIT}:
                kind[n.name] = lane_ins.pop()
            else:
                fail(n, f"a product of {' and '.join(sorted(lane_ins))} values")
        elif n.op in (Op.ADD, Op.SUB):
            if lane_ins in ({REPLICATED}, {SPLIT}):
                kind[n.name] = lane_ins.pop()
            elif lane_ins == {REPLICATED, PARTIAL} and n.op is Op.ADD:
                kind[n.name] = REPLICATED
            elif lane_ins == {PARTIAL} and n.op is Op.ADD and all(u.op is Op.ADD for u in users[n.name]):
                kind[n.name] = PARTIAL          # parallel attention and MLP blocks: their sums added one by one
                terms[n.name] = terms[n.inputs[0]] + terms[n.inputs[1]]
            else:
                fail(n, f"{n.op.value} of {' and '.join(sorted(lane_ins))} values")
        else:
            fail(n, f"{n.op.value} is not cut over GPUs")

    out: list[Node] = []
    types: dict[str, ValueType] = {}

    def add(node: Node) -> Node:
        if node.op not in (Op.INPUT, Op.PARAM, Op.STATE, Op.OUTPUT):
            node = dataclasses.replace(node, type=infer(node.op, [types[i] for i in node.inputs], node.attrs))
        types[node.name] = node.type
        out.append(node)
        return node

    def cut(n: Node, axis: int, what: str) -> tuple[int, ...]:
        shape = list(n.type.shape)
        if shape[axis] % L:
            fail(n, f"{L} GPUs do not divide {what} ({shape[axis]})")
        shape[axis] //= L
        return tuple(shape)

    # a tied LM head (the embedding's table): its own PARAM, which the ranks cut into vocabulary shards
    argmax = next((n for n in graph.nodes if n.op is Op.ARGMAX), None)
    head = by[argmax.inputs[0]] if argmax is not None else None
    tied = head is not None and head.op is Op.MATVEC and any(u.op is Op.EMBED for u in users[head.inputs[0]])
    for n in graph.nodes:
        ins = list(n.inputs)
        if tied and n.name == head.name:
            table = by[n.inputs[0]]
            rows = table.type.shape[0]
            view = list(table.attrs.get("view", [])) + [["rows", 0, rows]]
            source = table.attrs.get("source", table.attrs["name"])
            own = add(Node(f"{table.name}.head", Op.PARAM, (), table.type,
                           {"name": view_name(source, view), "source": source, "view": view}, table.source, table.scope))
            ins[0] = own.name
        if n.op is Op.PARAM and kind.get(n.name) == "weight":
            r = weight_role.get(n.name)
            view = [list(s) for s in n.attrs.get("view", []) if s[0] != "lane"]
            if r == "rows":
                shape, step = cut(n, 0, "the rows of " + n.attrs["name"]), ["lanes", L]
            elif r == "cols":
                shape, step = cut(n, 1, "the columns of " + n.attrs["name"]), ["lane_cols", L]
            elif r == "first":
                shape, step = n.type.shape, ["lane_first", L]
            else:
                fail(n, "a lane weight that no linear layer reads")
            source = n.attrs.get("source", n.attrs["name"])
            attrs = {**n.attrs, "source": source, "view": view + [step], "name": view_name(source, view + [step])}
            add(dataclasses.replace(n, type=ValueType(shape, n.type.dtype, L), attrs=attrs))
            continue
        if n.op is Op.STATE:
            shape = cut(n, 0, f"the KV heads of {n.attrs['name']}")
            attrs = {**n.attrs, "view": list(n.attrs.get("view", [])) + [["lane_heads", L]]}
            add(dataclasses.replace(n, type=ValueType(shape, n.type.dtype, L), attrs=attrs))
            continue
        if n.op is Op.PARAM and any(kind.get(u.name) == SPLIT and u.op is Op.MUL for u in users[n.name]):
            tile = next((s for s in n.attrs.get("view", []) if s[0] == "tile"), None)
            if tile is None or tile[1] % L:
                fail(n, "a scale of a projection's whole output (not one per head) is not cut over GPUs")
            view = [["tile", tile[1] // L] if s[0] == "tile" else list(s) for s in n.attrs["view"]]
            attrs = {**n.attrs, "view": view, "name": view_name(n.attrs.get("source", n.attrs["name"]), view)}
            add(dataclasses.replace(n, type=ValueType(cut(n, 0, "the heads"), n.type.dtype, 0), attrs=attrs))
            continue
        if n.op is Op.BROADCAST_LANES:
            add(dataclasses.replace(n, attrs={**n.attrs, "lanes": L}))
            continue
        if kind.get(n.name) == PARTIAL and n.op is Op.ADD:
            continue                            # two blocks' partial sums: added to h one by one, below
        if kind.get(n.name) == REPLICATED and n.op is Op.ADD and PARTIAL in (kind.get(i) for i in n.inputs):
            # h + (the sum over all lanes of each partial sum): every lane gets the same
            part = next(i for i in n.inputs if kind.get(i) == PARTIAL)
            h = next(i for i in n.inputs if i != part)
            for j, term in enumerate(terms[part]):
                total = add(Node(f"{term}.lanes_sum", Op.LANE_SUM, (term,), None, {}, n.source, n.scope))
                every = add(Node(f"{term}.all_lanes", Op.BROADCAST_LANES, (total.name,), None, {"lanes": L},
                                 n.source, n.scope))
                last = j == len(terms[part]) - 1
                h = add(Node(n.name if last else f"{n.name}.{j}", Op.ADD, (h, every.name), None, {}, n.source,
                             n.scope)).name
            continue
        add(dataclasses.replace(n, inputs=tuple(ins)))
    return verify(Graph(out, {**graph.meta, "num_lanes": L, "lanes_from_heads": True}), f"heads as {L} lanes")
