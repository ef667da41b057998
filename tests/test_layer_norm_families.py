"""Decoders with LayerNorm (GPT-NeoX / Pythia, Phi-2, StableLM, Starcoder2): the norm with its weight and bias
in a matvec's prologue and in the final norm, plain (non-gated) MLPs whose first matvec stores act(rows),
partial rotary embeddings, GPT-NeoX's fused QKV interleaved per head, parallel attention and MLP blocks
(their two biased outputs added to the residual in one task), an LM head with a bias, and GELU written out
(Phi-2's and GPT-2's "gelu_new"), found by probing. Eager, the IR and the kernel under Triton's interpreter
agree in fp32 within 1e-5."""
import pytest
import torch
from test_ordinary import assert_equals_eager, assert_fp8_kernel_equals_its_weights, hf_model

import kogc
from kogc.frontend import FrontendError, to_ir
from kogc.ir.graph import Op
from kogc.scheduler.errors import SchedulerError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")


def with_random_affine(model):
    """Norm weights and biases and every linear bias random (transformers starts them at 1 and 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model


FAMILIES = {
    # LayerNorm, rotate-half RoPE on a quarter of each head, a gated SiLU MLP, Q/K/V biased
    "stablelm": ("StableLmForCausalLM", dict(use_qkv_bias=True)),
    # LayerNorm, GELU (tanh) MLP not gated, every linear layer biased
    "starcoder2": ("Starcoder2ForCausalLM", {}),
    # fused QKV as [heads, 3 * head_dim], RoPE on a quarter, attention and MLP in parallel from two norms
    "gpt_neox": ("GPTNeoXForCausalLM", dict(num_key_value_heads=6)),
    "gpt_neox_sequential": ("GPTNeoXForCausalLM", dict(num_key_value_heads=6, use_parallel_residual=False)),
    # one norm for both parallel sublayers, RoPE on half of each head, gelu_new written out, a biased LM head
    "phi": ("PhiForCausalLM", {}),
}


def family(name, **extra):
    cls_name, cfg = FAMILIES[name]
    return with_random_affine(hf_model(cls_name, pad_token_id=0, **{**cfg, **extra}))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_layer_norm_families_equal_eager(name):
    ck = assert_equals_eager(family(name), kernel_at=(0, 5), steps=6)
    variants = ck.schedule.variants
    assert any(v[0] == "matvec" and v[3] == "layernorm" for v in variants)
    assert [v[4] for v in variants if v[0] == "final_norm"] == ["layernorm"]
    if name == "phi":
        assert any(v[4] == "store_argmax" and v[-1] == "bias" for v in variants if v[0] == "matvec")
    if name in ("gpt_neox", "phi"):     # the parallel block's two biased outputs and h in one task
        assert ("residual", 32, 1, "two") in variants
    if name in ("starcoder2", "gpt_neox", "phi"):
        assert any(v[0] == "matvec" and v[4].endswith("_store") for v in variants)


COHERE = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_attention_heads=6, num_key_value_heads=2,
              max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MORE = {
    # one norm for parallel sublayers, interleaved RoPE on 8 of each head's 16 dims, a biased LM head
    "gptj": lambda T: T.GPTJForCausalLM(T.GPTJConfig(vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_positions=64,
                                                     rotary_dim=8)),
    # GPT-J's layer with a fused QKV in 4 blocks (its mp_num) of q, v and k rows
    "codegen": lambda T: T.CodeGenForCausalLM(T.CodeGenConfig(vocab_size=300, n_embd=96, n_layer=2, n_head=6,
                                                              n_positions=64, rotary_dim=8)),
    # one KV head, parallel sublayers from one norm, unbiased layers, `input @ self.weight.T`, an in-place residual add
    "falcon": lambda T: T.FalconForCausalLM(T.FalconConfig(vocab_size=300, hidden_size=96, num_hidden_layers=2,
                                                           num_attention_heads=6, new_decoder_architecture=False,
                                                           multi_query=True, parallel_attn=True, bias=False,
                                                           max_position_embeddings=64)),
    # LayerNorms without a weight or a bias (ones and zeros in the kernel), a gated SiLU MLP
    "olmo": lambda T: T.OlmoForCausalLM(T.OlmoConfig(vocab_size=300, hidden_size=96, intermediate_size=160,
                                                     num_hidden_layers=2, num_attention_heads=6,
                                                     max_position_embeddings=64, pad_token_id=1)),
    # its LayerNorm written out in fp32 with a weight and no bias, parallel sublayers, interleaved RoPE by
    # repeat_interleave, logits scaled
    "cohere": lambda T: T.CohereForCausalLM(T.CohereConfig(num_hidden_layers=2, **COHERE)),
    # Cohere's layer with windows of 4 on three layers of four and no RoPE on the global one
    "cohere2": lambda T: T.Cohere2ForCausalLM(T.Cohere2Config(num_hidden_layers=4, sliding_window=4, **COHERE)),
    # Phi-2's heads of 80 (held in 128 lanes), RoPE on 32 dims of each
    "phi_heads_of_80": lambda T: T.PhiForCausalLM(T.PhiConfig(vocab_size=300, hidden_size=160, intermediate_size=256,
                                                             num_hidden_layers=2, num_attention_heads=2,
                                                             partial_rotary_factor=0.4, max_position_embeddings=64)),
    # two norms, Q/K/V of each KV head's group of 3 query heads by slice and select: qkv[:, :, :, :-2], [..., -2]
    "falcon_new": lambda T: T.FalconForCausalLM(T.FalconConfig(vocab_size=300, hidden_size=96, num_hidden_layers=2,
                                                               num_attention_heads=6, num_kv_heads=2,
                                                               new_decoder_architecture=True,
                                                               max_position_embeddings=64)),
    # LayerNorm1P (its weight + 1), a plain squared-ReLU MLP, RoPE on half of each head
    "nemotron": lambda T: T.NemotronForCausalLM(T.NemotronConfig(vocab_size=300, hidden_size=96,
                                                                 intermediate_size=160, num_hidden_layers=2,
                                                                 num_attention_heads=6, num_key_value_heads=2,
                                                                 max_position_embeddings=64, pad_token_id=0)),
}


@pytest.mark.parametrize("name", list(MORE))
def test_more_layer_norm_families_equal_eager(name):
    torch.manual_seed(0)
    ck = assert_equals_eager(with_random_affine(MORE[name](transformers).eval().requires_grad_(False)),
                             kernel_at=(5,) if name == "cohere2" else (3,), steps=6 if name == "cohere2" else 4)
    assert [v[4] for v in ck.schedule.variants if v[0] == "final_norm"] == ["layernorm"]
    if name == "nemotron":
        assert any(v[0] == "matvec" and v[4] == "relu2_store" for v in ck.schedule.variants)


def test_squared_relu_mlp_in_fp16():
    # Arcee's layer: RMSNorm and a plain MLP of relu(x) ** 2 (torch.square), rounded once in fp16 as eager rounds it
    from test_ordinary import assert_fp16_kernel_follows_the_ir
    model = hf_model("ArceeForCausalLM", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=256).half()
    ck = assert_fp16_kernel_follows_the_ir(model)
    assert sum(n.op is Op.RELU2 for n in ck.ir.nodes) == 2 and not any(n.op is Op.RELU for n in ck.ir.nodes)


def test_layer_norm_over_column_parts():
    # a width of 72 = 64 + 8: the norm's mean and variance over both column parts (9 heads of 8)
    model = family("gpt_neox", hidden_size=72, num_attention_heads=9, num_key_value_heads=9, intermediate_size=96)
    ck = assert_equals_eager(model, kernel_at=(0, 3), steps=4)
    from kogc.scheduler.tasks import column_parts
    assert len(column_parts(72)) == 2 and any(v[2] == 72 and v[3] == "layernorm" for v in ck.schedule.variants
                                              if v[0] == "matvec")


def test_fp8_kernel_with_layer_norms_and_a_biased_head():
    assert_fp8_kernel_equals_its_weights(family("phi"))


def test_written_out_gelu_is_one_op():
    # Phi-2's gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), probed as GELU's tanh form
    graph = to_ir(kogc.frontend.decode_step(family("phi")))
    assert sum(n.op is Op.GELU_TANH for n in graph.nodes) == 2


class WrittenOut(torch.nn.Module):
    """One layer whose activation is written out: `act` of the up projection's output."""

    def __init__(self, act):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.up, self.down = torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(32, 32, bias=False)
        self.act = act

    def forward(self, token, pos):
        logits = self.down(self.act(self.up(self.emb(token.reshape(1, 1))))).reshape(-1)
        return logits, torch.argmax(logits)


