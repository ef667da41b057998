"""Ordinary decoders over several GPUs: the heads and the MLP's width cut into G lanes that sum at once
(kogc.ir.lanes), each rank's kernel under Triton's interpreter in one process (kogc.runtime.ranks), against eager
and the IR reference (fp32, 1e-5)."""
import dataclasses

import pytest
import torch
from conftest import rel_err
from test_ordinary import hf_model

import kogc
from kogc.fp8 import fake_quantize_module
from kogc.frontend import decode_step, to_ir
from kogc.ir.executor import execute, new_state
from kogc.ir.graph import Op
from kogc.ir.lanes import LanesError, heads_as_lanes
from kogc.runtime.kernel import weights_of
from kogc.settings import INTERPRETER_TILES

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
transformers = pytest.importorskip("transformers")
ONE_SPLIT = dataclasses.replace(INTERPRETER_TILES, attn_splits=1)
WIDE = dict(num_attention_heads=8, num_key_value_heads=4, hidden_size=128, intermediate_size=192)


def check_ranks(model, gpus, steps=3, weights="model"):
    """The ranks' gathered logits and token against eager's and the IR's of the G-lane graph at each step."""
    ck = kogc.compile(decode_step(model, max_len=16), gpus=gpus, tile_config=ONE_SPLIT, weights=weights)
    step = decode_step(model, max_len=16)
    graph = heads_as_lanes(to_ir(step), gpus)
    if weights == "fp8":
        fake_quantize_module(step, graph)
    refs, state = weights_of(step, graph), new_state(graph)
    for pos, tok in enumerate(torch.randint(0, 300, (steps,), generator=torch.Generator().manual_seed(gpus)).tolist()):
        with torch.no_grad():
            want, want_next = step(torch.tensor(tok), torch.tensor(pos))
        (ir, ir_next), _ = execute(graph, refs, state, [tok, pos])
        logits, nxt = ck.step(tok, pos)
        assert rel_err(ir, want) < 1e-5 and rel_err(logits, want) < 1e-5, pos
        assert nxt == int(want_next) == int(ir_next)
    return ck, graph


@pytest.mark.parametrize("cls,gpus,cfg", [
    # one KV head and its 2 query heads a GPU; the LM head tied to the embedding, cut into vocabulary shards
    ("LlamaForCausalLM", 4, dict(tie_word_embeddings=True)),
    # Q, K and V biased (each GPU its rows' bias), a width of 96 (the final norm's exchange in 128 lanes)
    ("Qwen2ForCausalLM", 2, dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96, intermediate_size=160)),
    ("Qwen3ForCausalLM", 2, dict(head_dim=16)),                 # q and k normed per head: the scale per head
    # norms without weights (ones), q and k normed after RoPE, a squared-ReLU MLP, soft-capped logits
    ("NanoChatForCausalLM", 2, dict(pad_token_id=299)),
])
def test_ordinary_decoders_over_gpus_equal_eager(cls, gpus, cfg):
    ck, graph = check_ranks(hf_model(cls, **{**WIDE, **cfg}), gpus, steps=3 if gpus == 4 else 2)
    assert graph.meta["num_lanes"] == gpus and ck.ranks == gpus
    sums = [n for n in graph.nodes if n.op is Op.LANE_SUM]
    assert len(sums) == 2 * 2          # after attention and after the MLP, in each of 2 layers


def test_biased_and_parallel_blocks_over_gpus_equal_eager():
    # GPT-NeoX: attention and MLP in parallel (their partial sums added to h in turn), every layer biased (the
    # output projections' biases on the first lane alone)
    from test_layer_norm_families import family
    model = family("gpt_neox", num_key_value_heads=8, hidden_size=128, num_attention_heads=8, intermediate_size=192)
    _, graph = check_ranks(model, 2, steps=2)
    assert any(n.attrs.get("view", [[None]])[-1][0] == "lane_first" for n in graph.nodes if n.op is Op.PARAM)


def test_biased_lm_head_over_gpus_equals_eager():
    # Phi: the LM head's bias (random here) cut into the ranks' vocabulary shards as its rows are; 4 ranks of 75 rows
    from test_layer_norm_families import family
    model = family("phi", num_key_value_heads=8, hidden_size=128, num_attention_heads=8, intermediate_size=192)
    with torch.no_grad():
        model.lm_head.bias.normal_(0.0, 1.0)
    ck, graph = check_ranks(model, 4, steps=1)
    assert [n.attrs["row0"] for n in ck.schedules[1].graph.nodes if n.op is Op.PARAM and n.attrs.get("row0")] == [75, 75]


def test_fp8_weights_over_gpus():
    # each GPU's column slices quantized per row of its own tiles; the references run the same quantized weights
    check_ranks(hf_model("LlamaForCausalLM", **WIDE), 2, steps=1, weights="fp8")


