"""Decoders with a learned position embedding instead of RoPE (GPT-2, OPT, GPT-BigCode): the position's row of a table added
to the token's in the embedding task, GPT-2's Conv1D layers (addmm of a weight stored [in, out]), OPT's ReLU MLP.
Eager, the IR and the kernel under Triton's interpreter agree in fp32 within 1e-5."""
import pytest
import torch
import torch.nn.functional as F
from test_layer_norm_families import with_random_affine
from test_ordinary import assert_equals_eager, assert_fp8_kernel_equals_its_weights

import kogc
from kogc.frontend import FrontendError, to_ir
from kogc.ir.graph import Op

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")


def gpt2(**cfg):
    torch.manual_seed(0)
    config = transformers.GPT2Config(**{**dict(vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_positions=64,
                                               bos_token_id=0, eos_token_id=0), **cfg})
    return with_random_affine(transformers.GPT2LMHeadModel(config).eval().requires_grad_(False))


def opt(**cfg):
    torch.manual_seed(0)
    # (OPT's position table has 2 rows more than its positions: position p is row p + 2)
    config = transformers.OPTConfig(**{**dict(vocab_size=300, hidden_size=96, ffn_dim=160, num_hidden_layers=2,
                                              num_attention_heads=6, max_position_embeddings=64,
                                              word_embed_proj_dim=96, pad_token_id=1), **cfg})
    return with_random_affine(transformers.OPTForCausalLM(config).eval().requires_grad_(False))


def gpt_bigcode(**cfg):
    # StarCoder's, SantaCoder's: GPT-2's layer with one KV head (its fused c_attn: q, then one k and one v)
    torch.manual_seed(0)
    config = transformers.GPTBigCodeConfig(**{**dict(vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_positions=64,
                                                     multi_query=True), **cfg})
    return with_random_affine(transformers.GPTBigCodeForCausalLM(config).eval().requires_grad_(False))


@pytest.mark.parametrize("make", [gpt2, opt, gpt_bigcode], ids=["gpt2", "opt", "gpt_bigcode"])
def test_learned_positions_equal_eager(make):
    ck = assert_equals_eager(make(), kernel_at=(4,), steps=5)
    variants = ck.schedule.variants
    assert [v for v in variants if v[0] == "embed"] == [("embed", 96, "pos")]
    act = "relu_store" if make is opt else "gelu_tanh_store"     # (gelu_new and gelu_pytorch_tanh)
    assert any(v[0] == "matvec" and v[4] == act for v in variants)
    assert not any(n.op is Op.ROPE for n in ck.ir.nodes)


def test_position_table_rows_from_the_offset():
    # OPT reads row pos + 2: the IR's table is the rows from 2 on; the kernel's EMB holds them after the token's
    model = opt()
    graph = to_ir(kogc.frontend.decode_step(model))
    (pos_embed,) = [n for n in graph.nodes if n.op is Op.EMBED and n.inputs[1].endswith(".pos")]
    table = graph.by_name()[pos_embed.inputs[0]]
    assert table.attrs["view"] == [["rows", 2, 66]] and table.type.shape == (64, 96)
    ck = kogc.compile(kogc.frontend.decode_step(model, max_len=32))
    emb = ck.buffers.EMB
    assert emb.shape == (300 + 64, 96)
    assert torch.equal(emb[300 + 5], model.model.decoder.embed_positions.weight[7])


def test_fp8_kernel_with_a_position_embedding():
    # the LM head streams FP8; the token's and the position's rows stay in the model's dtype (untied: the
    # reference quantizes a parameter wherever the IR reads it)
    assert_fp8_kernel_equals_its_weights(gpt2(tie_word_embeddings=False))


def test_handwritten_baseline_adds_the_position_row():
    from kogc.bench.handwritten import shapes_of, step_fn
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(kogc.frontend.decode_step(opt())), H200, placement="sequential")
    shapes = shapes_of(s)
    assert (shapes.pos_embed, shapes.act, shapes.gated, shapes.layer_norm) == (True, "relu", False, True)
    step, nbytes = step_fn(shapes, 8, "cpu", dtype=torch.float32)
    assert nbytes == sum(s.weight_bytes_per_program()) and torch.isfinite(step()).all()


class Positions(torch.nn.Module):
    """A token embedding plus a row of a position table (or a computed function of the position), one attention
    layer, the LM head."""

    def __init__(self, rows=8, computed=False):
        super().__init__()
        self.emb, self.pe = torch.nn.Embedding(32, 16), torch.nn.Embedding(rows, 16)
        self.head = torch.nn.Linear(16, 32, bias=False)
        self.register_buffer("kc", torch.zeros(1, 2, 8, 8))
        self.register_buffer("vc", torch.zeros(1, 2, 8, 8))
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16, bias=False) for _ in range(4))
        self.norm = torch.nn.RMSNorm(16)
        self.computed = computed

    def forward(self, token, pos):
        p = pos.reshape(1, 1)
        x = self.emb(token.reshape(1, 1))
        x = x + (torch.sin(p[..., None] * torch.arange(16.0)) if self.computed else self.pe(p))
        q = self.q(x).view(1, 1, 2, 8).transpose(1, 2)
        self.kc[:, :, pos.reshape(1)] = self.k(x).view(1, 1, 2, 8).transpose(1, 2)
        self.vc[:, :, pos.reshape(1)] = self.v(x).view(1, 1, 2, 8).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, self.kc, self.vc, attn_mask=(torch.arange(8) <= pos)[None, None, None, :])
        logits = self.head(self.norm(x + self.o(o.transpose(1, 2).reshape(1, 1, 16)))).reshape(-1)
        return logits, torch.argmax(logits)


def test_single_file_model_with_a_position_table_equals_eager():
    assert_equals_eager(Positions().requires_grad_(False), kernel_at=(0, 3), steps=4)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(rows=4), "holds 4 positions and the KV cache 8: pass a max_len (--max-len) of at most 4"),
    (dict(computed=True), "must be a row of a position embedding table"),
])
def test_position_embedding_errors_are_one_line(kwargs, needle):
    with pytest.raises(FrontendError) as e:
        to_ir(Positions(**kwargs))
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_generation_in_one_launch_moves_the_position_row():
    # each step of one launch adds its own position's row (the prompt's steps and the generated ones)
    model = gpt2(n_layer=1)
    with torch.no_grad():       # rows that decide the tokens (GPT-2 starts them near 0)
        model.transformer.wpe.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    ck = kogc.compile(kogc.frontend.decode_step(model, max_len=16))
    prompt = torch.tensor([[5, 9]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False)
    assert ck.generate([5, 9], 3) == want[0, 2:].tolist()
