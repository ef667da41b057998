"""IR passes: pure functions Graph -> Graph. `run_passes` verifies after each one."""
from __future__ import annotations

from .graph import Graph, Node, Op
from .verify import verify


def fuse_delayed_reduction(graph: Graph) -> Graph:
    """SUB(LANE_SUM(x), x) -> LANE_SUM_OTHERS(x): the delayed reduction (each lane gets the other
    lanes' sum) as one op, so later stages see a cross-lane exchange, not a full all-reduce."""
    by_name = graph.by_name()
    out = []
    for n in graph.nodes:
        if n.op is Op.SUB:
            a, b = (by_name[i] for i in n.inputs)
            if a.op is Op.LANE_SUM and a.inputs[0] == b.name:
                n = Node(n.name, Op.LANE_SUM_OTHERS, (b.name,), n.type, {}, n.source, n.scope)
        out.append(n)
    return Graph(out, dict(graph.meta))


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop nodes nothing needs. KV_WRITE has an effect (the cache outlives the step): always kept."""
    by_name = graph.by_name()
    live: set[str] = set()
    work = [n.name for n in graph.nodes if n.op in (Op.OUTPUT, Op.KV_WRITE)]
    while work:
        name = work.pop()
        if name not in live:
            live.add(name)
            work.extend(by_name[name].inputs)
    return Graph([n for n in graph.nodes if n.name in live or n.op is Op.INPUT], dict(graph.meta))


PIPELINE = (fuse_delayed_reduction, dead_code_elimination)


def run_passes(graph: Graph, passes=PIPELINE) -> Graph:
    graph = verify(graph, "frontend")
    for p in passes:
        graph = verify(p(graph), p.__name__)
    return graph


