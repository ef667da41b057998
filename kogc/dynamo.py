"""`torch.compile(step, backend="kogc")`: the decode step as one kogc kernel.

TorchDynamo hands the backend the step's graph with the module's parameters and buffers lifted to
graph inputs. The backend makes a module of that graph again (the lifted tensors as its buffers, the
token and the position as its inputs), compiles it with kogc.compile, and returns a function that runs
one launch per call. The kernel keeps the KV cache on the device: the model's own cache buffers are
not written (a compiled step continues from the positions it has run itself).

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so `backend="kogc"`
works once kogc is installed.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .errors import KogcError


def _source(node: fx.Node) -> str:
    arg = node.meta.get("grapharg")
    src = getattr(arg, "source", None)
    name = getattr(src, "name", None) if src is not None else None
    return (name() if callable(name) else name) or node.name


class LiftedStep(torch.nn.Module):
    """Dynamo's graph of forward(token, pos) as a module again: every other graph input a buffer."""

    def __init__(self, gm: fx.GraphModule, example_inputs):
        super().__init__()
        self.gm = gm
        self.order: list[str | int] = []
        users = 0
        for i, (node, value) in enumerate(zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)):
            src = _source(node)
            is_state = "self" in src or not (isinstance(value, torch.Tensor) and value.dtype == torch.int64
                                             and value.numel() == 1)
            if is_state:
                name = f"lifted_{i}_" + "".join(c if c.isalnum() else "_" for c in src)[-80:]
                self.register_buffer(name, value, persistent=False)
                self.order.append(name)
            else:
                self.order.append(users)
                users += 1
        if users != 2:
            raise KogcError(f"backend='kogc' compiles a decode step forward(token, pos); this graph takes {users} "
                            f"inputs besides the module's tensors")

    def forward(self, token, pos):
        user = (token, pos)
        return self.gm(*[user[x] if isinstance(x, int) else getattr(self, x) for x in self.order])


def kogc_backend(gm: fx.GraphModule, example_inputs, **options):
    """A TorchDynamo backend: kogc.compile of the step (options as kogc.compile's, e.g. target)."""
    from .api import compile as kogc_compile
    step = LiftedStep(gm, example_inputs)
    ck = kogc_compile(step, **options)
    where = [i for i, x in enumerate(step.order) if isinstance(x, int)]

    def run(*args):
        token, pos = (args[i] for i in where)
        logits, nxt = ck.step(int(token), int(pos))
        return logits, torch.tensor(nxt, device=logits.device)

    run.kernel = ck
    return run
