"""`kogc check`: the tie-aware argmax comparison (pure, CPU), the command under the interpreter, its
refusals; on a GPU the correctness checks of laneformer-2b and tiny."""
import json
import os

import pytest
import torch
from conftest import MODEL_FILE

from kogc.check import run_check
from kogc.compare import fp16_ulp, is_near_tie, no_farther_than_eager, tie_aware_mismatches
from kogc.cli import main

MICRO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "micro_laneformer.py")
ULP10 = 2.0 ** -7            # fp16's spacing in [8, 16)

# runs the kernel under Triton's interpreter in this process: a CPU test (a process that runs GPU
# kernels has imported Triton without the interpreter)
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter in-process: CPU only")


def _row(*head, vocab=8):
    """fp16 logits: `head` first, then zeros."""
    row = torch.zeros(vocab, dtype=torch.float16)
    row[:len(head)] = torch.tensor(head, dtype=torch.float16)
    return row


def test_fp16_ulp():
    assert float(fp16_ulp(1.0)) == 2.0 ** -10
    assert float(fp16_ulp(1.5)) == 2.0 ** -10
    assert float(fp16_ulp(-10.0)) == ULP10
    assert float(fp16_ulp(1000.0)) == 0.5
    assert float(fp16_ulp(0.0)) == 2.0 ** -24            # the subnormals' spacing
    assert float(fp16_ulp(1.0, torch.bfloat16)) == 2.0 ** -7
    x = torch.tensor(10.0, dtype=torch.float16)           # one step up is the next fp16 number
    assert float(x + torch.tensor(ULP10, dtype=torch.float16)) > 10.0
    assert float(x + torch.tensor(ULP10 / 4, dtype=torch.float16)) == 10.0


def test_near_tie_is_excused_and_a_real_miss_counts():
    rows = [_row(10.0, 10.0 - ULP10),          # kogc picks 1: eager's top two one fp16 step apart: a tie
            _row(10.0, 9.9),                   # kogc picks 1: 12.8 steps below eager's max: a real miss
            _row(10.0, 9.9),                   # kogc picks eager's token
            _row(10.0, 10.0 - 2 * ULP10),      # 2 steps: still a tie
            _row(10.0, 10.0 - 3 * ULP10),      # 3 steps: a miss
            _row(10.0, 10.0, 2.0),             # kogc picks 2 where 0 and 1 tie: far below the max, a miss
            _row(10.0, 10.0)]                  # an exact tie, kogc picks the second: fine
    tokens = [1, 1, 0, 1, 1, 2, 1]
    misses = tie_aware_mismatches(rows, tokens)
    assert [m["step"] for m in misses] == [1, 4, 5]
    m = misses[0]
    assert m["kogc"] == 1 and m["eager"] == 0 and abs(m["gap_ulps"] - 0.1 / ULP10) < 0.2
    assert misses[1]["gap_ulps"] == 3.0 and misses[1]["top2_gap"] == 3 * ULP10
    assert misses[2]["top2_gap"] == 0.0                          # eager's own top two tie, kogc's token does not
    # a wider tolerance excuses more; a stacked tensor works as well as a list of rows
    assert [m["step"] for m in tie_aware_mismatches(torch.stack(rows), tokens, ulps=3)] == [1, 5]
    assert [m["step"] for m in tie_aware_mismatches(rows, tokens, ulps=20)] == [5]
    # a token outside the vocabulary always counts
    assert tie_aware_mismatches([_row(1.0)], [99])[0]["gap"] == float("inf")
    with pytest.raises(ValueError):
        tie_aware_mismatches(rows, tokens[:-1])


def test_ulps_are_taken_at_the_magnitude_of_the_maximum():
    # the same absolute gap is a tie at a large logit and a miss at a small one
    gap = 0.01
    assert not tie_aware_mismatches([_row(20.0, 20.0 - gap)], [1])       # spacing 2**-6 at 20: under 1 step
    assert tie_aware_mismatches([_row(0.5, 0.5 - gap)], [1])             # spacing 2**-11 at 0.5: 20 steps
    assert is_near_tie(_row(20.0, 20.0 - gap)) and not is_near_tie(_row(0.5, 0.5 - gap))


def test_fp32_reference_slack():
    assert no_farther_than_eager(1.91e-3, 1.90e-3)           # within 10%
    assert not no_farther_than_eager(2.5e-3, 1.90e-3)        # a quarter farther
    assert no_farther_than_eager(3e-7, 0.0)                  # an fp32 model: eager is its own reference
    assert not no_farther_than_eager(1e-4, 0.0)


