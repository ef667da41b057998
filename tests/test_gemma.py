"""Gemma's families against eager: Gemma (GELU's tanh form, (1 + w) norms, a scaled embedding), Gemma 3 (each
sublayer's output normed, two RoPE bases), and Gemma 2's soft caps: attention scores taken as c * tanh(s / c)
before the mask and softmax, and the logits as c * tanh(logits / c). Each cap is an attribute of its IR op
(attention's `softcap`; the LM head's, its division folded into its rows) and a constant rendered into the
kernel; anything else done with tanh is refused."""
import pytest
import torch
from test_ordinary import OneLayer, assert_equals_eager, assert_fp8_kernel_equals_its_weights, hf_model

import kogc
from kogc.frontend import FrontendError, to_ir

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


@pytest.mark.parametrize("pairs", [False, True])
def test_gemma_equals_eager(pairs):
    # Gemma: the MLP gated by GELU's tanh approximation, norms scaling by (1 + weight) (a view step of the
    # weight; drawn at random here, zeros at init), the embedding scaled by a buffer of sqrt(hidden) (folded
    # into the table, which the LM head also reads unscaled); W2 forming act(gate) * up itself, or gated
    # pairs storing it; also with FP8 weights
    from kogc.scheduler import TileConfig
    model = hf_model("GemmaForCausalLM", head_dim=16, hidden_activation="gelu_pytorch_tanh")
    for name, p in model.named_parameters():
        if "norm" in name:
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2, tile_config=TileConfig(mlp_pair_inputs=0) if pairs else None)
    kinds = {t.kind_key for t in ck.schedule.tasks}
    assert ("matvec/rmsnorm/gelu_tanh_mul" if pairs else "matvec/gelu_tanh_mul/residual") in kinds, kinds
    views = [str(n.attrs.get("view")) for n in ck.ir.nodes if n.op.value == "param"]
    assert sum("offset" in v for v in views) == 2 * 2 + 1 and sum("scale" in v for v in views) == 1
    assert not any(n.op.value == "scale" for n in ck.ir.nodes)
    if not pairs:
        assert_fp8_kernel_equals_its_weights(model)


def gemma3(**cfg):
    """A Gemma 3 text model with random norm weights: a local (window 64, no shorter than the cache) and a
    global layer, whose RoPE bases differ (10,000 and 1,000,000)."""
    model = hf_model("Gemma3ForCausalLM", config_name="Gemma3TextConfig", **{"head_dim": 16, "num_key_value_heads": 1, "sliding_window": 64,
                                             "layer_types": ["sliding_attention", "full_attention"],
                                             "rope_parameters": {k: {"rope_type": "default", "rope_theta": t} for k, t in
                                                                 (("sliding_attention", 1e4), ("full_attention", 1e6))},
                                             **cfg})
    for name, p in model.named_parameters():
        if "norm" in name:
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


@pytest.mark.parametrize("widths", [{}, dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4, head_dim=256,
                                             vocab_size=2048, query_pre_attn_scalar=256)], ids=["tiny", "gemma-3-1b"])
def test_gemma3_equals_eager(widths):
    # Gemma 3: each sublayer's output normed before the residual add (a task per block of the sum: the whole
    # output read for its sum of squares), q and k normed per head with (1 + w) scales (k one head: its norm
    # over the whole vector), attention scaled by query_pre_attn_scalar^-0.5 (folded into q's norm), two RoPE
    # tables (one per base: the kernel at step 2 rotates each layer's q and k by its own); also with FP8
    # weights. Tiny, and with Gemma-3-1B's widths (a hidden size of 1152, heads of 256; 2 layers, a small vocabulary)
    model = gemma3(**widths)
    ck = assert_equals_eager(model, kernel_at=(0, 2), steps=3)
    kinds = [t.kind for t in ck.schedule.tasks]
    assert kinds.count("normed_residual") == 2 * 2 * ck.ir.by_name()[ck.schedule.ops[0].p["out"]].type.shape[0] // \
        next(t.variant[1] for t in ck.schedule.tasks if t.kind == "normed_residual")
    ropes = {n.attrs.get("theta") for n in ck.ir.nodes if n.op.value == "rope"}
    assert ropes == {10000.0, 1000000.0}, ropes
    if not widths:
        assert_fp8_kernel_equals_its_weights(model)


