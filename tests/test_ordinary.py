"""Decoders written the usual ways, captured with torch.export: a single-file Llama (complex RoPE, a
KV-cache module written by index assignment, SDPA) and its variants (rotate-half and real-pair RoPE,
attention written out), transformers' Llama and Mistral. Under Triton's interpreter the kernel equals
eager over 16 steps; every unsupported idiom is one line naming the op and the model's line."""
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import EXAMPLES, rel_err

import kogc
from kogc.frontend import FrontendError, to_ir

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")

if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import llama  # noqa: E402

STEPS = 16


def tiny_llama(seed=0, **overrides):
    return llama.kogc_model("tiny", seed=seed, **overrides)


def weights_vocab(graph) -> int:
    return graph.by_name()[graph.output.inputs[0]].type.shape[0]


def assert_equals_eager(model, kernel_at=(0, 1, STEPS - 1), steps=STEPS, seed=0, tile_config=None):
    """Eager and kogc from an empty cache over `steps` steps of random tokens, fp32 within 1e-5: the IR
    reference executor at every step, the compiled kernel under the interpreter at `kernel_at` (a step
    there costs about a second: the steps between run eager only, and the kernel's cache is filled
    from the model's before a jump; the IR is the kernel's definition, checked against it throughout
    the suite). Returns the compiled kernel."""
    from kogc.ir import execute
    from kogc.ir.executor import new_state
    from kogc.runtime.kernel import fill_kv_from, weights_of
    step = kogc.frontend.decode_step(model)
    ck = kogc.compile(step, tile_config=tile_config) if kernel_at else None
    graph = ck.ir if ck else kogc.frontend.to_ir(step)
    weights, state = weights_of(step, graph), new_state(graph)
    gen = torch.Generator().manual_seed(seed)
    done = -1
    for pos in range(steps):
        tok = int(torch.randint(0, weights_vocab(graph), (), generator=gen))
        if pos in kernel_at and pos != done + 1:
            fill_kv_from(ck, step)          # positions 0 .. pos-1 as eager wrote them
        with torch.no_grad():
            want, want_next = step(torch.tensor(tok), torch.tensor(pos))
        (ir, ir_next), _ = execute(graph, weights, state, [tok, pos])
        assert rel_err(ir, want) < 1e-5 and int(ir_next) == int(want_next), f"IR at pos {pos}"
        if pos in kernel_at:
            logits, nxt = ck.step(tok, pos)
            assert rel_err(logits, want) < 1e-5 and nxt == int(want_next), f"kernel at pos {pos}"
            done = pos
    return ck


def test_single_file_llama():
    # 3 query heads per KV head (one each: the transformers tests)
    ck = assert_equals_eager(tiny_llama(seed=2))
    counts = ck.ir.count()
    assert counts["rope"] == 4 and counts["attention"] == 2 and ck.ir.meta["num_lanes"] == 1
    # its W2 reads 160 inputs per row: it forms silu(gate) * up itself (no gated pairs)
    assert "matvec/silu_mul/residual" in {t.kind_key for t in ck.schedule.tasks}


def test_gated_pairs_equal_eager():
    # W1 and W3 as one task per (gate, up) row pair storing silu(gate) * up, W2 reading that vector
    # (forced: by default only where W2 would read >= 1024 inputs per row, e.g. Llama-3.2-1B's shapes)
    from kogc.scheduler import TileConfig
    ck = assert_equals_eager(tiny_llama(seed=5), kernel_at=(0, 3), steps=4, tile_config=TileConfig(mlp_pair_inputs=0))
    kinds = {t.kind_key for t in ck.schedule.tasks}
    assert {"matvec/rmsnorm/silu_mul", "matvec/plain/residual"} <= kinds and "matvec/silu_mul/residual" not in kinds
    pair = next(t.weight for t in ck.schedule.tasks if t.kind_key == "matvec/rmsnorm/silu_mul")
    assert pair.up.endswith("w3.weight#lane") and pair.param.endswith("w1.weight#lane")


