"""FP8 weights (kogc.fp8): the quantization, the packed stream, and the kernel under Triton's interpreter
against a torch reference of the same quantized weights (fp32 models: within 1e-5 relative)."""
import dataclasses

import pytest
import torch
from conftest import MODEL_FILE, random_cache, rel_err, tiny

import kogc
from kogc.cli import main
from kogc.errors import KogcError
from kogc.fp8 import (Fp8Weight, fake_quantize, fake_quantize_module, from_state_dict, matvec_params, quantize,
                      quantize_blocks, quantize_compensated)
from kogc.ir import execute
from kogc.runtime.kernel import fill_kv_from, weights_of
from kogc.scheduler import TileConfig

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU: test_gpu)")


def test_quantize_per_row():
    torch.manual_seed(0)
    w = torch.randn(5, 64) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 2.0])[:, None]
    q = quantize(w)
    assert q.q.dtype == torch.float8_e4m3fn and q.scale.shape == (5,)
    assert torch.equal(q.q.float().abs().amax(1)[[0, 1, 2, 4]], torch.full((4,), 448.0))   # each row's max maps to 448
    assert q.scale[3] == 1.0 and torch.all(q.q[3].float() == 0)                             # a zero row stays zero
    err = (q.dequantize() - w).abs() / w.abs().amax(1, keepdim=True).clamp_min(1e-30)
    assert float(err.max()) <= 2 ** -4            # 3 mantissa bits: half a step at the top of the range
    # scales per 128 inputs (the alternative measured in docs/fp8.md): a row of <= 128 inputs is one
    # block; a wider row's blocks each scale on their own (E4M3 being floating point, finer scales
    # matter only where a block's values are far below the row's largest)
    assert torch.equal(quantize_blocks(w), fake_quantize(w))
    wide = torch.randn(8, 300) * torch.cat([torch.full((128,), 1e-6), torch.ones(172)])
    assert rel_err(quantize_blocks(wide)[:, :128], wide[:, :128]) < 0.1 * rel_err(fake_quantize(wide)[:, :128],
                                                                                 wide[:, :128])


@pytest.mark.parametrize("shape, dtype", [((70, 33), torch.float32), ((2, 40, 96), torch.float16),
                                          ((9, 130), torch.bfloat16)])
def test_quantize_in_chunks_equals_one_pass(monkeypatch, shape, dtype):
    """Chunks of rows (a few rows each here) give the bytes and scales of one pass over the whole widened
    weight, and leave the weight as it was (an fp32 weight's chunks are copies, divided in place)."""
    import kogc.fp8
    monkeypatch.setattr(kogc.fp8, "QUANTIZE_CHUNK", 200)
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    w[..., 3, :] = 0
    before = w.clone()
    for fmt, dt in (("e4m3fn", torch.float8_e4m3fn), ("e4m3fnuz", torch.float8_e4m3fnuz)):
        got = quantize(w, fmt)
        wf = before.float()
        amax = wf.abs().amax(-1)
        scale = torch.where(amax > 0, amax / torch.finfo(dt).max, torch.ones_like(amax))
        q = (wf / scale[..., None]).clamp(-torch.finfo(dt).max, torch.finfo(dt).max).to(dt)
        assert torch.equal(got.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.scale, scale)
        assert torch.equal(w, before)


def test_fn_to_fnuz_is_exact():
    q = quantize(torch.randn(16, 32) * 3)
    z = q.to_format("e4m3fnuz")
    assert z.q.dtype == torch.float8_e4m3fnuz
    assert torch.equal(z.dequantize(), q.dequantize())
    assert torch.equal(z.to_format("e4m3fn").q.view(torch.uint8), q.q.view(torch.uint8))


def test_from_state_dict():
    w = quantize(torch.randn(6, 16))
    sd = {"a.weight": w.q, "a.weight_scale": w.scale[:, None], "b.weight": torch.randn(3, 3)}
    got = from_state_dict(sd)
    assert list(got) == ["a.weight"] and torch.equal(got["a.weight"].scale, w.scale)
    with pytest.raises(KogcError, match="no scale beside it"):
        from_state_dict({"a.weight": w.q})
    with pytest.raises(KogcError, match="one scale per row"):
        from_state_dict({"a.weight": w.q, "a.weight_scale": torch.ones(6, 2)})


