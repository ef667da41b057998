"""Soft caps (Gemma 2): attention scores taken as c * tanh(s / c) before the mask and softmax, and the logits as
c * tanh(logits / c). Each is an attribute of its IR op (attention's `softcap`; the LM head's, its division
folded into its rows) and a constant rendered into the kernel; anything else done with tanh is refused."""
import pytest
import torch
from test_ordinary import OneLayer, assert_equals_eager, assert_fp8_kernel_equals_its_weights, hf_model

import kogc
from kogc.frontend import FrontendError, to_ir

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


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
