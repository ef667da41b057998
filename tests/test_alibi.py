"""Decoders with ALiBi instead of RoPE (BLOOM, MPT): a slope per query head times the key position added to the
scores, found in the constant the model adds (BLOOM's through `baddbmm`, rounded to the model's dtype; MPT's in
fp32); BLOOM's LayerNorm of the embedding, formed by the embedding task, and its GELU written out with products
of x. Eager, the IR and the kernel under Triton's interpreter agree in fp32 within 1e-5 (the kernel at step 4)."""
import pytest
import torch
import torch.nn.functional as F
from test_layer_norm_families import with_random_affine
from test_ordinary import assert_equals_eager, assert_fp16_kernel_follows_the_ir

from kogc.frontend import FrontendError, to_ir
from kogc.frontend.probe import alibi_of
from kogc.ir.graph import Op

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")


def bloom(**cfg):
    torch.manual_seed(0)
    config = transformers.BloomConfig(**{**dict(vocab_size=300, hidden_size=96, n_layer=2, n_head=6), **cfg})
    return with_random_affine(transformers.BloomForCausalLM(config).eval().requires_grad_(False))


def mpt(**cfg):
    torch.manual_seed(0)
    config = transformers.MptConfig(**{**dict(vocab_size=300, d_model=96, n_layers=2, n_heads=6, max_seq_len=64,
                                              expansion_ratio=2), **cfg})
    return with_random_affine(transformers.MptForCausalLM(config).eval().requires_grad_(False))


@pytest.mark.parametrize("make", [bloom, mpt], ids=["bloom", "mpt"])
def test_alibi_models_equal_eager(make):
    ck = assert_equals_eager(make(), kernel_at=(4,), steps=5)
    (att,) = {n.attrs["alibi"]["at"] for n in ck.ir.nodes if n.op is Op.ATTENTION}
    # 6 heads: the slopes of 4 heads (2^-2, 2^-4, ...), then of 8 heads' odd ones (BLOOM's and MPT's forms agree)
    slopes = [n.attrs["alibi"]["slopes"] for n in ck.ir.nodes if n.op is Op.ATTENTION][0]
    assert slopes == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    assert att == (0 if make is bloom else -63)       # MPT counts key positions back from the cache's last
    assert all("alibi" in v for v in ck.schedule.variants if v[0] == "attention")
    if make is bloom:
        assert [v for v in ck.schedule.variants if v[0] == "embed"] == [("embed", 96, "ln")]
        assert sum(n.op is Op.GELU_TANH for n in ck.ir.nodes) == 2       # its GELU written out with x * x


def test_bloom_in_fp16_rounds_the_bias_on_tensor_cores():
    # BLOOM casts its ALiBi to the model's dtype; the kernel rounds slope * k as it does (tl.dot form in fp16)
    ck = assert_fp16_kernel_follows_the_ir(bloom(hidden_size=128, n_head=4).half(), max_len=64)
    assert [(v[6], v[-1]) for v in ck.schedule.variants if v[0] == "attention"] == [("dot", "alibi_rounded")]


def test_alibi_of():
    k = torch.arange(8.0)
    slopes = torch.tensor([0.5, 0.25, 0.125])
    assert alibi_of(slopes[:, None] * k[None, :]) == {"slopes": [0.5, 0.25, 0.125], "at": 0}
    assert alibi_of(slopes[:, None] * (k - 7)[None, :]) == {"slopes": [0.5, 0.25, 0.125], "at": -7}
    assert alibi_of(slopes[:, None] * k[None, :] ** 2) is None           # not linear in the key position
    assert alibi_of(torch.zeros(3, 8)) is None


class Biased(torch.nn.Module):
    """One attention layer whose scores get a constant added."""

    def __init__(self, bias):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16, bias=False) for _ in range(4))
        self.head, self.norm = torch.nn.Linear(16, 32, bias=False), torch.nn.RMSNorm(16)
        self.register_buffer("kc", torch.zeros(1, 2, 8, 8))
        self.register_buffer("vc", torch.zeros(1, 2, 8, 8))
        self.register_buffer("bias", bias)

    def forward(self, token, pos):
        x = self.emb(token.reshape(1, 1))
        q = self.q(x).view(1, 1, 2, 8).transpose(1, 2)
        self.kc[:, :, pos.reshape(1)] = self.k(x).view(1, 1, 2, 8).transpose(1, 2)
        self.vc[:, :, pos.reshape(1)] = self.v(x).view(1, 1, 2, 8).transpose(1, 2)
        scores = q @ self.kc.transpose(-1, -2) / 8 ** 0.5 + self.bias
        scores = scores.masked_fill(torch.arange(8) > pos, float("-inf"))
        o = F.softmax(scores, -1) @ self.vc
        logits = self.head(self.norm(x + self.o(o.transpose(1, 2).reshape(1, 1, 16)))).reshape(-1)
        return logits, torch.argmax(logits)


def test_alibi_in_a_single_file_model_and_other_biases_refused():
    slopes = torch.tensor([0.5, 0.25])[None, :, None, None]
    assert_equals_eager(Biased(slopes * torch.arange(8.0)).requires_grad_(False), kernel_at=(3,), steps=4)
    with pytest.raises(FrontendError) as e:
        to_ir(Biased(torch.randn(1, 2, 1, 8)))
    assert "is not ALiBi" in str(e.value) and len(str(e.value).splitlines()) == 1
