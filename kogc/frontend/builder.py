"""What both frontends' lowerings share: the IR nodes built so far, their types, and where in the
model's source the node being lowered comes from (for errors and for the IR's source column)."""
from __future__ import annotations

from ..ir.graph import Node, Op, ValueType
from ..ir.typing import IRTypeError, infer
from .trace import FrontendError


class IRBuilder:
    def __init__(self):
        self.nodes: list[Node] = []
        self.types: dict[str, ValueType] = {}
        self.where = ""          # file:line: code of the op being lowered
        self.scope = ""          # its module path, e.g. model.layers.3.attention

    def fail(self, msg: str):
        raise FrontendError(f"{msg} at {self.where or '<unknown source>'}")

    def emit(self, op: Op, inputs: list[str], attrs: dict | None = None, type_: ValueType | None = None,
             hint: str = "") -> str:
        """Append a node (its type from the op's type rule unless given); returns its value's name."""
        attrs = attrs or {}
        if type_ is None:
            try:
                type_ = infer(op, [self.types[i] for i in inputs], attrs)
            except IRTypeError as e:
                self.fail(f"{op.value}: {e}")
        name = f"%{len(self.nodes)}" + (f".{hint}" if hint else "")
        self.nodes.append(Node(name, op, tuple(inputs), type_, attrs, self.where, self.scope))
        if type_ is not None:
            self.types[name] = type_
        return name
