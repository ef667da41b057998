"""Trace a decode-step module with torch.fx, turning tracing failures into errors a user can act on."""
from __future__ import annotations

import os
import re
import traceback

import torch
import torch.fx as fx

from ..errors import KogcError

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


class FrontendError(KogcError):
    """A model kogc cannot compile; the message names the op and the user's source line."""


def user_frame(stack_trace: str | None) -> str:
    """'file:line: code' of the innermost frame outside torch in an fx stack trace."""
    if not stack_trace:
        return ""
    frames = [m for m in _FRAME.finditer(stack_trace) if not m.group(1).startswith(_TORCH_DIR)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.relpath(f.group(1))}:{f.group(2)}: {f.group(4).strip()}"


def _user_frame_of_exception(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and not f.filename.startswith(os.path.dirname(__file__))]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.relpath(f.filename)}:{f.lineno}: {(f.line or '').strip()}"


def trace(module: torch.nn.Module) -> fx.GraphModule:
    """Symbolically trace `module.forward`. Data-dependent control flow and other untraceable code
    raise FrontendError naming the line."""
    tracer = fx.Tracer()
    tracer.record_stack_traces = True
    name = type(module).__name__
    try:
        graph = tracer.trace(module)
    except fx.proxy.TraceError as e:
        where = _user_frame_of_exception(e)
        raise FrontendError(f"cannot trace {name}.forward: {e} "
                            f"(data-dependent control flow is not supported in a decode step) at {where}") from None
    except Exception as e:  # anything else the tracer chokes on, e.g. len() of a proxy
        where = _user_frame_of_exception(e)
        raise FrontendError(f"cannot trace {name}.forward: {type(e).__name__}: {e} at {where}") from None
    return fx.GraphModule(tracer.root, graph, name)