def test_generation_over_gpus_equals_transformers():
    # (2 GPUs of a Llama: the prompt's steps and the generated ones in one launch per rank)
    model = hf_model("LlamaForCausalLM", **WIDE)
    ck = kogc.compile(decode_step(model, max_len=16), gpus=2, tile_config=ONE_SPLIT)
    prompt = torch.tensor([[5]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False)
    assert ck.generate([5], 3) == want[0, 1:].tolist()


def test_lane_views():
    from kogc.ir.views import derive_step
    w = torch.arange(24.0).reshape(4, 6)
    assert derive_step(w, ("lanes", 2))[1].tolist() == w[2:].tolist()
    assert derive_step(w, ("lane_cols", 2))[1].tolist() == w[:, 3:].tolist()
    cache = torch.arange(2 * 4 * 3.0).reshape(1, 2, 4, 3)
    assert derive_step(cache, ("lane_heads", 2))[1].tolist() == cache[0, 1:].tolist()


@pytest.mark.parametrize("cls,cfg,needle", [
    ("LlamaForCausalLM", dict(num_key_value_heads=3), "2 GPUs do not divide the 3 KV heads"),
    ("Olmo2ForCausalLM", {}, "a norm of a projection's whole output"),             # q and k normed over all heads
    ("Gemma3ForCausalLM", dict(config_name="Gemma3TextConfig", head_dim=16), "a norm of a projection's whole output"),
])
def test_what_is_not_cut_over_gpus_is_one_line(cls, cfg, needle):
    graph = to_ir(decode_step(hf_model(cls, **cfg), max_len=16))
    with pytest.raises(LanesError) as e:
        heads_as_lanes(graph, 2)
    assert needle in str(e.value) and "--gpus 2" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_alibi_is_not_cut_over_gpus():
    from test_alibi import bloom
    with pytest.raises(LanesError, match="ALiBi"):
        heads_as_lanes(to_ir(decode_step(bloom(hidden_size=128, n_head=8), max_len=16)), 2)


def test_tp_baseline_takes_the_decoders_shapes():
    # `kogc bench --gpus G`'s TP=G stack for an ordinary decoder: its sizes from its fused ops; rank 1 of 2's step
    from kogc.bench.handwritten import shapes_of_model, step_fn
    shapes = shapes_of_model(decode_step(hf_model("LlamaForCausalLM", **WIDE), max_len=16))
    assert (shapes.hidden, shapes.heads, shapes.kv_heads, shapes.head_dim, shapes.ffn) == (128, 8, 4, 16, 192)
    sums = []
    step, _ = step_fn(shapes, 8, "cpu", world=2, rank=1, all_reduce=lambda t, op="sum": sums.append(op),
                      dtype=torch.float32)
    assert torch.isfinite(step()).all() and sums == ["sum"] * 2 * shapes.layers + ["max"]


@pytest.mark.parametrize("cls,gpus,cfg", [
    ("LlamaForCausalLM", 4, dict(tie_word_embeddings=True)),      # one KV head a rank, the head tied
    # Q, K and V biased, a width of 96, rotate-half RoPE's rows reordered in the views: the copies follow them
    ("Qwen2ForCausalLM", 2, dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96, intermediate_size=160)),
])
def test_a_mirrored_rank_of_an_ordinary_decoder_computes_the_model_with_copied_lane_groups(cls, gpus, cfg):
    """Rank 0 of G alone, its peers mirrored: the model whose every rank's KV heads, query heads and MLP slice
    are copies of rank 0's (copied in the model's own tensors through the lanes' views), on rank 0's
    vocabulary shard (fp32, 1e-5) and its token that shard's best."""
    from kogc.bench.against_eager import mirror_lane_groups
    from kogc.ir.shard import vocab_shard
    model = hf_model(cls, **{**WIDE, **cfg})
    step = decode_step(model, max_len=16)
    before = {k: v.clone() for k, v in step.named_parameters()}
    mirror_lane_groups(step, gpus)
    changed = [k for k, v in step.named_parameters() if not torch.equal(v, before[k])]
    assert any("q_proj" in k for k in changed) and any("down_proj" in k for k in changed)
    assert not any("norm" in k or "embed" in k for k in changed)
    ck = kogc.compile(step, gpus=gpus, one_gpu="mirror", tile_config=ONE_SPLIT)
    lo, n = vocab_shard(model.config.vocab_size, gpus, 0)
    for pos, tok in enumerate([5, 17, 230]):
        with torch.no_grad():
            want, _ = step(torch.tensor(tok), torch.tensor(pos))
        logits, got = ck.step(tok, pos)
        assert rel_err(logits, want[lo:lo + n]) < 1e-5, pos
        assert got == lo + int(want[lo:lo + n].argmax())


