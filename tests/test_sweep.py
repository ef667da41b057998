"""`kogc sweep` under the interpreter: every variant at every context, each checked against eager and
the first variant; bad variants refused before anything runs."""
import json
import os

import pytest
import torch
from conftest import EXAMPLES

from kogc.bench.sweep import parse_variants
from kogc.cli import main
from kogc.frontend import decode_step, to_ir
from kogc.frontend.model_file import build_model
from kogc.runtime.kernel import kv_cache_buffers

MICRO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "micro_laneformer.py")
LLAMA = os.path.join(EXAMPLES, "llama.py")

# runs the kernel under Triton's interpreter in this process: a CPU test (a process that runs GPU
# kernels has imported Triton without the interpreter)
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter in-process: CPU only")


@CPU_ONLY
def test_sweep_under_the_interpreter(tmp_path, capsys, monkeypatch):
    real_to = torch.nn.Module.to

    def to_and_back(module, *args, **kwargs):    # new buffer tensors, as a move to a GPU and back gives
        module = real_to(module, *args, **kwargs)
        for m in module.modules():
            m._buffers.update({k: b.clone() for k, b in m._buffers.items() if b is not None})
        return module
    monkeypatch.setattr(torch.nn.Module, "to", to_and_back)
    out = tmp_path / "sweep.json"
    rc = main(["sweep", MICRO, "--config", "micro", "--interpret", "--context", "6,3", "--steps", "1", "--reps", "1",
               "--variants", '[{}, {"attn_splits": 4, "target": "h100"}]', "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    res = json.loads(out.read_text())
    rows = res["rows"]
    second = {"attn_splits": 4, "target": "h100"}
    assert [(r["variant"], r["context"]) for r in rows] == [({}, 6), ({}, 3), (second, 6), (second, 3)]
    assert [r["target"] for r in rows] == ["h200", "h200", "h100", "h100"]
    assert all(r["ok"] and r["same_token_as_eager"] and r["rel_err_vs_eager"] < 1e-5 for r in rows)
    assert rows[0]["rel_err_vs_first_variant"] == 0.0 and rows[2]["rel_err_vs_first_variant"] < 1e-5
    assert rows[2]["tasks"] > rows[0]["tasks"]            # more attention splits, more tasks
    # each row names its kernel by its source's hash: one kernel per variant, the same at both contexts
    assert rows[0]["kernel_source_sha1"] == rows[1]["kernel_source_sha1"] != rows[2]["kernel_source_sha1"]
    assert len(rows[0]["kernel_source_sha1"]) == 12
    assert res["passed"] and len(text.strip().splitlines()) == 4 and "vs eager" in text


@CPU_ONLY
def test_sweep_lets_an_fp32_copy_decide_a_16_bit_step_that_misses_the_limit(monkeypatch, capsys):
    # a limit below 0 so that an fp16 model's step misses it: the row then carries the fp32 copy's verdict,
    # kogc's and eager's errors against it, and its ok is that verdict
    import kogc.bench.sweep as sweep
    monkeypatch.setattr(sweep, "default_max_rel_err", lambda dtype: -1.0)
    res = sweep.run_sweep(MICRO, "micro", "[{}]", [6], steps=1, reps=1, interpret=True,
                          overrides={"torch_dtype": "float16"}, quiet=True)
    row = res["rows"][0]
    f = row["fp32"]
    assert f["eager_rel_err"] > 0 and row["ok"] == f["ok"] == res["passed"], row
    assert "against an fp32 copy" in sweep.format_row(row)

def test_variants_are_parsed_and_checked():
    (v, cfg, opts), = parse_variants('[{"attn_splits": 4, "num_programs": 8}]', interpret=True)
    assert v == {"attn_splits": 4, "num_programs": 8} and cfg.attn_splits == 4 and opts == {"num_programs": 8}
    assert parse_variants("{}", interpret=False)[0][1] is None        # one object: one variant, the defaults
    # --tile-config is every variant's start; a variant's own fields win
    (_, a, _), (_, b, _) = parse_variants('[{}, {"attn_splits": 8}]', False,
                                          base='{"attn_splits": 4, "elem_block": 512}')
    assert (a.attn_splits, a.elem_block, b.attn_splits, b.elem_block) == (4, 512, 8, 512)
    (_, cfg, opts), = parse_variants('[{"target": "h100", "attn_splits": 4}]', False)     # a run option
    assert opts == {"target": "h100"} and cfg.attn_splits == 4


@CPU_ONLY
@pytest.mark.parametrize("variants, message", [
    ("[{", "not JSON"),
    ("[1]", "JSON list of objects"),
    ("[]", "JSON list of objects"),
    ('[{"tile_size": 4096}]', "unknown field"),
    ('[{"attn_splits": 3}]', "attn_splits"),
    ('[{"num_programs": 0}]', "num_programs must be a positive integer"),
    ('[{"target": "a100"}]', "target must be one of h100, h200, mi300x"),
    ('[{"profile": true}]', "needs a GPU timer"),
])
def test_sweep_bad_variants(variants, message, capsys):
    assert main(["sweep", MICRO, "--config", "micro", "--interpret", "--variants", variants]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kogc: error: ") and message in err[0], err


@CPU_ONLY
def test_sweep_out_without_a_profiled_variant_is_refused(tmp_path, capsys):
    # --out holds profiled variants' task times and traces; the rows go to --json
    out = str(tmp_path / "rows.json")
    assert main(["sweep", MICRO, "--config", "micro", "--interpret", "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "--json" in err[0], err
    assert not (tmp_path / "rows.json").exists()


@CPU_ONLY
def test_sweep_bad_context(capsys):
    assert main(["sweep", MICRO, "--config", "micro", "--interpret", "--context", "1,x"]) == 2
    assert "--context must be comma-separated integers" in capsys.readouterr().err
    assert main(["sweep", MICRO, "--config", "micro", "--interpret", "--context", "120", "--steps", "50"]) == 2
    assert "do not fit the KV cache" in capsys.readouterr().err
    # a cache whose buffers are not named *cache (a cache module's `k` and `v`): refused the same way, not
    # an eager step past the cache's end
    assert main(["sweep", LLAMA, "--config", "tiny", "--max-len", "32", "--interpret", "--context", "28",
                 "--steps", "8"]) == 2
    assert "do not fit the KV cache of 32" in capsys.readouterr().err


def test_sweep_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["sweep", "--config", "tiny"]) == 2
    assert capsys.readouterr().err.startswith("kogc: error: no GPU here")


def test_sweep_row_says_when_the_chained_launches_do_not_repeat():
    # the kernel is deterministic: 16 chained launches run twice from the same cache must give the same
    # logits; a row whose two runs differ says so (and run_sweep marks it failed)
    from kogc.bench.sweep import format_row
    row = dict(variant={"tile_bytes": 16384}, num_programs=396, context=1024, ms_median=1.0, generate_ms_median=1.0,
               tok_per_s=1000.0, of_floor=0.5, tasks=10, rel_err_vs_eager=1e-3, same_token_as_eager=True,
               argmax_miss_vs_eager=None, rel_err_vs_first_variant=0.0, chain_rel_err_vs_first_variant=2e-3,
               chain_repeat_rel_err=2e-3, ok=False)
    assert "the same launches again: 2.0e-03, NOT REPRODUCED" in format_row(row) and "MISMATCH" in format_row(row)
    row.update(chain_repeat_rel_err=0.0, ok=True)
    assert "NOT REPRODUCED" not in format_row(row) and "MISMATCH" not in format_row(row)
    assert "vs the first variant" not in format_row(row)        # the first variant itself (0.0), or a row without
    row.update(ms_vs_first_variant=-0.026)
    assert "1.000 ms (-2.6% vs the first variant)," in format_row(row)


@pytest.mark.parametrize("model_file,preset,names", [
    (MICRO, "micro", ("k_cache", "v_cache")),
    (LLAMA, "tiny", (".k", ".v")),                 # a cache module's buffers: not named *cache
])
def test_kv_caches_are_the_state_the_ir_reads(model_file, preset, names):
    # what the sweep, the bench and the scaling bench fill with a random cache: every buffer the IR reads as
    # state, whatever the model calls it
    model = build_model(model_file, preset=preset)
    caches = kv_cache_buffers(to_ir(decode_step(model)), model)
    layers = sum(1 for n, _ in model.named_buffers() if n.endswith(names[0]))
    assert layers >= 1 and len(caches) == 2 * layers
    assert all(n.endswith(names) for n in caches)