@pytest.mark.parametrize("overrides,group,passes", [
    ({}, 3, 1),                                              # 3 heads of 16 in one masked pass of 64 lanes
    (dict(n_heads=6, n_kv_heads=1, head_dim=64), 6, 2),      # two passes of 3 heads (192 of 256 lanes)
    (dict(n_heads=11, n_kv_heads=1, head_dim=32), 11, 2),    # 6 heads, then a last pass of the 5 left
    (dict(n_heads=37, n_kv_heads=1, head_dim=64), 37, 10),   # 9 passes of 4 in a loop (more than 8), then 1
])
def test_last_split_combines_equal_eager(overrides, group, passes):
    # attention wider than attn_combine_width (forced here; by default wider than 512, e.g. Llama-3.2-1B's
    # 2048): the last of the splits of each KV head combines its query heads into o, Wo reads o plainly
    # (2 splits, both holding positions at step 3; 16 where attn_splits is 0)
    from kogc.scheduler import TileConfig
    from kogc.scheduler.tile import heads_per_combine
    cfg = TileConfig(attn_combine_width=0, attn_splits=2)
    ck = assert_equals_eager(tiny_llama(seed=7, **overrides), kernel_at=(0, 3), steps=4, tile_config=cfg)
    att = [v for v in ck.schedule.variants if v[0] == "attention"]
    assert [(v[1], v[3], "last" in v) for v in att] == [(group, 2, True)]
    assert -(-group // heads_per_combine(att[0][1], att[0][2])) == passes
    assert not any("attn_combine" in t.kind_key for t in ck.schedule.tasks)


def test_one_kv_head():
    # multi-query attention: the cache's KV-head axis has size 1 and is not squeezed away
    assert_equals_eager(tiny_llama(seed=3, n_kv_heads=1), kernel_at=(1,), steps=3)


def assert_fp16_kernel_follows_the_ir(model, max_len=None):
    """A 16-bit model's kernel (attention's tl.dot form) against the IR at steps 0 and 19 (the steps between run
    eager and the IR only; two blocks of 16 positions in a split at 19), within 2e-3. Returns the kernel."""
    from kogc.ir import execute
    from kogc.ir.executor import new_state
    from kogc.runtime.kernel import fill_kv_from, weights_of
    step = kogc.frontend.decode_step(model, max_len=max_len)
    ck = kogc.compile(step)
    weights, state = weights_of(step, ck.ir), new_state(ck.ir)
    for pos in range(20):
        tok = pos * 37 % 300
        (want, want_next), _ = execute(ck.ir, weights, state, [tok, pos])
        with torch.no_grad():
            step(torch.tensor(tok), torch.tensor(pos))
        if pos in (0, 19):
            if pos:
                fill_kv_from(ck, step)
            logits, nxt = ck.step(tok, pos)
            assert rel_err(logits.float(), want.float()) < 2e-3 and nxt == int(want_next), pos
    return ck


def test_large_query_group_on_tensor_cores_in_fp16():
    # 24 query heads on one KV head: tl.dot over 32 rows (the broadcast form spilled 21 KB for Falcon-7B's 71)
    ck = assert_fp16_kernel_follows_the_ir(hf_model("LlamaForCausalLM", hidden_size=384, num_attention_heads=24,
                                                    num_key_value_heads=1, num_hidden_layers=1).half())
    assert [(v[1], v[6]) for v in ck.schedule.variants if v[0] == "attention"] == [(24, "dot")]


def test_heads_per_combine():
    from kogc.scheduler.tile import heads_per_combine
    # Llama-3.2-1B, SmolLM2-135M, Qwen3-0.6B in one pass; Qwen2.5-0.5B's 7 x 64 in 4 then 3; 8 x 64 in two;
    # Llama-3.2-3B's 3 x 128 in 2 then 1; Falcon-7B's 71 x 64 in 17 passes of 4 and one of 3
    assert [heads_per_combine(g, d) for g, d in ((4, 64), (3, 64), (2, 128), (7, 64), (8, 64), (1, 512), (3, 128),
                                                  (71, 64))] == [4, 3, 2, 4, 4, 1, 2, 4]


def test_cli_compiles_the_model_file(capsys):
    # (its RoPE table and mask are evaluated at compile time: built on the CPU, not the meta device)
    from kogc.cli import main
    code = main(["compile", os.path.join(EXAMPLES, "llama.py"), "--config", "tiny", "--target", "h200", "--emit", "ir"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("rope(") == 4 and "theta=10000.0" in out


def rotate_half_rope(x, freqs_cis):
    """The transformers form: cos/sin tables, x * cos + rotate_half(x) * sin over halves of the head."""
    cos = torch.cat((freqs_cis.real, freqs_cis.real), -1)[None, :, None, :]
    sin = torch.cat((freqs_cis.imag, freqs_cis.imag), -1)[None, :, None, :]
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def real_pairs_rope(x, freqs_cis):
    """Interleaved pairs without complex numbers (the gpt-fast form)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = freqs_cis.real[None, :, None, :], freqs_cis.imag[None, :, None, :]
    out = torch.stack((xs[..., 0] * c - xs[..., 1] * s, xs[..., 1] * c + xs[..., 0] * s), -1)
    return out.flatten(3).type_as(x)


def written_out_attention(q, k, v, attn_mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).type_as(q) @ v


@pytest.mark.parametrize("rope", [rotate_half_rope, real_pairs_rope])
def test_rope_forms(monkeypatch, rope):
    monkeypatch.setattr(llama, "apply_rotary_emb", rope)
    assert_equals_eager(tiny_llama(seed=3), kernel_at=())     # (the IR's ROPE: the kernel's is tested above)


def test_rope_per_layer_in_the_projections_epilogue(monkeypatch):
    # the odd layers rotate at twice the even layers' angles: two RoPE tables, read by the q and k projections'
    # own epilogue (no norm per head here); the kernel at step 2 rotates each layer by its own
    def forward(self, token, pos):
        tokens, positions = token.reshape(1, 1), pos.reshape(1)
        x = self.tok_embeddings(tokens)
        freqs = self.freqs_cis[positions]
        mask = self.causal_mask[None, None, positions]
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, freqs * freqs if i % 2 else freqs, mask)
        logits = self.output(self.norm(x)).reshape(-1)
        return logits, torch.argmax(logits)
    monkeypatch.setattr(llama.Llama, "forward", forward)
    ck = assert_equals_eager(tiny_llama(seed=3), kernel_at=(2,), steps=3)
    ropes = [n.attrs for n in ck.ir.nodes if n.op.value == "rope"]
    assert len({str(a) for a in ropes}) == 2 and {"rope_store", "rope_cache"} <= {t.variant[4] for t in ck.schedule.tasks
                                                                                 if t.kind == "matvec"}


def test_written_out_attention(monkeypatch):
    monkeypatch.setattr(llama.F, "scaled_dot_product_attention", written_out_attention)
    assert_equals_eager(tiny_llama(seed=4), kernel_at=())


def test_torch_compile_backend():
    # torch.compile(step, backend="kogc"): dynamo's graph with the module's tensors lifted, one kernel
    model = tiny_llama(seed=6)
    eager = tiny_llama(seed=6)
    step = torch.compile(model, backend="kogc")
    for pos, tok in enumerate((7, 300)):
        logits, nxt = step(torch.tensor(tok), torch.tensor(pos))
        want, want_next = eager(torch.tensor(tok), torch.tensor(pos))
        assert rel_err(logits, want) < 1e-5 and int(nxt) == int(want_next)


transformers = pytest.importorskip("transformers")


def hf_model(cls_name, seed=0, config_name=None, **cfg):
    torch.manual_seed(seed)
    config_cls = getattr(transformers, config_name or cls_name.replace("ForCausalLM", "Config"))
    base = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0)
    return getattr(transformers, cls_name)(config_cls(**{**base, **cfg})).eval().requires_grad_(False)


def test_transformers_llama_equals_eager_and_generate():
    model = hf_model("LlamaForCausalLM", tie_word_embeddings=True)
    ck = assert_equals_eager(model)
    prompt = torch.tensor([[5]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=2, do_sample=False)
    assert ck.generate([5], 2) == want[0, 1:].tolist()      # (one launch; the kernel's cache from step 0 on)


@pytest.mark.parametrize("cls_name,cfg", [
    ("LlamaForCausalLM", dict(num_key_value_heads=6, tie_word_embeddings=False)),
    ("LlamaForCausalLM", dict(num_key_value_heads=1)),     # one KV head: rotate-half on slices of a plain vector
    ("MistralForCausalLM", {}),      # its default window (4,096) is longer than the cache: the plain causal path
    ("Phi3ForCausalLM", dict(pad_token_id=0)),      # fused QKV and gate/up matrices, split by slicing
])
def test_transformers_models_equal_eager(cls_name, cfg):
    model = hf_model(cls_name, **cfg)
    assert_equals_eager(model, kernel_at=())
    if getattr(model.config, "sliding_window", None):
        # the step (window off) computes what the model's own windowed forward does over the sequence
        step, ids = kogc.frontend.decode_step(model), [7, 42, 99]
        with torch.no_grad():
            for pos, t in enumerate(ids):
                got, _ = step(torch.tensor(t), torch.tensor(pos))
            want = model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert rel_err(got, want) < 1e-5 and model.config.sliding_window == 4096


@pytest.mark.parametrize("cls_name,cfg", [("LlamaForCausalLM", {}), ("MistralForCausalLM", {}),
                                         ("Qwen3ForCausalLM", dict(head_dim=16))])
def test_transformers_step_runs_where_it_was_moved(cls_name, cfg):
    # the baselines move the step to the GPU after it was built on the CPU: the cache layers must make their
    # positions there too (the meta device stands in for CUDA: the same mismatch, no GPU needed)
    step = kogc.frontend.decode_step(hf_model(cls_name, **cfg), max_len=32).to("meta")
    logits, _ = step(torch.tensor([5], device="meta"), torch.tensor(3, device="meta"))
    assert logits.device.type == "meta" and logits.shape == (300,)


def test_transformers_llama_is_the_model_files_kernel():
    # a transformers Llama and the single-file Llama of the same shapes compile to one kernel: the same source
    # (but for the model's name in its first line), the same variants, the same tasks per layer; only the order
    # in which placement takes equal-ready tasks may differ. So the H200 figures of examples/llama.py's
    # presets stand for the transformers models of those shapes
    import collections

    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    model = hf_model("LlamaForCausalLM", vocab_size=320, rms_norm_eps=1e-5, tie_word_embeddings=False)
    compiled = []
    for step in (kogc.frontend.decode_step(model, max_len=64), tiny_llama()):
        s = build_schedule(to_ir(step), H200)
        compiled.append(([line for line in render(s).splitlines() if not line.startswith("# Generated")], s.variants,
                         collections.Counter((t.variant, t.layer) for t in s.tasks)))
    assert compiled[0] == compiled[1]


def assert_fp8_kernel_equals_its_weights(model):
    """The model's FP8 kernel at step 0 against the IR on the same quantized weights (fp32, 1e-5)."""
    from kogc.fp8 import fake_quantize
    from kogc.ir import execute
    from kogc.ir.executor import new_state
    from kogc.runtime.kernel import weights_of
    step = kogc.frontend.decode_step(model)
    fp8 = kogc.compile(step, weights="fp8")
    quantized = {t.weight.param for t in fp8.schedule.tasks if t.weight}
    ref = {k: fake_quantize(v) if k in quantized else v for k, v in weights_of(step, fp8.ir).items()}
    logits, nxt = fp8.step(5, 0)
    (want, want_next), _ = execute(fp8.ir, ref, new_state(fp8.ir), [5, 0])
    assert rel_err(logits, want) < 1e-5 and nxt == int(want_next)


def test_biases_equal_eager():
    # Llama with every linear layer biased (attention_bias, mlp_bias): Q/K/V add theirs before RoPE and
    # the cache write, Wo and W2 store their rows for a residual task, W1/W3 are stored (no gated pair):
    # the kernel at step 1, also with FP8 weights (a row's sum times its scale, then the bias). Qwen2 (Q/K/V
    # biased, rotate-half RoPE reordering the bias's rows as the weight's) and the single-file form through
    # the IR. Random biases: transformers starts them at 0.
    def biased(model):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_()
        return model
    model = biased(hf_model("LlamaForCausalLM", attention_bias=True, mlp_bias=True))
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2)
    assert sum(v[-1] == "bias" for v in ck.schedule.variants) == 6
    assert sum(op.kind == "residual" for op in ck.schedule.ops) == 4
    assert_fp8_kernel_equals_its_weights(model)     # each row's sum times its scale, then the (unquantized) bias
    assert_equals_eager(biased(hf_model("Qwen2ForCausalLM", tie_word_embeddings=True)), kernel_at=(), steps=4)
    assert_equals_eager(tiny_llama(qkv_bias=True), kernel_at=(), steps=4)


def test_strict_config_with_a_window_equals_eager():
    # Cwm's config is a strict dataclass (a sliding_window of None refused): kogc's cache is made and the model
    # run with the window off all the same (a window longer than the cache never bites); through the IR
    assert_equals_eager(hf_model("CwmForCausalLM", max_position_embeddings=16384, sliding_window=8192), kernel_at=(),
                        steps=3)


@pytest.mark.parametrize("cls_name,cfg", [
    ("GlmForCausalLM", {}),             # RoPE on half of each head's dims, interleaved; fused gate/up
    ("Glm4ForCausalLM", {}),            # GLM's, and each sublayer's output normed
    ("Exaone4ForCausalLM", dict(sliding_window=4)),     # q and k normed per head, sublayers' outputs normed, windows
    ("SmolLM3ForCausalLM", dict(no_rope_layers=[1, 0])),    # its second layer without RoPE
    ("Olmo3ForCausalLM", dict(sliding_window=4)),       # OLMo2's norms, sliding windows
    ("Ernie4_5ForCausalLM", {}),        # interleaved RoPE at base 500,000
    ("SeedOssForCausalLM", {}),         # Q, K and V biased
])
def test_more_transformers_families_equal_eager(cls_name, cfg):
    # random norm scales and biases (transformers starts them at 1 and 0); the kernel at steps 0 and 5
    model = hf_model(cls_name, pad_token_id=0, **cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    assert_equals_eager(model, kernel_at=(0, 5), steps=6)


@pytest.mark.parametrize("tied", [False, True])
def test_constant_scales_fold_into_weights(tied):
    # Granite: attention scaled by attention_multiplier (not 1/sqrt(head_dim)), the embedding by
    # embedding_multiplier, each sublayer's output by residual_multiplier, the logits divided by
    # logits_scaling: each constant folded into the weights that produce the scaled value (the query
    # projection's rows, the table, Wo's and W2's rows, the LM head's rows), so the kernel is the plain
    # one; the kernel at step 1 and with FP8 weights, of those scaled weights
    model = hf_model("GraniteForCausalLM", attention_multiplier=0.05, embedding_multiplier=12.0, residual_multiplier=0.22,
                     logits_scaling=8.0, tie_word_embeddings=tied)
    ck = assert_equals_eager(model, kernel_at=(1,), steps=3)
    assert not any(n.op.value == "scale" for n in ck.ir.nodes)
    views = [n.attrs.get("view", []) for n in ck.ir.nodes if n.op.value == "param"]
    assert sum(any(s[0] == "scale" for s in v) for v in views) == 2 * 3 + 2     # q, Wo, W2 per layer; table, head
    assert_fp8_kernel_equals_its_weights(model)


def gemma3_model():
    from test_gemma import gemma3
    return gemma3()


@pytest.mark.parametrize("make", [lambda: hf_model("LlamaForCausalLM"), gemma3_model], ids=["llama", "gemma3"])
def test_bf16_kernel_follows_the_ir(make):
    # a bf16 model's kernel (attention's products on tensor cores: tl.dot of bf16) against the IR in bf16 over
    # 3 steps. Bounds of 2.5e-2: under Triton's interpreter fp32 -> bf16 truncates (the GPU rounds to
    # nearest), which the IR does not (measured 1.1e-2 and 1.7e-2; garbage, as from the interpreter's bf16
    # tl.dot, is ~1)
    from kogc.ir import execute
    from kogc.ir.executor import new_state
    from kogc.runtime.kernel import weights_of
    step = kogc.frontend.decode_step(make().to(torch.bfloat16))
    ck = kogc.compile(step)
    weights, state = weights_of(step, ck.ir), new_state(ck.ir)
    for pos, tok in enumerate([5, 17, 33]):
        (want, _), _ = execute(ck.ir, weights, state, [tok, pos])
        logits, _ = ck.step(tok, pos)
        assert logits.dtype == torch.bfloat16 and rel_err(logits.float(), want.float()) < 2.5e-2, pos


@pytest.mark.parametrize("pairs", [False, True])
def test_erf_gelu_mlp_equals_eager(pairs):
    # Llama's MLP gated by GELU (erf's, hidden_act="gelu"): act(gate) * up formed by W2 or by gated pairs
    from kogc.scheduler import TileConfig
    model = hf_model("LlamaForCausalLM", hidden_act="gelu")
    ck = assert_equals_eager(model, kernel_at=(1,), steps=2, tile_config=TileConfig(mlp_pair_inputs=0) if pairs else None)
    kinds = {t.kind_key for t in ck.schedule.tasks}
    assert ("matvec/rmsnorm/gelu_mul" if pairs else "matvec/gelu_mul/residual") in kinds, kinds


def test_transformers_checkpoint_directory(tmp_path, capsys):
    from kogc.cli import main
    model = hf_model("LlamaForCausalLM", seed=5)
    model.save_pretrained(tmp_path)
    code = main(["compile", "--checkpoint", str(tmp_path), "--max-len", "32", "--target", "h200", "--emit", "ir"])
    out, err = capsys.readouterr()
    assert code == 0 and "attention(" in out and "rope(" in out
    code = main(["run", "--model-dir", str(tmp_path), "--max-len", "32", "--prompt-ids", "5,17",
                 "--max-new-tokens", "2", "--interpret"])
    out, err = capsys.readouterr()
    prompt = torch.tensor([[5, 17]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=2, do_sample=False)[0, 2:].tolist()
    assert code == 0 and out.split()[:2] == [str(t) for t in want]
    code = main(["bench", "--model-dir", str(tmp_path), "--max-len", "32", "--context", "4", "--steps", "1",
                 "--reps", "1", "--baselines", "eager", "--interpret"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith(f"{tmp_path} context 4") and "eager (CPU)" in out
    code = main(["bench", "--model-dir", str(tmp_path), "--max-len", "32", "--context", "4", "--steps", "1",
                 "--reps", "1", "--scaling", "--interpret"])
    out, err = capsys.readouterr()
    assert code == 0 and f"| {tmp_path} | " in out
    code = main(["check", "--model-dir", str(tmp_path), "--max-len", "32", "--steps", "1", "--generate", "1",
                 "--interpret"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith(f"{tmp_path} (float32)") and "RESULT: PASS" in out


def word_tokenizer():
    """Words w0 .. w299 as ids 0 .. 299, w1 the EOS token; a chat template of the messages' words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w1")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def test_run_stops_at_the_generation_configs_eos(tmp_path, capsys):
    # kogc run --prompt: the answer ends at the tokenizer's EOS or any id generation_config.json names (as
    # transformers' generate stops: a chat model's end-of-turn token); here the model's second greedy token
    from kogc.cli import main
    from kogc.frontend.transformers_dir import stop_tokens
    model, tok = hf_model("LlamaForCausalLM", seed=6, num_hidden_layers=1), word_tokenizer()
    prompt = torch.tensor([[5]])
    greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False,
                            eos_token_id=None)[0, 1:].tolist()
    model.generation_config.eos_token_id = [greedy[1], 1]
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert stop_tokens(str(tmp_path), tok) == [1, greedy[1]]
    code = main(["run", "--model-dir", str(tmp_path), "--max-len", "16", "--prompt", "w5", "--max-new-tokens", "3",
                 "--interpret"])
    out = capsys.readouterr().out
    assert code == 0 and f"{greedy.index(greedy[1]) + 1} tokens (stopped at EOS)" in out, out


def test_run_with_a_compensated_fp8_head(tmp_path, capsys, monkeypatch):
    # kogc run --weights fp8 --compensate-head: a tied model with a (word-level) tokenizer in its directory;
    # the LM head calibrated on the model's answers to the prompts, then generation: the tokens of that
    # model in torch with the same compensated head, the other matvecs rounded, the embedding as it is
    from kogc import fp8
    from kogc.bench import quality
    from kogc.cli import main
    monkeypatch.setattr(fp8, "CALIBRATION_PROMPTS", fp8.CALIBRATION_PROMPTS[:2])   # (time)
    model = hf_model("LlamaForCausalLM", seed=6, tie_word_embeddings=True, num_hidden_layers=1)
    tok = word_tokenizer()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    run = ["run", "--model-dir", str(tmp_path), "--max-len", "16", "--prompt-ids", "5", "--max-new-tokens", "2",
           "--interpret", "--weights", "fp8"]
    assert main(run + ["--compensate-head"]) == 0
    out, err = capsys.readouterr()
    assert "LM head compensated" in err
    (_, head), = fp8.compensate_head(model, fp8.calibration_text(model, tok)).items()
    ref = quality.quantized_copy(model)          # what the FP8 kernel computes (tests/test_fp8.py)
    with torch.no_grad():
        ref.lm_head.weight.copy_(head.dequantize())
    prompt = torch.tensor([[5]])
    want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=2, do_sample=False)[0, 1:]
    assert out.split()[:2] == [str(t) for t in want.tolist()]
    assert main(run[:-2] + ["--compensate-head"]) == 2          # not without --weights fp8
    assert "--weights fp8" in capsys.readouterr().err


# ---------------------------------------------------------------- what is refused, and how

class OneLayer(torch.nn.Module):
    """One attention layer with each idiom replaceable, for the errors."""

    def __init__(self, act=F.silu, mask="causal", scale=None, repeat="interleave", norm="rms", query="linear"):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.q, self.k, self.v = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))
        self.up, self.out = torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(16, 32, bias=False)
        self.register_buffer("kc", torch.zeros(1, 2, 8, 4))
        self.register_buffer("vc", torch.zeros(1, 2, 8, 4))
        self.act, self.mask, self.scale, self.repeat, self.norm = act, mask, scale, repeat, norm
        self.query = query

    def forward(self, token, pos):
        x = self.emb(token.reshape(1, 1))
        x = F.layer_norm(x, x.shape[-2:]) if self.norm == "layer" else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        q = (self.q(x) if self.query == "linear" else x).view(1, 1, 4, 4).transpose(1, 2)
        k = self.k(x).view(1, 1, 4, 4)[:, :, :2].transpose(1, 2)
        v = self.v(x).view(1, 1, 4, 4)[:, :, 2:].transpose(1, 2)
        self.kc[:, :, pos.reshape(1)] = k
        self.vc[:, :, pos.reshape(1)] = v
        rep = (lambda c: c.repeat_interleave(2, 1)) if self.repeat == "interleave" else (lambda c: c.repeat(1, 2, 1, 1))
        allowed = {"causal": torch.arange(8) <= pos, "window": (torch.arange(8) <= pos) & (torch.arange(8) > pos - 3),
                   "sink": (torch.arange(8) <= pos) & ((torch.arange(8) > pos - 3) | (torch.arange(8) == 0))}
        mask = allowed[self.mask][None, None, None, :] if self.mask in allowed else None
        y = F.scaled_dot_product_attention(q, rep(self.kc), rep(self.vc), attn_mask=mask,
                                           is_causal=self.mask == "is_causal", scale=self.scale)
        h = self.act(self.up(y.transpose(1, 2).reshape(1, 1, 16)))
        logits = self.out(h[..., :16]).reshape(-1)
        return logits, torch.argmax(logits)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(mask=None), "needs a causal mask"),
    (dict(mask="is_causal"), "is_causal=True"),
    (dict(mask="sink"), "neither causal nor a sliding window"),     # a window and position 0 (attention sinks)
    (dict(scale=0.3, query="input"), "scaled by 0.3"),     # (of a projection's output, it is folded into it)
    (dict(repeat="tile"), "KV heads repeated in order"),
    (dict(norm="layer"), "layer_norm over [1, 16]: only the whole last axis"),    # (over two axes)
    (dict(act=F.softplus), "aten.softplus"),
    (dict(act=lambda t: t * F.softmax(t, -1)), "a mixture of experts' routing"),     # (a router's softmax)
])
def test_unsupported_idiom_is_one_line_with_the_source_line(kwargs, needle):
    with pytest.raises(FrontendError) as e:
        to_ir(OneLayer(**kwargs))
    msg = str(e.value)
    assert needle in msg and "test_ordinary.py:" in msg and len(msg.splitlines()) == 1, msg


def test_layers_other_than_attention_are_refused_by_kind():
    # Qwen3-Next's layers of linear attention: one line naming the kind, before anything is traced
    model = hf_model("Qwen3NextForCausalLM", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(FrontendError, match="layers of kind 'linear_attention'"):
        kogc.frontend.decode_step(model)


def test_unsupported_idiom_exit_2_from_the_cli(tmp_path, capsys):
    from kogc.cli import main
    f = tmp_path / "softplus.py"
    f.write_text(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                 "import torch.nn.functional as F\nfrom test_ordinary import OneLayer\n"
                 "def kogc_model(preset=None, checkpoint=None, device='cpu', dtype=None, seed=0):\n"
                 "    return OneLayer(act=F.softplus)\n")
    code = main(["compile", str(f), "--config", "x", "--target", "h200", "--emit", "ir"])
    err = capsys.readouterr().err
    assert code == 2 and "aten.softplus" in err and len(err.strip().splitlines()) == 1
