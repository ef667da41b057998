"""xIELU (Apertus's activation): its constants, each layer's own, found by probing the ops transformers writes it
with (a branch by torch.where, expm1 of a minimum), one IR op, `xielu`, formed by the up projection's tasks with
the constants in their task arguments. Eager, the IR and the kernel under Triton's interpreter agree
in fp32 within 1e-5 on inputs that reach both branches; a 16-bit kernel follows the IR."""
import pytest
import torch
from test_layer_norm_families import WrittenOut
from test_ordinary import (assert_equals_eager, assert_fp8_kernel_equals_its_weights,
                          assert_fp16_kernel_follows_the_ir, hf_model)
from test_ordinary_ranks import WIDE, check_ranks

from kogc.frontend import FrontendError, to_ir
from kogc.ir.executor import xielu
from kogc.ir.graph import Op

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")


def apertus(gain=10.0, **cfg):
    """A tiny Apertus whose layers' xIELU constants differ and whose up projections reach about -8..8 (both
    branches, expm1's series and its exponential)."""
    model = hf_model("ApertusForCausalLM", pad_token_id=0, **cfg)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            act = layer.mlp.act_fn
            act.alpha_p.fill_(0.3 + 0.4 * i)
            act.alpha_n.fill_(-0.5 + i)
            act.beta.fill_(0.5 - 0.2 * i)
            layer.mlp.up_proj.weight.mul_(gain)
    return model


def test_apertus_equals_eager():
    model = apertus()
    ck = assert_equals_eager(model, kernel_at=(3,), steps=4)
    acts = [n for n in ck.ir.nodes if n.op is Op.XIELU]
    assert len(acts) == 2 and acts[0].attrs != acts[1].attrs
    want = model.model.layers[1].mlp.act_fn
    assert acts[1].attrs["beta"] == pytest.approx(float(want.beta), rel=1e-6)
    assert acts[1].attrs["alpha_p"] == pytest.approx(float(torch.nn.functional.softplus(want.alpha_p)), rel=1e-6)
    assert {v[4] for v in ck.schedule.variants if v[0] == "matvec"} >= {"xielu_store"}


def test_apertus_in_fp16_and_fp8():
    model = apertus(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256)
    assert_fp16_kernel_follows_the_ir(model.half())
    assert_fp8_kernel_equals_its_weights(apertus())


def test_apertus_over_gpus():
    check_ranks(apertus(**WIDE), 2, steps=2)


def test_handwritten_baseline_takes_xielu():
    # kogc bench's strongest baseline: a plain MLP of xIELU, the weights kogc streams, its step run on the CPU
    from kogc.bench.handwritten import shapes_of, step_fn
    from kogc.frontend import decode_step
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(decode_step(apertus())), H200, placement="sequential")
    shapes = shapes_of(s)
    assert (shapes.act, shapes.gated, shapes.qk_norm) == ("xielu", False, True)
    step, nbytes = step_fn(shapes, 8, "cpu", dtype=torch.float32)
    assert nbytes == sum(s.weight_bytes_per_program()) and torch.isfinite(step()).all()


def test_written_out_xielu_and_branches_it_is_not():
    attrs = dict(alpha_p=1.5, alpha_n=0.25, beta=0.75, eps=-1e-6)
    graph = to_ir(WrittenOut(lambda x: xielu(x, attrs)))
    got = [n.attrs for n in graph.nodes if n.op is Op.XIELU]
    assert len(got) == 1 and all(got[0][k] == pytest.approx(v, rel=1e-5) for k, v in attrs.items())
    for other in (lambda x: torch.where(x > 0, x, 0.01 * x),                    # leaky ReLU
                  lambda x: torch.where(x > 0, x, torch.expm1(x))):             # ELU
        with pytest.raises(FrontendError, match="neither an activation function .*xielu"):
            to_ir(WrittenOut(other))