def _against_reference(model, ck, weights, positions):
    """The kernel's logits and token against the IR reference executor with `weights`, per position."""
    fill_kv_from(ck, model)
    state = {k: v.clone() for k, v in model.named_buffers() if k.endswith("_cache")}
    gen = torch.Generator().manual_seed(7)
    for pos in positions:
        tok = int(torch.randint(0, model.config.vocab_size, (), generator=gen))
        logits, nxt = ck.step(tok, pos)
        (ref, ref_tok), _ = execute(ck.ir, weights, state, [tok, pos])
        assert rel_err(logits, ref) < 1e-5, f"pos {pos}"
        assert nxt == int(ref_tok)


def test_kernel_equals_the_quantized_reference():
    # two lanes, fp32: every matvec weight (QKV, Wo, W1/W3, W2, LM head) streamed as FP8 with row scales;
    # the reference dequantizes the same weights and multiplies in fp32; embedding and norms unquantized
    model = tiny(seed=11, num_lanes=2)
    random_cache(model, 3)
    ck = kogc.compile(model, target="h200", weights="fp8")
    assert ck.buffers.W.dtype == torch.float8_e4m3fn and ck.schedule.weight_format == "e4m3fn"
    matvecs = {name for t in ck.schedule.tasks if t.weight for name in (t.weight.param, t.weight.up) if name}
    assert matvecs == matvec_params(ck.ir) and "lm_head.weight" in matvecs     # 7 per layer and the head
    ref_w = {k: fake_quantize(v) if k in matvecs else v for k, v in weights_of(model, ck.ir).items()}
    _against_reference(model, ck, ref_w, (37,))      # (37 positions of random cache in 2 splits)
    # W1 and W3 as (gate, up) row pairs: their rows and scales interleaved in one tile
    paired = kogc.compile(model, target="h200", weights="fp8", tile_config=TileConfig(mlp_pair_inputs=0))
    assert any(t.weight.up for t in paired.schedule.tasks if t.weight)
    _against_reference(model, paired, ref_w, (37,))
    # the stream: one byte per weight (half an fp16 build's), and 4 per row for the scales
    fp16_bytes = sum(t.weight.numel * 2 for t in ck.schedule.tasks if t.weight)
    assert sum(ck.schedule.weight_bytes_per_program()) < 0.55 * fp16_bytes


def test_prequantized_weights_are_packed_as_they_are():
    # weights given in FP8 (rounded on scales 1.5x coarser than kogc's own, so that using them, not
    # requantizing the model's, shows) are streamed as given; the other matvec weights are quantized
    model = tiny(seed=12, num_lanes=2)
    name = "model.layers.0.feed_forward.w2.weight"
    w = model.get_parameter(name).detach()
    scale = quantize(w).scale * 1.5
    given = Fp8Weight((w / scale[..., None]).to(torch.float8_e4m3fn), scale)
    ck = kogc.compile(model, target="h200", weights={name: given})
    assert ck.schedule.tile_config.weights == "fp8"
    matvecs = {name for t in ck.schedule.tasks if t.weight for name in (t.weight.param, t.weight.up) if name}
    ref_w = {k: fake_quantize(v) if k in matvecs else v for k, v in weights_of(model, ck.ir).items()}
    ref_w[name] = given.dequantize()
    assert not torch.equal(ref_w[name], fake_quantize(w))
    _against_reference(model, ck, ref_w, (0,))
    with pytest.raises(KogcError, match="no parameter of that name"):
        kogc.compile(model, target="h200", weights={"nope.weight": given})
    with pytest.raises(KogcError, match="Fp8Weight"):
        kogc.compile(model, target="h200", weights={name: w})
    with pytest.raises(KogcError, match="weights='int4'"):
        kogc.compile(model, target="h200", weights="int4")


def test_eager_reference_of_the_fp8_kernel():
    # kogc check --weights fp8 runs eager on the same quantized weights: written back through the IR's view
    model = tiny(seed=13, num_lanes=2)
    ck = kogc.compile(model, target="h200", weights="fp8")
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    changed = fake_quantize_module(model, ck.ir)
    assert set(changed) == matvec_params(ck.ir) and "model.tok_embeddings.weight" not in changed
    for k, v in model.named_parameters():
        assert torch.equal(v, fake_quantize(before[k]) if k in changed else before[k]), k


def test_interpreter_refuses_fnuz():
    with pytest.raises(KogcError, match="cannot run mi300x's FP8 format"):
        kogc.compile(tiny(seed=1), target="mi300x", interpret=True, weights="fp8")


def test_cli_weights_option(capsys):
    assert main(["compile", MODEL_FILE, "--config", "tiny", "--target", "h200", "--weights", "fp8",
                 "--emit", "schedule"]) == 0
    out = capsys.readouterr().out
    assert "weight bytes (e4m3fn)" in out
    assert main(["compile", MODEL_FILE, "--config", "tiny", "--target", "h200", "--weights", "int8",
                 "--emit", "schedule"]) == 2
    # a tile config may say it too; --weights and the tile config agree
    assert main(["compile", MODEL_FILE, "--config", "tiny", "--target", "h200", "--tile-config",
                 '{"weights": "fp8"}', "--emit", "schedule"]) == 0
    assert "weight bytes (e4m3fn)" in capsys.readouterr().out