def gemma2(**cfg):
    """A Gemma 2 model with random norm weights: a local layer (window 4) and a global one, both soft-capping
    their scores at 50, the logits at 30; attention scaled by query_pre_attn_scalar^-0.5, not head_dim's."""
    model = hf_model("Gemma2ForCausalLM", **{"head_dim": 16, "num_key_value_heads": 2, "sliding_window": 4,
                                             "query_pre_attn_scalar": 24, **cfg})
    for name, p in model.named_parameters():
        if "norm" in name:
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_gemma2_equals_eager():
    # the IR at each of 10 steps, the kernel at steps 0 and 9 (past the window), fp32 within 1e-5; the
    # caps: without them the IR was 1.5e-2 from eager at step 1
    model = gemma2()
    assert model.config.attn_logit_softcapping == 50.0 and model.config.final_logit_softcapping == 30.0
    ck = assert_equals_eager(model, kernel_at=(0, 9), steps=10)
    attn = [n.attrs for n in ck.ir.nodes if n.op.value == "attention"]
    assert attn == [{"window": 4, "softcap": 50.0}, {"softcap": 50.0}]
    assert [n.attrs for n in ck.ir.nodes if n.op.value == "matvec" and n.attrs] == [{"softcap": 30.0}]
    assert "30.0 * _tanh(acc)" in ck.source and "50.0 * _tanh(sc * 0.02)" in ck.source
    assert_fp8_kernel_equals_its_weights(model)


def test_gemma2_greedy_tokens_equal_generate():
    # the capped logits are what the kernel stores and argmaxes: transformers' generate, greedy
    model = gemma2(sliding_window=64)
    ck = kogc.compile(kogc.frontend.decode_step(model))
    prompt = torch.tensor([[5, 9]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False)
    assert ck.generate([5, 9], 3) == want[0, 2:].tolist()
    logits, _ = ck.step(7, 5)
    assert float(logits.abs().max()) < 30.0


def test_uncapped_tanh_is_one_line_with_the_source_line():
    class TanhMLP(OneLayer):
        def __init__(self):
            super().__init__(act=torch.tanh)
    with pytest.raises(FrontendError) as e:
        to_ir(TanhMLP())
    msg = str(e.value)
    assert "aten.slice.Tensor after tanh" in msg and "only as the logits' soft cap" in msg and "test_ordinary.py:" in msg and len(msg.splitlines()) == 1


def test_logits_capped_then_scaled_are_refused():
    model = gemma2()
    step = kogc.frontend.decode_step(model)
    forward = step.forward

    def doubled(token, pos):        # c * tanh(logits / c), then 2 x that: not the step's logits as capped
        logits, _ = forward(token, pos)
        logits = logits * 2.0
        return logits, torch.argmax(logits)
    step.forward = doubled
    with pytest.raises(FrontendError, match="aten.mul.Tensor after tanh"):
        to_ir(step)


@pytest.mark.parametrize("target,binary", [("h200", "sm_90/kogc_monokernel.cubin"), ("mi300x", "gfx942/kogc_monokernel.hsaco")])
def test_gemma2_compiles_ahead_of_time(tmp_path, target, binary):
    # the window's and the caps' code for both targets (the gfx942 build's synchronisation checked in its ISA)
    from kogc.cli import main
    gemma2(sliding_window=4).half().save_pretrained(tmp_path / "model")
    assert main(["compile", "--checkpoint", str(tmp_path / "model"), "--target", target, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / binary).read_bytes()[:4] == b"\x7fELF"
    source = (tmp_path / "out" / "kernel.py").read_text()
    assert "win = args[" in source and "50.0 * _tanh(sc" in source and "30.0 * _tanh(acc)" in source
    if target == "mi300x":
        assert ", 0 problems" in (tmp_path / "out" / "report.txt").read_text()


def test_different_soft_caps_in_one_model_are_refused():
    # the caps are rendered into the kernel as one constant a model: layers capped differently are a scheduler error
    import dataclasses
    from kogc.codegen.render import render
    from kogc.ir.graph import Graph
    from kogc.scheduler import SchedulerError, build_schedule
    from kogc.targets import H200
    graph = to_ir(kogc.frontend.decode_step(gemma2()))
    first = next(i for i, n in enumerate(graph.nodes) if n.op.value == "attention")
    nodes = list(graph.nodes)
    nodes[first] = dataclasses.replace(nodes[first], attrs={**nodes[first].attrs, "softcap": 40.0})
    with pytest.raises(SchedulerError, match=r"attention ops with different softcap values \[40.0, 50.0\]"):
        render(build_schedule(Graph(nodes, dict(graph.meta)), H200))
