"""The dataflow IR as plain data: typed values, ops from an explicit enum, a graph in SSA form.

A value's type is its shape *per lane*, its dtype, and `lanes`: 0 for one value shared by every
lane (replicated), L for a lane-batched value (L copies, one per lane, each of `shape`). Keeping
the lane axis out of `shape` makes lanes first-class: a later stage splits a lane-batched node
into L per-lane tasks without re-deriving which axis was the lane axis.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Op(enum.Enum):
    # leaves
    INPUT = "input"                  # attrs: index (position among the step's inputs)
    PARAM = "param"                  # attrs: name (the weight's qualified name in the module)
    STATE = "state"                  # persistent state (the KV cache); attrs: name
    # model ops
    EMBED = "embed"                  # (table [V, D], token []) -> [D]
    BROADCAST_LANES = "broadcast_lanes"  # replicated x -> lane-batched copies; attrs: lanes
    RMSNORM = "rmsnorm"              # x / sqrt(mean(x^2) + eps), fp32 inside; attrs: eps, and `group`: each
                                     # consecutive `group` elements normed alone (a norm per head), else all
    LAYERNORM = "layernorm"          # (x [D][, weight [D][, bias [D]]]) -> (x - mean) / sqrt(var + eps) * weight + bias,
                                     # fp32 inside, rounded once (F.layer_norm); attrs: eps
    MUL = "mul"
    ADD = "add"
    SUB = "sub"
    SCALE = "scale"                  # x * constant; attrs: factor
    SILU = "silu"
    GELU = "gelu"                    # erf's GELU (torch's approximate="none")
    GELU_TANH = "gelu_tanh"          # tanh's approximation (approximate="tanh": Gemma's gelu_pytorch_tanh)
    RELU = "relu"
    RELU2 = "relu2"       # squared ReLU, relu(x)^2 (Nemotron, Arcee)
    XIELU = "xielu"                  # Apertus's activation: x > 0: alpha_p x^2 + beta x, else (expm1(min(x, eps)) - x)
                                     # alpha_n + beta x; attrs: alpha_p, alpha_n, beta, eps (each layer its own)
    MATVEC = "matvec"                # (W [N, K], x [K][, bias [N]]) -> [N], per lane when W is lane-batched; attrs:
                                     # softcap c on the LM head: c * tanh(W x) (Gemma 2's logits, 1/c in W's view)
    ROPE = "rope"                    # interleaved pairs; (x [n*hd], pos); attrs: head_dim, theta
    KV_WRITE = "kv_write"            # (cache [kv, S, hd], x [kv*hd], pos) -> the cache, row pos written
    ATTENTION = "attention"          # (q [nq*hd], k_cache, v_cache, pos) -> [nq*hd]; GQA within a lane; attrs:
                                     # window W (a sliding window: positions max(0, pos-W+1)..pos; absent: 0..pos),
                                     # softcap c (scores s = q.k / sqrt(hd) taken as c * tanh(s / c): Gemma 2's)
    LANE_SUM = "lane_sum"            # lane-batched x -> replicated sum over lanes (immediate reduction)
    LANE_SUM_OTHERS = "lane_sum_others"  # lane-batched x -> lane l gets sum over j != l (delayed reduction)
    LANE_MEAN = "lane_mean"          # lane-batched x -> replicated mean over lanes
    ARGMAX = "argmax"                # x [N] -> int64 [] (first maximal index)
    OUTPUT = "output"                # the step's results, in order


LEAF_OPS = frozenset({Op.INPUT, Op.PARAM, Op.STATE})
ELEMENTWISE_BINARY = frozenset({Op.MUL, Op.ADD, Op.SUB})
ACTIVATION_OPS = (Op.SILU, Op.GELU, Op.GELU_TANH, Op.RELU, Op.RELU2, Op.XIELU)   # elementwise, one input
DTYPES = ("float32", "float16", "bfloat16", "int64")


@dataclass(frozen=True)
class ValueType:
    shape: tuple[int, ...]
    dtype: str
    lanes: int = 0          # 0: replicated; L: one value of `shape` per lane

    def __str__(self) -> str:
        dims = "x".join(map(str, self.shape)) or "scalar"
        lane = f"L{self.lanes}:" if self.lanes else ""
        return f"{lane}{self.dtype}[{dims}]"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * max(self.lanes, 1)


@dataclass(frozen=True)
class Node:
    """One op producing one value named `name`. `attrs` holds plain JSON-able data."""
    name: str
    op: Op
    inputs: tuple[str, ...]
    type: ValueType | None          # None only for OUTPUT
    attrs: dict = field(default_factory=dict, hash=False, compare=False)
    source: str = ""                # file:line of the user's model that produced it
    scope: str = ""                 # module path, e.g. model.layers.3.attention

    @property
    def layer(self) -> int | None:
        """The decoder layer index from the scope (model.layers.<i>...), if any."""
        parts = self.scope.split(".")
        for a, b in zip(parts, parts[1:]):
            if a == "layers" and b.isdigit():
                return int(b)
        return None


@dataclass
class Graph:
    """Nodes in a valid execution order (every input defined earlier). The last node is OUTPUT."""
    nodes: list[Node]
    meta: dict = field(default_factory=dict)     # e.g. {"num_lanes": 8, "model": "Laneformer"}

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def to_networkx(self):
        import networkx as nx
        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, op=n.op)
            for i in n.inputs:
                g.add_edge(i, n.name)
        return g

    @property
    def weight_dtype(self) -> str:
        """The model's dtype: that of its matvec weights."""
        return next(n.type.dtype for n in self.nodes if n.op is Op.MATVEC)

    def count(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for n in self.nodes:
            c[n.op.value] = c.get(n.op.value, 0) + 1
        return c
