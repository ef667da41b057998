"""The usual stacks, each returning `run(i)` that performs one decode step."""
from __future__ import annotations

import copy

import torch


def trim_kv_cache(model, positions: int):
    """A copy of `model` whose KV caches hold only the first `positions` positions (same weights,
    shared): the same function at every position below that, but attention masks and reads only
    them instead of the whole max_position_embeddings. The fairer baseline for a fixed-context bench:
    a static-shape step (eager or one CUDA graph) must otherwise attend over the whole cache."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}   # shared, not copied
    trimmed = copy.deepcopy(model, memo)
    for mod in trimmed.modules():
        for name, buf in list(mod._buffers.items()):
            if buf is not None and name.endswith(("k_cache", "v_cache")):
                if buf.shape[2] < positions:
                    raise ValueError(f"cannot trim {name} of {buf.shape[2]} positions to {positions}")
                mod._buffers[name] = buf[:, :, :positions].clone()
    return trimmed


def _inputs(device: str, context: int):
    return torch.tensor(1, device=device), torch.tensor(context, device=device)


def eager_step(model, device: str, context: int):
    tok, pos = _inputs(device, context)

    def run(i):
        with torch.no_grad():
            model(tok, pos)
    return run


def capture(fn, *args):
    """fn(*args) captured in ONE CUDA graph, after three warm-up runs on a side stream."""
    return capture_with_output(fn, *args)[0]


def capture_with_output(fn, *args):
    """(graph, out): fn(*args) captured in ONE CUDA graph after three warm-up runs on a side stream, and the
    tensors the captured call returned (each replay writes them again)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = fn(*args)
    return graph, out


def graph_step(model, device: str, context: int):
    """The whole decode step captured in ONE CUDA graph, replayed (fixed token and position)."""
    if device != "cuda":
        raise RuntimeError("CUDA graphs need a GPU")
    tok, pos = _inputs(device, context)
    graph = capture(model, tok, pos)
    return lambda i: graph.replay()


def compiled_graph_step(model, device: str, context: int):
    """torch.compile(mode="max-autotune-no-cudagraphs"), then the step captured in one CUDA graph."""
    if device != "cuda":
        raise RuntimeError("CUDA graphs need a GPU")
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs", fullgraph=False)
    tok, pos = _inputs(device, context)
    graph = capture(compiled, tok, pos)
    return lambda i: graph.replay()


def trimmed_graph_step(model, device: str, context: int, positions: int):
    """One CUDA graph of the step with the KV cache trimmed to the positions the bench uses."""
    return graph_step(trim_kv_cache(model, positions), device, context)
