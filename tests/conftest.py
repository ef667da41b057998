import os
import torch as _torch
if not _torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: see kogc.runtime.kernel

import dataclasses
import os
import sys

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # -n 2 on two cores: a second intra-op thread per worker only contends with the other worker (the
    # SmolLM2 IR run took 45 s instead of 21 s beside the other worker)
    torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

import laneformer as lf  # noqa: E402

MODEL_FILE = os.path.join(EXAMPLES, "laneformer.py")


def tiny(seed=0, dtype=None, **overrides):
    """The tiny Laneformer with fresh random weights from `seed`, preset fields overridden."""
    cfg = dataclasses.replace(lf.PRESETS["tiny"], **overrides)
    return lf.build(cfg, seed=seed, dtype=dtype)


def compiled_tiny(seed):
    """(model, its compiled kernel): the tiny preset with two lanes, for tests that run the kernel."""
    import kogc
    model = tiny(seed=seed, num_lanes=2)
    return model, kogc.compile(model)


def random_cache(model, seed=0):
    """Fill the model's KV caches with random values (as if earlier positions had run)."""
    gen = torch.Generator().manual_seed(seed)
    for name, buf in model.named_buffers():
        if name.endswith("_cache"):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# The files whose tests take longest (ahead-of-time compiles, interpreted kernels, the real model),
# longest first: with -n 2 --dist=loadfile each file goes to the next free worker in this order, so the
# long ones start at once instead of ending the run alone.
SLOW_FIRST = ("test_inspect.py", "test_monokernel.py", "test_sampling.py", "test_amd.py", "test_ranks_run.py",
              "test_ordinary.py", "test_ranks.py", "test_smollm2.py", "test_scheduler.py", "test_generate.py",
              "test_machine_code.py", "test_bench.py", "test_fp8.py", "test_aot.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def assert_queues_partition(tasks, queues):
    """Every task on exactly one queue, and one global topological order is consistent with every
    queue: the graph of queue order plus producer -> consumer edges has no cycle."""
    import networkx as nx
    placed = sorted(tid for q in queues for tid in q)
    assert placed == [t.id for t in tasks]
    g = nx.DiGraph()
    g.add_nodes_from(t.id for t in tasks)
    for q in queues:
        g.add_edges_from(zip(q, q[1:]))
    for t in tasks:
        g.add_edges_from((d, t.id) for d in t.deps)
    assert nx.is_directed_acyclic_graph(g)


@pytest.fixture(scope="module")
def graphs():
    """graphs(lanes): the tiny preset's IR with that many lanes (meta weights), built once a module."""
    from kogc.frontend import to_ir
    cache = {}

    def get(lanes):
        if lanes not in cache:
            cache[lanes] = to_ir(lf.kogc_model("tiny", device="meta", seed=None, num_lanes=lanes))
        return cache[lanes]
    return get
