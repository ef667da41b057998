"""The IR: reference executor against the eager model, verifier, printer, JSON."""
import dataclasses

import pytest
import torch
from conftest import rel_err, tiny

from kogc.frontend import to_ir
from kogc.ir import IRVerifyError, Op, execute, from_json, new_state, to_json, to_text, verify
from kogc.ir.graph import Graph, Node, ValueType


def run_both(model, graph, steps, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    weights = dict(model.named_parameters())
    state = new_state(graph)
    for s in range(steps):
        pos = s
        tok = int(torch.randint(0, model.config.vocab_size, (), generator=gen))
        (logits, nxt), _ = execute(graph, weights, state, [tok, pos])
        ref_logits, ref_nxt = model(torch.tensor(tok), torch.tensor(pos))
        yield pos, logits, nxt, ref_logits.detach(), ref_nxt


@pytest.mark.parametrize("lanes", [1, 2, 4])
@pytest.mark.parametrize("delay", [1, 2])
@pytest.mark.parametrize("replicated", [True, False])
def test_executor_equals_eager_fp32(lanes, delay, replicated):
    seed = 1000 * lanes + 10 * delay + replicated
    model = tiny(seed=seed, num_lanes=lanes, broadcast_delay=delay, replicated_rmsn_scale=replicated)
    graph = to_ir(model)
    assert graph.meta["num_lanes"] == lanes
    for pos, logits, nxt, ref, ref_nxt in run_both(model, graph, steps=6, seed=seed):
        assert logits.dtype == torch.float32
        assert rel_err(logits, ref) < 1e-5, f"pos {pos}"
        assert int(nxt) == int(ref_nxt)


@pytest.mark.parametrize("flags", [dict(use_early_comm=False), dict(use_comm=False),
                                   dict(use_early_comm=False, use_comm=False, broadcast_delay=2)])
def test_executor_equals_eager_comm_variants(flags):
    model = tiny(seed=7, num_lanes=4, **flags)
    graph = to_ir(model)
    for pos, logits, nxt, ref, ref_nxt in run_both(model, graph, steps=4, seed=7):
        assert rel_err(logits, ref) < 1e-5


def test_executor_fp16_close_to_eager():
    model = tiny(seed=3, num_lanes=2, dtype=torch.float16)
    graph = to_ir(model)
    assert all(n.type.dtype == "float16" for n in graph.nodes if n.op is Op.MATVEC)
    for pos, logits, nxt, ref, ref_nxt in run_both(model, graph, steps=4, seed=3):
        assert rel_err(logits, ref) < 1e-2


def test_ir_recognises_the_model():
    model = tiny(num_lanes=2, broadcast_delay=1)
    counts = to_ir(model).count()
    n = model.config.num_hidden_layers
    assert counts["matvec"] == 7 * n + 1            # q k v o w1 w3 w2 per layer, the LM head
    assert counts["attention"] == n and counts["rope"] == 2 * n and counts["kv_write"] == 2 * n
    assert counts["lane_sum"] == 2                   # layer 0 (< delay): immediate all-lane sums
    assert counts["lane_sum_others"] == 2 * (n - 1)  # the delayed reductions
    assert counts["lane_mean"] == 1 and counts["argmax"] == 1 and counts["embed"] == 1


def test_text_and_json_round_trip():
    graph = to_ir(tiny())
    text = to_text(graph, sources=True)
    assert "attention(" in text and "laneformer.py:" in text
    again = from_json(to_json(graph))
    assert [(n.name, n.op, n.inputs, n.type, n.attrs) for n in again.nodes] == \
           [(n.name, n.op, n.inputs, n.type, n.attrs) for n in graph.nodes]
    verify(again)


def _replace(graph, index, **changes):
    nodes = list(graph.nodes)
    nodes[index] = dataclasses.replace(nodes[index], **changes)
    return Graph(nodes, graph.meta)


def _first(graph, op):
    return next(i for i, n in enumerate(graph.nodes) if n.op is op)


def test_verifier_rejects_wrong_type():
    graph = to_ir(tiny())
    i = _first(graph, Op.MATVEC)
    bad = _replace(graph, i, type=ValueType((3,), "float32", 2))
    with pytest.raises(IRVerifyError, match="matvec.*type"):
        verify(bad)


def test_verifier_rejects_use_before_definition_and_cycles():
    graph = to_ir(tiny())
    i = _first(graph, Op.SILU)
    later = graph.nodes[i + 3].name
    with pytest.raises(IRVerifyError, match="before it is defined"):
        verify(_replace(graph, i, inputs=(later,)))
    # a true cycle: two nodes feeding each other, whatever the order
    a = Node("a", Op.SILU, ("b",), ValueType((4,), "float32"))
    b = Node("b", Op.SILU, ("a",), ValueType((4,), "float32"))
    out = Node("out", Op.OUTPUT, ("b",), None)
    with pytest.raises(IRVerifyError):
        verify(Graph([a, b, out]))


def test_verifier_rejects_duplicate_and_dtype_mismatch():
    graph = to_ir(tiny())
    i = _first(graph, Op.SILU)
    with pytest.raises(IRVerifyError, match="defined twice"):
        verify(_replace(graph, i, name=graph.nodes[i - 1].name))
    j = _first(graph, Op.ADD)
    bad = _replace(graph, j, type=dataclasses.replace(graph.nodes[j].type, dtype="float16"))
    with pytest.raises(IRVerifyError):
        verify(bad)


def test_stop_after_narrows_a_mismatch():
    model = tiny()
    graph = to_ir(model)
    target = graph.nodes[_first(graph, Op.ATTENTION)].name
    outs, env = execute(graph, dict(model.named_parameters()), new_state(graph), [5, 0], stop_after=target)
    assert outs == [] and target in env and graph.nodes[-2].name not in env
