"""The IR verifier: runs after every pass. Names the node and what is wrong with it."""
from __future__ import annotations

import networkx as nx

from .graph import DTYPES, LEAF_OPS, Graph, Op
from .typing import ARITY, IRTypeError, infer


class IRVerifyError(ValueError):
    pass


def verify(graph: Graph, stage: str = "") -> Graph:
    """Check SSA form, definition before use, acyclicity, arity, dtypes and every op's type rule.

    Returns the graph unchanged so passes can be chained as `verify(pass_(g), "pass")`."""
    where = f" after {stage}" if stage else ""

    def fail(node, msg):
        src = f" ({node.source})" if node is not None and node.source else ""
        name = f"node {node.name} ({node.op.value})" if node is not None else "graph"
        raise IRVerifyError(f"IR invalid{where}: {name}{src}: {msg}")

    if not graph.nodes or graph.nodes[-1].op is not Op.OUTPUT:
        fail(None, "the last node must be the single OUTPUT")
    defined: dict[str, object] = {}
    for node in graph.nodes:
        if node.name in defined:
            fail(node, "value defined twice")
        if node.op is Op.OUTPUT and node is not graph.nodes[-1]:
            fail(node, "OUTPUT must be the last node")
        for i in node.inputs:
            if i not in defined:
                fail(node, f"uses {i} before it is defined")
        arity = ARITY.get(node.op)
        if arity is not None and len(node.inputs) not in (arity if isinstance(arity, tuple) else (arity,)):
            fail(node, f"takes {' or '.join(map(str, arity)) if isinstance(arity, tuple) else arity} inputs, "
                       f"has {len(node.inputs)}")
        if node.op is not Op.OUTPUT:
            if node.type is None or node.type.dtype not in DTYPES:
                fail(node, f"bad type {node.type}")
            if any(s <= 0 for s in node.type.shape):
                fail(node, f"non-positive dimension in {node.type}")
        if node.op not in LEAF_OPS:
            try:
                want = infer(node.op, [defined[i].type for i in node.inputs], node.attrs)
            except IRTypeError as e:
                fail(node, str(e))
            if want != node.type:
                fail(node, f"type {node.type} but its inputs give {want}")
        defined[node.name] = node
    if not nx.is_directed_acyclic_graph(graph.to_networkx()):
        cycle = nx.find_cycle(graph.to_networkx())
        fail(None, f"cycle {cycle}")
    return graph
