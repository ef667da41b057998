"""Readable text and JSON for the IR."""
from __future__ import annotations

import json

from .graph import Graph, Node, Op, ValueType


def format_node(n: Node) -> str:
    attrs = ", ".join(f"{k}={v}" for k, v in n.attrs.items())
    args = ", ".join(n.inputs)
    body = f"{n.op.value}({args}{'; ' + attrs if attrs and args else attrs})"
    if n.op is Op.OUTPUT:
        return f"  return {args}"
    return f"  {n.name:<28} = {body:<60} : {n.type}"


def to_text(graph: Graph, sources: bool = False) -> str:
    head = ", ".join(f"{k}={v}" for k, v in graph.meta.items())
    lines = [f"graph({head}) {{"]
    scope = None
    for n in graph.nodes:
        if n.scope != scope and n.op not in (Op.PARAM, Op.STATE):
            scope = n.scope
            lines.append(f"  # {scope or '<top>'}")
        line = format_node(n)
        lines.append(line + (f"   # {n.source}" if sources and n.source else ""))
    lines.append("}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(graph.count().items()))
    lines.append(f"# {len(graph.nodes)} nodes: {counts}")
    return "\n".join(lines)


def to_json(graph: Graph) -> str:
    nodes = [{"name": n.name, "op": n.op.value, "inputs": list(n.inputs),
              "type": None if n.type is None else {"shape": list(n.type.shape), "dtype": n.type.dtype,
                                                    "lanes": n.type.lanes},
              "attrs": n.attrs, "source": n.source, "scope": n.scope} for n in graph.nodes]
    return json.dumps({"meta": graph.meta, "nodes": nodes}, indent=1)


def from_json(text: str) -> Graph:
    d = json.loads(text)
    nodes = [Node(x["name"], Op(x["op"]), tuple(x["inputs"]),
                  None if x["type"] is None else ValueType(tuple(x["type"]["shape"]), x["type"]["dtype"],
                                                           x["type"]["lanes"]),
                  x["attrs"], x["source"], x["scope"]) for x in d["nodes"]]
    return Graph(nodes, d["meta"])