def test_written_out_activations():
    graph = to_ir(WrittenOut(lambda x: x * torch.sigmoid(x)))
    assert [n.op for n in graph.nodes if n.op in (Op.SILU, Op.GELU, Op.GELU_TANH)] == [Op.SILU]
    graph = to_ir(WrittenOut(lambda x: x * 0.5 * (1.0 + torch.erf(x / 2 ** 0.5))))
    assert [n.op for n in graph.nodes if n.op in (Op.SILU, Op.GELU, Op.GELU_TANH)] == [Op.GELU]
    with pytest.raises(FrontendError) as e:       # a cube is no activation kogc knows
        to_ir(WrittenOut(lambda x: torch.pow(x, 3.0)))
    assert "neither an activation function (gelu_tanh, gelu, silu, xielu) nor a rotary embedding" in str(e.value)


def test_layer_norm_without_a_bias():
    # LayerNorm(bias=False) on the layers' first norms: the kernel's prologue takes zeros for the bias
    model = family("starcoder2")
    for layer in model.model.layers:
        layer.input_layernorm.bias = None
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2)
    assert [n for n in ck.schedule.layout.slots if n.startswith("#")] == ["#zeros.96"]


def test_partial_rotary_rows_and_cache_order():
    from kogc.ir.views import derive_step, rope_half_order
    assert rope_half_order(8, 4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]
    assert rope_half_order(4).tolist() == [0, 2, 1, 3]
    w = torch.arange(12.0)[:, None]         # 2 blocks of 6 rows: rows 2..4 of each
    assert derive_step(w, ("strided_rows", 6, 2, 4)).reshape(-1).tolist() == [2, 3, 8, 9]
    graph = to_ir(kogc.frontend.decode_step(family("gpt_neox")))
    states = [n.attrs.get("view") for n in graph.nodes if n.op is Op.STATE]
    assert ["rope_half_rows", 16, 4] in [s[0] for s in states if s]
    ropes = [n for n in graph.nodes if n.op is Op.ROPE]
    assert ropes and all(f == 0.0 for f in ropes[0].attrs["inv_freq"][2:])     # the 12 dims left alone


