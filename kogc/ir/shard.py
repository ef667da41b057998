"""Delayed tensor parallelism at the IR level: the graph one rank of G runs.

With L lanes on G ranks, rank r owns lanes r*L/G .. (r+1)*L/G - 1. Its graph is the model's with
every lane-batched value holding only those lanes (`lanes` = L/G), laned weights and caches read
from lane `lane0` on, and the LM head cut to a vocabulary shard. The lane reductions keep their
meaning over ALL lanes (attrs["ranks"] = G): a later stage splits each into the rank's own lanes
and the sums its peers send. The graph of one rank is thus not executable on its own; the reference
for a sharded run is the unsharded graph.
"""
from __future__ import annotations

import dataclasses

from ..errors import KogcError
from .graph import Graph, Node, Op
from .verify import verify

LANE_REDUCTIONS = (Op.LANE_SUM, Op.LANE_SUM_OTHERS, Op.LANE_MEAN)


class ShardError(KogcError):
    """A model or a rank count that delayed tensor parallelism cannot split."""


def vocab_shard(vocab: int, ranks: int, rank: int) -> tuple[int, int]:
    """(first row, rows) of the LM head rank `rank` of `ranks` holds: contiguous, sizes differ by <= 1."""
    lo, hi = rank * vocab // ranks, (rank + 1) * vocab // ranks
    return lo, hi - lo


def check_shardable(graph: Graph, ranks: int) -> None:
    """Raise ShardError naming why `graph` cannot run on `ranks` ranks (lanes, their reductions)."""
    L = graph.meta.get("num_lanes", 0)
    if ranks < 1:
        raise ShardError(f"gpus must be >= 1, got {ranks}")
    if ranks == 1:
        return
    if not L:
        raise ShardError(f"--gpus {ranks}: the model {graph.meta.get('model', '?')} has no lanes; delayed tensor "
                         f"parallelism spreads a Laneformer's lanes over GPUs")
    if L == 1:          # (kogc.ir.lanes cuts an ordinary decoder into G lanes where it compiles, checks, runs, benches)
        raise ShardError(f"--gpus {ranks}: an ordinary decoder's ranks are cut from its heads by `kogc compile`, "
                         f"`check`, `run` and `bench`; this command takes a model with lanes (a Laneformer)")
    if L % ranks:
        raise ShardError(f"--gpus {ranks} does not divide the model's {L} lanes (each GPU takes L/G lanes)")
    heads = [n for n in graph.nodes if n.op is Op.ARGMAX]
    if len(heads) != 1:
        raise ShardError(f"--gpus {ranks}: the step must end in one argmax over the LM head, found {len(heads)}")


def shard(graph: Graph, ranks: int, rank: int) -> Graph:
    """The graph rank `rank` of `ranks` runs (see the module doc). ranks == 1: the graph itself."""
    check_shardable(graph, ranks)
    if ranks == 1:
        return graph
    L = graph.meta["num_lanes"]
    local = L // ranks
    lane0 = rank * local
    by = graph.by_name()
    argmax = next(n for n in graph.nodes if n.op is Op.ARGMAX)
    head = by[argmax.inputs[0]]
    if head.op is not Op.MATVEC or by[head.inputs[0]].op is not Op.PARAM or head.type.lanes:
        raise ShardError(f"--gpus {ranks}: the argmax's input must be one shared LM head matvec, "
                         f"got {head.op.value} at {head.source or '?'}")
    head_w = by[head.inputs[0]]
    head_b = by[head.inputs[2]] if len(head.inputs) == 3 else None     # (Phi's, GPT-J's: cut as its rows are)
    if head_b is not None and head_b.op is not Op.PARAM:
        raise ShardError(f"--gpus {ranks}: the LM head's bias must be a parameter, got {head_b.op.value} at "
                         f"{head.source or '?'}")
    vocab = head.type.shape[0]
    if vocab < ranks:
        raise ShardError(f"--gpus {ranks}: a vocabulary of {vocab} cannot be cut into {ranks} shards")
    row0, rows = vocab_shard(vocab, ranks, rank)
    cut = {p.name: p for p in (head_w, head_b) if p is not None}     # the parameters cut into vocabulary shards
    for p in cut.values():
        if sum(1 for n in graph.nodes if p.name in n.inputs) != 1:
            raise ShardError(f"--gpus {ranks}: the LM head's {p.attrs['name']} is also used elsewhere")

    out = []
    for n in graph.nodes:
        t, attrs = n.type, dict(n.attrs)
        if t is not None and t.lanes:
            if t.lanes != L:
                raise ShardError(f"{n.name} ({n.source or '?'}) has {t.lanes} lanes, the model {L}")
            t = dataclasses.replace(t, lanes=local)
            if n.op in (Op.PARAM, Op.STATE):
                attrs["lane0"] = lane0
        if n.op is Op.BROADCAST_LANES:
            attrs["lanes"] = local
        if n.op in LANE_REDUCTIONS:
            attrs.update(ranks=ranks, total_lanes=L)
        if n.name in cut:
            attrs["row0"] = row0
            t = dataclasses.replace(t, shape=(rows,) + t.shape[1:])
        if n.name == head.name:
            t = dataclasses.replace(t, shape=(rows,))
        if n.op is Op.ARGMAX:
            attrs.update(ranks=ranks, row0=row0)
        out.append(Node(n.name, n.op, n.inputs, t, attrs, n.source, n.scope))
    meta = dict(graph.meta, ranks=ranks, rank=rank, lane0=lane0, local_lanes=local, vocab=vocab, vocab_row0=row0)
    return verify(Graph(out, meta), f"shard (rank {rank} of {ranks})")
