"""Norms in their forms in transformers decoders: per head before RoPE (Qwen3) and after it (HunYuan, NanoChat),
over a whole projection (OLMo 2), without a weight (NanoChat), on each sublayer's output and scaled (HyperCLOVAX),
with an attention scale folded into a per-head norm. Eager, the IR and the kernel under Triton's interpreter agree
in fp32 within 1e-5; a 16-bit kernel follows the IR within 2e-3."""
import pytest
import torch
from test_ordinary import assert_equals_eager, assert_fp16_kernel_follows_the_ir, hf_model, tiny_llama

from kogc.ir.graph import Op

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")


def qwen3_with_head_norms():
    """Qwen3's shapes with heads of 32 and random per-head norm scales (transformers starts them at 1)."""
    model = hf_model("Qwen3ForCausalLM", head_dim=32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.normal_(1.0, 0.3)
    return model


def test_norms_per_head_equal_eager():
    # Qwen3: q and k normed per head (its own scales, random here) before rotate-half RoPE, heads of 32
    # wider than the model's 96 / 6: a task per lane's q or k after the projection (the kernel at step 1);
    # the single-file form (complex RoPE, the norm written out) through the IR
    model = qwen3_with_head_norms()
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2)
    assert sorted(v[:3] for v in ck.schedule.variants if v[0] == "head_norm") == [("head_norm", 2, 32), ("head_norm", 6, 32)]
    # (kogc analyze's phases: the normed projections and the norms in QKV, not W1/W3 by their kind)
    from kogc.analysis.phases import phase_of
    phases = {(t.op.rsplit(".", 1)[-1], phase_of(ck.schedule)(t)) for t in ck.schedule.tasks}
    assert {p for op, p in phases if op in ("rope_rows", "rope", "v_proj")} == {"QKV"}
    assert {p for op, p in phases if op in ("gate_proj", "up_proj")} == {"W1/W3"}
    assert_equals_eager(tiny_llama(qk_norm=True, head_dim=32), kernel_at=(), steps=4)
    assert {v[4] for v in ck.schedule.variants if v[0] == "head_norm"} == {0}


def test_norms_after_rope_equal_eager():
    # HunYuan's dense models: q and k rotated (rotate-half) first, then normed per head and scaled: the norm's
    # task rotates, then norms (its scale in the kernel's interleaved order); fp32 against eager, fp16 against the IR
    model = hf_model("HunYuanDenseV1ForCausalLM", config_name="HunYuanDenseV1Config", head_dim=16, pad_token_id=299)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.normal_(1.0, 0.3)
    ck = assert_equals_eager(model, kernel_at=(3,), steps=4)
    assert {v[5] for v in ck.schedule.variants if v[0] == "head_norm"} == {1}
    assert_fp16_kernel_follows_the_ir(model.half())


def test_peri_layer_norms_with_multipliers_equal_eager():
    # HyperCLOVAX: each sublayer's output normed, then scaled by residual_multiplier (folded into the norm's
    # scale), Granite's other multipliers; the kernel at step 3
    model = hf_model("HyperCLOVAXForCausalLM", residual_multiplier=0.5, embedding_multiplier=2.0, logits_scaling=0.8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    ck = assert_equals_eager(model, kernel_at=(3,), steps=4)
    assert not any(n.op is Op.SCALE for n in ck.ir.nodes)
    assert sum(v[0] == "normed_residual" for v in ck.schedule.variants) == 1


def test_norms_without_weights_equal_eager():
    # NanoChat: every RMSNorm without a weight (the embedding's, in the embed task; each sublayer's and the final
    # one, with a scale of ones), q and k normed after RoPE, a squared-ReLU MLP, soft-capped logits; fp32 against
    # eager, fp16 against the IR
    model = hf_model("NanoChatForCausalLM", head_dim=16, pad_token_id=299)
    ck = assert_equals_eager(model, kernel_at=(3,), steps=4)
    assert [v for v in ck.schedule.variants if v[0] == "embed"] == [("embed", 96, "rms")]
    assert {v[5] for v in ck.schedule.variants if v[0] == "head_norm"} == {1}
    assert_fp16_kernel_follows_the_ir(model.half())


def test_olmo2_norms_over_whole_projections_equal_eager():
    # OLMo2: q and k each normed over the whole projection (6 heads of 16; one norm task per lane's q or k over
    # all its heads), then rotate-half RoPE; no norm before attention or the MLP, each sublayer's output normed
    # before the residual add; random norm scales (the kernel at steps 0 and 3)
    model = hf_model("Olmo2ForCausalLM", num_key_value_heads=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    ck = assert_equals_eager(model, kernel_at=(0, 3), steps=4)
    assert sorted(v[1:] for v in ck.schedule.variants if v[0] == "head_norm") == [(2, 16, 64, 1, 0), (6, 16, 0, 1, 0)]
    assert {t.kind for t in ck.schedule.tasks} >= {"normed_residual", "head_norm"}


def test_attention_scale_folds_into_a_per_head_norm():
    # q normed per head after its projection (Qwen3), attention scaled by 0.05: the factor goes into the
    # norm's scale, after the normalisation (into the projection it would be normed away)
    model = qwen3_with_head_norms()
    for layer in model.model.layers:
        layer.self_attn.scaling = 0.05
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2)
    scaled = [n.attrs["name"] for n in ck.ir.nodes if n.op.value == "param" and "scale" in str(n.attrs.get("view"))]
    assert len(scaled) == 2 and all("q_norm" in name for name in scaled), scaled
