"""The dataflow IR: plain data, a verifier, a printer and a reference executor."""
from .executor import execute, new_state
from .graph import Graph, Node, Op, ValueType
from .printer import from_json, to_json, to_text
from .verify import IRVerifyError, verify

__all__ = ["Graph", "Node", "Op", "ValueType", "execute", "new_state", "to_text", "to_json", "from_json",
           "verify", "IRVerifyError"]