@CPU_ONLY
def test_check_under_the_interpreter(tmp_path, capsys):
    # the whole command on a one-layer model: steps against eager and fp32, one generation against
    # eager and a step loop; PASS, exit code 0 and the JSON
    out = tmp_path / "check.json"
    rc = main(["check", MICRO, "--config", "micro", "--interpret", "--steps", "1", "--generate", "1",
               "--prompt-ids", "3", "--fp32-ref", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "RESULT: PASS" in text and "fp32 reference" in text and "step loop same tokens" in text
    res = json.loads(out.read_text())
    assert res["passed"] and res["steps"] == 1 and res["max_rel_err"] < 1e-4 and not res["argmax_misses"]
    assert res["reference"] == "eager (no GPU)" and "eager reference run as: eager (no GPU)" in text
    assert res["fp32"]["kogc_no_farther_than_eager"]
    g = res["generation"]
    assert g["tokens"] == 1 and g["step_loop_same_tokens"] and not g["argmax_misses"]
    # the same model held to an impossible tolerance fails: exit code 1, the reason on the RESULT line
    rc = main(["check", MICRO, "--config", "micro", "--interpret", "--steps", "1", "--generate", "0",
               "--max-rel-err", "1e-12"])
    text = capsys.readouterr().out
    assert rc == 1 and "RESULT: FAIL: steps: max relative error" in text


@CPU_ONLY
@pytest.mark.parametrize("argv, message", [
    (["check", MICRO, "--config", "micro", "--interpret", "--steps", "0", "--generate", "0"], "nothing to check"),
    (["check", MICRO, "--config", "micro", "--interpret", "--steps", "-1"], "must be >= 0"),
    (["check", MICRO, "--config", "micro", "--interpret", "--steps", "1000", "--generate", "0"], "does not fit"),
    (["check", MICRO, "--config", "micro", "--interpret", "--prompt-ids", "1,x"], "--prompt-ids"),
    (["check", MICRO, "--config", "nope", "--interpret"], "unknown preset"),
    (["check", MICRO, "--config", "micro", "--interpret", "--tile-config", '{"tile_size": 4096}'], "unknown field"),
    (["check", "--steps", "x"], "invalid int value"),
    (["check", "--max-rel-err", "0"], "--max-rel-err: must be > 0"),
    (["check", MICRO, "--config", "micro", "--interpret", "--json", "/nonexistent-dir/c.json"], "no folder"),
    (["check", MICRO, "--config", "micro", "--interpret", "--json", os.path.dirname(MICRO)], "a folder is there"),
])
def test_check_bad_input(argv, message, capsys):
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[check]")]
    assert len(err) == 1 and err[0].startswith("kogc: error: ") and message in err[0], err


def test_check_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["check", "--config", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kogc: error: no GPU here") and "--interpret" in err


@pytest.mark.gpu
def test_laneformer_2b_matches_eager_and_generates_in_one_launch():
    # one build of laneformer-2b for both checks: 256 steps against eager fp16 (and fp32), then 256 tokens
    # generated in one launch against the step loop's
    res = run_check(MODEL_FILE, "laneformer-2b", steps=256, generate=256, fp32_ref=True, quiet=True)
    assert res["passed"], res["failures"]
    assert res["max_rel_err"] < 1e-2 and res["memory_ratio"] < 1.05
    assert res["reference"] == res["reference_fp32"] == "CUDA graph"
    g = res["generation"]
    assert g["tokens"] == 256 and not g["argmax_misses"] and g["step_loop_same_tokens"]
    assert g["generate_tok_per_s"] >= g["step_loop_tok_per_s"]


@pytest.mark.gpu
def test_tiny_lanes_match_eager_fp32():
    for lanes in (1, 2, 4):
        res = run_check(MODEL_FILE, "tiny", steps=32, generate=16, overrides={"num_lanes": lanes}, quiet=True)
        assert res["passed"], (lanes, res["failures"])
        assert res["max_rel_err"] < 1e-4 and res["argmax_agreement"] == 1.0


def test_check_of_fp8_ranks_under_the_interpreter():
    # FP8 weights on 2 ranks: eager runs the same quantized weights, and the ranks are compared with a one-GPU
    # kernel that stores its weights as they do (FP8), not with the model's weights
    res = run_check(MICRO, "micro", steps=1, generate=1, prompt=[3], interpret=True, quiet=True, gpus=2,
                    weights="fp8", repeats=1, overrides={"num_lanes": 2})
    assert res["passed"], res["failures"]
    assert res["fake_quantized"] > 0 and res["max_rel_err"] < 1e-4
    assert list(res["seconds"]) == ["build", "compile", "memory check", "fp8 against model weights", "eager models",
                                    "steps", "generation", "ranks against one GPU"]
    assert res["single_gpu"]["max_rel_err"] < 1e-5 and not res["single_gpu"]["argmax_misses"]


@pytest.mark.gpu
def test_replayed_reference_equals_eager_and_falls_back_where_capture_fails():
    # the check's references replay one CUDA graph: bit-equal to eager step by step on fresh random weights; a step
    # that reads a value on the host cannot be captured and stays eager, saying why
    from conftest import tiny

    from kogc.bench.replayed import ReplayedStep
    from kogc.check import _reset
    model = tiny(seed=11, num_lanes=2, dtype=torch.float16).cuda()
    replayed, fresh = ReplayedStep(model, "cuda", _reset), tiny(seed=11, num_lanes=2, dtype=torch.float16).cuda()
    assert replayed.how == "CUDA graph"
    tok = 5
    with torch.no_grad():
        for pos in range(12):
            logits, got = replayed(tok, pos)
            want, want_tok = fresh(torch.tensor(tok, device="cuda"), torch.tensor(pos, device="cuda"))
            assert torch.equal(logits, want) and int(got) == int(want_tok), pos
            tok = (int(got) + pos) % 7

    class HostRead(torch.nn.Module):
        def forward(self, token, pos):
            logits = torch.arange(8.0, device=token.device) * float(pos.item() + 1)
            return logits, torch.argmax(logits)
    fallback = ReplayedStep(HostRead(), "cuda", lambda m: None)
    assert fallback.how.startswith("eager (capture failed: ")
    assert float(fallback(0, 2)[0][1]) == 3.0

    class Counting(torch.nn.Module):           # Python state a capture would freeze: eager's second step differs
        calls = 0

        def forward(self, token, pos):
            self.calls += 1
            logits = torch.arange(8.0, device=token.device) * self.calls + pos
            return logits, torch.argmax(logits)
    frozen = ReplayedStep(Counting(), "cuda", lambda m: None)
    assert frozen.how == "eager (the graph's first two steps differed from eager's)"