def test_lm_head_with_a_bias_equals_eager():
    from test_ordinary import tiny_llama
    model = tiny_llama()
    model.output.bias = torch.nn.Parameter(torch.randn(model.output.out_features), requires_grad=False)
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2)
    assert any(v[4] == "store_argmax" and v[-1] == "bias" for v in ck.schedule.variants if v[0] == "matvec")


@pytest.mark.parametrize("name,parallel,gated", [("gpt_neox", True, False), ("starcoder2", False, False),
                                                 ("stablelm", False, True)])
def test_handwritten_baseline_has_the_models_forms(name, parallel, gated):
    # kogc bench's strongest baseline: LayerNorm, the plain or gated MLP, the parallel block; the weights kogc
    # streams, its step run on the CPU (without its CUDA graph) and over two ranks
    from kogc.bench.handwritten import shapes_of, step_fn
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(kogc.frontend.decode_step(family(name))), H200, placement="sequential")
    shapes = shapes_of(s)
    assert (shapes.layer_norm, shapes.parallel, shapes.gated) == (True, parallel, gated)
    step, nbytes = step_fn(shapes, 8, "cpu", dtype=torch.float32)
    assert nbytes == sum(s.weight_bytes_per_program()) and torch.isfinite(step()).all()
    sums = []
    half, _ = step_fn(shapes, 8, "cpu", world=2, rank=1, all_reduce=lambda t, op="sum": sums.append(op),
                      dtype=torch.float32)
    half()
    assert sums == ["sum"] * (1 if parallel else 2) * shapes.layers + ["max"]


class PostNorm(torch.nn.Module):
    """The residual taken after the norm (BLOOM's apply_residual_connection_post_layernorm)."""

    def __init__(self):
        super().__init__()
        self.emb, self.ln = torch.nn.Embedding(32, 16), torch.nn.LayerNorm(16)
        self.up, self.down = torch.nn.Linear(16, 16), torch.nn.Linear(16, 32, bias=False)

    def forward(self, token, pos):
        x = self.ln(self.emb(token.reshape(1, 1)))
        logits = self.down(x + self.up(x)).reshape(-1)
        return logits, torch.argmax(logits)


def test_layer_norm_read_by_a_residual_add_is_one_line():
    with pytest.raises(SchedulerError) as e:
        kogc.compile(PostNorm())
    msg = str(e.value)
    assert "a LayerNorm's output" in msg and "read by add" in msg and "test_layer_norm_families.py" in msg, msg


def test_heads_of_80_on_tensor_cores_in_fp16():
    # fp16 takes attention's tl.dot form: q, keys and values of 80 dims in 128 lanes, the extra ones 0 (fp32
    # takes the exact broadcast form, in test_more_layer_norm_families_equal_eager)
    from test_ordinary import assert_fp16_kernel_follows_the_ir
    torch.manual_seed(0)
    model = with_random_affine(MORE["phi_heads_of_80"](transformers).eval().requires_grad_(False)).half()
    ck = assert_fp16_kernel_follows_the_ir(model)
    assert [v[2] for v in ck.schedule.variants if v[0] == "attention" and v[6] == "dot"] == [80]


def test_means_that_make_no_layer_norm_are_one_line():
    with pytest.raises(FrontendError) as e:        # centred, never scaled by its deviation
        to_ir(WrittenOut(lambda x: x - x.mean(-1, keepdim=True)))
    assert "inside what looks like a LayerNorm" in str(e.value) and len(str(e.value).splitlines()) == 1
    with pytest.raises(FrontendError) as e:        # over half of the vector
        to_ir(WrittenOut(lambda x: x - x.view(1, 1, 2, 16).mean(-1, keepdim=True).repeat_interleave(16, -1).view(1, 1, 32)))
    assert "a mean of an activation is supported only as a LayerNorm's" in str(e.value)