def test_sweep_of_a_mirrored_rank_of_an_ordinary_decoder(tmp_path, capsys):
    """`kogc sweep --gpus 2 --mirror` of the single-file Llama: checked against eager on the model with rank 0's
    KV heads, MLP slice and random cache rows copied over rank 1's (without the cache's copy: another token)."""
    import json
    import os
    from conftest import EXAMPLES
    from kogc.cli import main
    out = tmp_path / "sweep.json"
    assert main(["sweep", os.path.join(EXAMPLES, "llama.py"), "--config", "tiny", "--gpus", "2", "--mirror",
                 "--interpret", "--context", "5", "--steps", "1", "--reps", "1", "--variants", "[{}]",
                 "--json", str(out)]) == 0, capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] and row["mirror_of"] == 2 and row["rel_err_vs_eager"] < 1e-5 and row["same_token_as_eager"]


def test_the_bench_checks_a_mirrored_ordinary_decoder_against_the_model_it_computes():
    """`kogc bench --gpus G --mirror`'s check of the single-file Llama: with rank 0's KV heads, MLP slice and random
    cache copied over the other ranks', the mirrored rank's step equals eager's on rank 0's vocabulary shard; with
    the cache left as drawn it does not (the check can fail)."""
    import os
    from conftest import EXAMPLES
    from kogc.bench.against_eager import check_step, mirror_lane_groups
    from kogc.frontend.model_file import build_model
    from kogc.runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv
    model = build_model(os.path.join(EXAMPLES, "llama.py"), preset="tiny", seed=3)
    ck = kogc.compile(model, gpus=2, one_gpu="mirror", tile_config=ONE_SPLIT)
    randomize_kv(kv_cache_buffers(ck.ir, model), 6, torch.Generator().manual_seed(3))
    mirror_lane_groups(model, 2)
    randomize_kv(kv_cache_buffers(ck.ir, model), 6, torch.Generator().manual_seed(4))     # the cache drawn again
    fill_kv_from(ck, model)
    assert not check_step(ck, model, 6, "cpu", mirror_of=2)["ok"]
    mirror_lane_groups(model, 2)
    fill_kv_from(ck, model)
    c = check_step(ck, model, 6, "cpu", mirror_of=2)
    assert c["ok"] and c["rel_err"] < 1e-5 and c["token"] == c["eager_token"], c


def test_a_mirrored_ordinary_decoders_task_times_name_their_schedule():
    """A stamps file of `kogc bench --gpus 2 --mirror` of the single-file Llama (its meta) is read with the mirrored
    rank's schedule, the decoder cut into 2 lanes as kogc.compile cuts it (kogc analyze, kogc predict --bodies)."""
    import os
    from conftest import EXAMPLES
    from kogc.analysis.stamps import schedule_for
    from kogc.frontend.model_file import build_for_tracing
    from kogc.scheduler.ranks import build_rank_schedules, exchange_events
    from kogc.targets import get_target
    llama = os.path.join(EXAMPLES, "llama.py")
    s = schedule_for({"mirror_of": 2, "model_file": llama, "config": "tiny"}, num_programs=8)
    rank0 = build_rank_schedules(to_ir(build_for_tracing(llama, preset="tiny"), gpus=2), 2, get_target("h200"),
                                 num_programs=8)[0]
    assert s.ranks == 2 and len(s.tasks) == len(rank0.tasks) and exchange_events(s)


def test_the_mirror_refuses_a_bias_kept_on_the_first_lane():
    # GPT-NeoX's output projections keep their biases on the first lane: every mirrored peer would add it again
    from test_layer_norm_families import family
    from kogc.errors import KogcError
    from kogc.runtime.ranks import copy_lane_groups
    step = decode_step(family("gpt_neox", num_key_value_heads=8, hidden_size=128, num_attention_heads=8,
                              intermediate_size=192), max_len=16)
    with pytest.raises(KogcError, match="added by every mirrored peer"):
        copy_lane_groups(to_ir(step, gpus=2), dict(step.named_parameters()), 2)
    with pytest.raises(KogcError, match="one lane; cut it into lanes first"):
        copy_lane_groups(to_ir(step), dict(step.named_parameters()), 2)


def test_cli_compiles_an_ordinary_decoder_per_rank(capsys):
    # `kogc compile --gpus 2` of the single-file Llama schedules both ranks (no GPU); a G that does not divide its
    # KV heads is exit 2 with one line
    import os
    from conftest import EXAMPLES
    from kogc.cli import main
    llama = os.path.join(EXAMPLES, "llama.py")
    assert main(["compile", llama, "--config", "tiny", "--target", "h200", "--gpus", "2", "--emit", "schedule"]) == 0
    assert "placement parallel" in capsys.readouterr().out
    assert main(["compile", llama, "--config", "tiny", "--target", "h200", "--gpus", "3", "--emit", "schedule"]) == 2
    err = capsys.readouterr().err.strip()
    assert "3 GPUs do not divide the 2 KV heads" in err and len(err.splitlines()) == 1