def test_fp8_tiles_hold_twice_the_rows():
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    g = to_ir(tiny(num_lanes=2, dtype=torch.float16, hidden_size=256, intermediate_size=1024))
    cfg = TileConfig(tile_bytes=4096)
    rows = {}
    for weights in ("model", "fp8"):
        s = build_schedule(g, H200, tile_config=dataclasses.replace(cfg, weights=weights))
        rows[weights] = max(t.weight.rows for t in s.tasks if t.weight and t.weight.cols == 256)
        assert all(t.weight.nbytes <= 4096 + 4 * t.weight.rows for t in s.tasks if t.weight)
    assert rows["fp8"] == 2 * rows["model"]


def _tied_llama(seed: int):
    """A one-layer transformers Llama with its LM head tied to the embedding (random weights)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=1,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_quality_harness_computes_what_the_kernel_does():
    # kogc.bench.quality measures FP8 on a transformers model through quantized_copy: every Linear per
    # row, the tied head untied from the unquantized embedding. The FP8 kernel of the same model (its
    # rotate-half q/k rows reordered, its tied head) computes exactly that model's logits
    from kogc.bench.quality import quantized_copy
    from kogc.frontend import decode_step
    model = _tied_llama(seed=4)
    q = quantized_copy(model)
    assert torch.equal(q.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(q.lm_head.weight, fake_quantize(model.model.embed_tokens.weight))
    assert torch.equal(q.model.layers[0].mlp.down_proj.weight, fake_quantize(model.model.layers[0].mlp.down_proj.weight))
    ck = kogc.compile(model, target="h200", weights="fp8", max_len=16)
    want_step = decode_step(q, max_len=16)
    for pos, tok in enumerate((7,)):
        logits, nxt = ck.step(tok, pos)
        with torch.no_grad():
            want, want_next = want_step(torch.tensor(tok), torch.tensor(pos))
        assert rel_err(logits, want) < 1e-5 and nxt == int(want_next)
    # the tied matrix given in FP8: the head streams those bytes, the embedding reads them dequantized
    from kogc.runtime.kernel import weights_of
    tied = quantize(model.model.embed_tokens.weight)
    got = weights_of(decode_step(model, max_len=16), ck.ir, {"model.lm_head.weight": tied})
    assert got["model.lm_head.weight"] is not None and torch.equal(got["model.lm_head.weight"].q.view(torch.uint8),
                                                                     tied.q.view(torch.uint8))


def test_a_transformers_directory_stored_in_fp8(tmp_path):
    # safetensors holding float8 weights with NAME_scale beside them: the module gets the dequantized
    # values (transformers alone would load the bare FP8 numbers), kogc streams the stored bytes
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    from kogc.frontend.transformers_dir import load_decode_step
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=1,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    (path,) = tmp_path.glob("*.safetensors")
    state, stored = load_file(path), {}
    for k in [k for k in load_file(path) if k.endswith("proj.weight") or k == "lm_head.weight"]:
        scale = quantize(state[k]).scale * 1.5        # not what kogc would choose: using them shows
        state[k], state[k + "_scale"] = (state[k] / scale[:, None]).to(torch.float8_e4m3fn), scale[:, None]
        stored[k] = Fp8Weight(state[k], scale)
    save_file(state, str(path), metadata={"format": "pt"})
    step = load_decode_step(str(tmp_path), max_len=16)
    w = step.model.model.layers[0].mlp.down_proj.weight
    assert torch.equal(w, stored["model.layers.0.mlp.down_proj.weight"].dequantize())
    ck = kogc.compile(step, target="h200", weights="fp8")
    assert ck.schedule.tile_config.weights == "fp8"
    logits, nxt = ck.step(11, 0)
    with torch.no_grad():
        want, want_next = step(torch.tensor(11), torch.tensor(0))
    assert rel_err(logits, want) < 1e-5 and nxt == int(want_next)


def test_compensated_rounding_lowers_the_output_error():
    # the same per-row scales as quantize, each input's rounding error pushed onto the inputs after it:
    # the layer's output error over correlated inputs is lower, on the calibration inputs and on new ones
    gen = torch.Generator().manual_seed(3)
    w, mix = torch.randn(64, 48, generator=gen), torch.randn(48, 48, generator=gen)
    cal, new = (torch.randn(400, 48, generator=gen) @ mix for _ in range(2))
    c, r = quantize_compensated(w, cal.double().T @ cal.double()), quantize(w)
    assert torch.equal(c.scale, r.scale) and c.q.dtype == torch.float8_e4m3fn and not torch.equal(c.q, r.q)
    for x in (cal, new):
        err = [float((x @ (q.dequantize() - w).T).norm()) for q in (c, r)]
        assert err[0] < 0.9 * err[1]


def test_compensated_head_is_streamed_alone():
    # kogc.fp8.compensate_head: a transformers model's LM head (tied here) in FP8 with compensated
    # rounding, given to compile by its name in the model: the kernel streams it, the embedding keeps
    # its own values, the other matvecs are rounded as with weights="fp8"; the same logits in torch
    from kogc.bench.quality import quantized_copy
    from kogc.fp8 import compensate_head
    from kogc.frontend import decode_step
    model = _tied_llama(seed=5)
    head = compensate_head(model, [torch.randint(0, 300, (1, 48))])
    (name, w), = head.items()
    assert name == "lm_head.weight" and torch.equal(w.keep, model.lm_head.weight)
    assert not torch.equal(w.q.view(torch.uint8), quantize(model.lm_head.weight).q.view(torch.uint8))
    ck = kogc.compile(model, target="h200", weights=head, max_len=16)
    ref = quantized_copy(model)
    with torch.no_grad():
        ref.lm_head.weight.copy_(w.dequantize())
    assert torch.equal(ref.model.embed_tokens.weight, model.model.embed_tokens.weight)
    step = decode_step(ref, max_len=16)
    logits, nxt = ck.step(7, 0)
    with torch.no_grad():
        want, want_next = step(torch.tensor(7), torch.tensor(0))
    assert rel_err(logits, want) < 1e-5 and nxt == int(want_next)


@pytest.mark.parametrize("ffn", [2048, 4608])
def test_fp8_tiles_in_row_groups_equal_the_reference(ffn):
    # tiles whose rows each warp owns whole (kogc.scheduler.tasks.row_groups): the stream reordered at
    # packing, the products summed inside warps; the same logits as the reference of the same FP8 weights.
    # ffn 4608: W2's 2304 inputs a lane as column parts of 2048 (in row groups) and 256 (rows as they are)
    from kogc.scheduler.tasks import column_parts, row_groups
    model = tiny(seed=13, num_lanes=2, hidden_size=512, intermediate_size=ffn)
    random_cache(model, 4)
    ck = kogc.compile(model, target="h200", weights="fp8")
    grouped = [t for t in ck.schedule.tasks
               if t.weight and row_groups(t.weight.rows, column_parts(t.weight.cols)[0][0], 1, ck.schedule.target) > 1]
    assert grouped and len(grouped) < sum(1 for t in ck.schedule.tasks if t.weight)    # both orders in one kernel
    matvecs = matvec_params(ck.ir)
    ref_w = {k: fake_quantize(v) if k in matvecs else v for k, v in weights_of(model, ck.ir).items()}
    _against_reference(model, ck, ref_w, (21,))


def test_which_fp8_tiles_are_streamed_in_row_groups():
    # a warp's row group where a flat row would span warps and a thread's share stays <= 64 columns
    from kogc.scheduler.tasks import row_groups
    from kogc.targets import H200, MI300X
    assert row_groups(16, 2048, 1, H200) == 4 and row_groups(32, 1024, 1, H200) == 4   # laneformer-2b's
    assert row_groups(8, 4096, 1, H200) == 1       # 128 columns a thread (laneformer-7b's QKV, W1/W3: slower)
    assert row_groups(64, 512, 1, H200) == 1 and row_groups(128, 256, 1, H200) == 1   # a row is one warp's
    assert row_groups(2, 2048, 1, H200) == 1 and row_groups(12, 2048, 1, H200) == 1   # rows per warp
    assert row_groups(16, 2048, 1, MI300X) == 1    # not measured on AMD: rows as they are


def test_prequantized_weight_through_a_folded_scale():
    # a constant folded into a weight (kogc.frontend.aten.scale_param: Granite's multipliers) scales a
    # pre-quantized weight's row scales, exactly, and leaves its FP8 values as given
    from kogc.fp8 import quantize
    from kogc.runtime.kernel import _fp8_view
    w = quantize(torch.randn(8, 16))
    v = _fp8_view(w, [["scale", 0.22], ["lane"]], "w")
    assert torch.equal(v.q.view(torch.uint8), w.q.view(torch.uint8)[None])
    assert torch.equal(v.scale, w.scale[None] * 0.22)
