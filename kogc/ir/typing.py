"""Type rules: the output type of every op from its input types and attrs.

One function per op kind, used both when the frontend builds a node and when the verifier checks
one, so the two can never disagree. A rule raises IRTypeError saying what does not fit.
"""
from __future__ import annotations

from .graph import ACTIVATION_OPS, ELEMENTWISE_BINARY, Op, ValueType


class IRTypeError(ValueError):
    pass


def _lanes_of(types: list[ValueType]) -> int:
    lanes = {t.lanes for t in types if t.lanes}
    if len(lanes) > 1:
        raise IRTypeError(f"inputs have different lane counts {sorted(lanes)}")
    return lanes.pop() if lanes else 0


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise IRTypeError(f"shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y))
    return tuple(reversed(out))


def _float(t: ValueType, what: str) -> None:
    if t.dtype == "int64":
        raise IRTypeError(f"{what} must be floating point, got {t}")


def _scalar_int(t: ValueType, what: str) -> None:
    if t.shape != () or t.dtype != "int64" or t.lanes:
        raise IRTypeError(f"{what} must be an int64 scalar, got {t}")


def infer(op: Op, ins: list[ValueType], attrs: dict) -> ValueType | None:
    """The type of op's result; `ins` are the input types in order."""
    if op in ELEMENTWISE_BINARY:
        a, b = ins
        if a.dtype != b.dtype:
            raise IRTypeError(f"dtypes differ: {a} and {b}")
        return ValueType(_broadcast(a.shape, b.shape), a.dtype, _lanes_of(ins))
    rule = _RULES.get(op)
    if rule is None:
        raise IRTypeError(f"no type rule for op {op.value}")
    return rule(ins, attrs)


def _leaf(ins, attrs):
    raise IRTypeError("leaf nodes carry their own type")


def _embed(ins, attrs):
    table, tok = ins
    if len(table.shape) != 2 or table.lanes:
        raise IRTypeError(f"embedding table must be a replicated [V, D] matrix, got {table}")
    _scalar_int(tok, "token")
    return ValueType((table.shape[1],), table.dtype)


def _broadcast_lanes(ins, attrs):
    (x,) = ins
    if x.lanes:
        raise IRTypeError(f"broadcast_lanes needs a replicated value, got {x}")
    return ValueType(x.shape, x.dtype, attrs["lanes"])


def _same(ins, attrs):
    _float(ins[0], "input")
    return ins[0]


def _rmsnorm(ins, attrs):
    (x,) = ins
    group = attrs.get("group")
    if group and (len(x.shape) != 1 or x.shape[0] % group):
        raise IRTypeError(f"an RMSNorm per group of {group} needs a vector of whole groups, got {x}")
    return x


def _layernorm(ins, attrs):
    x = ins[0]
    _float(x, "input")
    if len(x.shape) != 1:
        raise IRTypeError(f"a LayerNorm needs a vector, got {x}")
    for what, a in zip(("weight", "bias"), ins[1:]):
        if a.shape != x.shape or a.dtype != x.dtype or a.lanes not in (0, x.lanes):
            raise IRTypeError(f"a LayerNorm's {what} must be [{x.shape[0]}] of {x.dtype}, shared or per lane as x, got {a}")
    return x


def _matvec(ins, attrs):
    w, x = ins[:2]
    if len(w.shape) != 2 or len(x.shape) != 1 or w.shape[1] != x.shape[0]:
        raise IRTypeError(f"matvec needs W [N, K] and x [K], got {w} and {x}")
    if w.dtype != x.dtype:
        raise IRTypeError(f"matvec dtypes differ: {w} and {x}")
    if w.lanes and x.lanes != w.lanes:
        raise IRTypeError(f"a lane-batched weight {w} needs a lane-batched input with as many lanes, got {x}")
    if len(ins) == 3:       # a bias, added to the product
        b = ins[2]
        if b.shape != (w.shape[0],) or b.dtype != w.dtype or b.lanes not in (0, w.lanes):
            raise IRTypeError(f"a matvec's bias must be [{w.shape[0]}] of {w.dtype}, shared or per lane as W, got {b}")
    if attrs.get("softcap") is not None and (w.lanes or len(ins) == 3 or not isinstance(attrs["softcap"], float)):
        raise IRTypeError(f"a soft cap ({attrs['softcap']!r}) only on a shared, unbiased LM head, as a float")
    return ValueType((w.shape[0],), w.dtype, _lanes_of(ins))


def _rope(ins, attrs):
    x, pos = ins
    _scalar_int(pos, "position")
    hd = attrs["head_dim"]
    if len(x.shape) != 1 or x.shape[0] % hd or hd % 2:
        raise IRTypeError(f"rope needs x [heads*{hd}] with an even head_dim, got {x}")
    return x


def _kv_write(ins, attrs):
    cache, x, pos = ins
    _scalar_int(pos, "position")
    if len(cache.shape) != 3 or x.shape != (cache.shape[0] * cache.shape[2],) or x.lanes != cache.lanes:
        raise IRTypeError(f"kv_write needs cache [kv, S, hd] and x [kv*hd] with the same lanes, got {cache} and {x}")
    if x.dtype != cache.dtype:
        raise IRTypeError(f"kv_write dtypes differ: {cache} and {x}")
    return cache


def _attention(ins, attrs):
    q, k, v, pos = ins
    _scalar_int(pos, "position")
    if k != v or len(k.shape) != 3:
        raise IRTypeError(f"attention needs equal K and V caches [kv, S, hd], got {k} and {v}")
    kv, _, hd = k.shape
    if len(q.shape) != 1 or q.shape[0] % (kv * hd) or q.lanes != k.lanes:
        raise IRTypeError(f"attention query {q} does not fit caches {k} (needs a multiple of {kv}*{hd} per lane)")
    window = attrs.get("window", 0)
    if not isinstance(window, int) or window < 0:
        raise IRTypeError(f"attention window {window!r}: a number of positions >= 1 (or absent)")
    if not isinstance(attrs.get("softcap", 0.0), float):
        raise IRTypeError(f"attention soft cap {attrs['softcap']!r}: a float (or absent)")
    alibi = attrs.get("alibi")
    if alibi is not None and (not isinstance(alibi, dict) or len(alibi.get("slopes", [])) != q.shape[0] // hd or
                              not isinstance(alibi.get("at"), int) or attrs.get("softcap")):
        raise IRTypeError(f"attention ALiBi {alibi!r}: a slope per query head ({q.shape[0] // hd}) and an integer "
                          f"offset, without a soft cap")
    return q


def _lane_reduce(ins, attrs):
    (x,) = ins
    if not x.lanes:
        raise IRTypeError(f"a lane reduction needs a lane-batched value, got {x}")
    return ValueType(x.shape, x.dtype, 0)


def _lane_sum_others(ins, attrs):
    (x,) = ins
    if not x.lanes:
        raise IRTypeError(f"lane_sum_others needs a lane-batched value, got {x}")
    return x


def _argmax(ins, attrs):
    (x,) = ins
    if len(x.shape) != 1 or x.lanes:
        raise IRTypeError(f"argmax needs a replicated vector, got {x}")
    return ValueType((), "int64")


_RULES = {
    Op.INPUT: _leaf, Op.PARAM: _leaf, Op.STATE: _leaf,
    Op.EMBED: _embed,
    Op.BROADCAST_LANES: _broadcast_lanes,
    Op.RMSNORM: _rmsnorm, Op.LAYERNORM: _layernorm, Op.SCALE: _same,
    **{act: _same for act in ACTIVATION_OPS},
    Op.MATVEC: _matvec,
    Op.ROPE: _rope,
    Op.KV_WRITE: _kv_write,
    Op.ATTENTION: _attention,
    Op.LANE_SUM: _lane_reduce, Op.LANE_MEAN: _lane_reduce,
    Op.LANE_SUM_OTHERS: _lane_sum_others,
    Op.ARGMAX: _argmax,
    Op.OUTPUT: lambda ins, attrs: None,
}

ARITY = {Op.EMBED: 2, Op.BROADCAST_LANES: 1, Op.RMSNORM: 1, Op.LAYERNORM: (1, 2, 3), Op.SCALE: 1,
         **{act: 1 for act in ACTIVATION_OPS},
         Op.MATVEC: (2, 3),
         Op.ROPE: 2, Op.KV_WRITE: 3, Op.ATTENTION: 4, Op.LANE_SUM: 1, Op.LANE_MEAN: 1,
         Op.LANE_SUM_OTHERS: 1, Op.ARGMAX: 1, Op.MUL: 2, Op.ADD: 2, Op.SUB: 2,
         Op.INPUT: 0, Op.PARAM: 0, Op.STATE: 0}
