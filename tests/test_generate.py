"""Generation in one launch (Triton interpreter on CPU): greedy tokens equal an eager greedy loop,
EOS stops at the right place, bad input is refused before anything launches."""
import copy

import pytest
import torch
from conftest import compiled_tiny

from kogc.errors import KogcError
from kogc.scheduler import SchedulerError
from kogc.scheduler.check import check_step_closure

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path")


def eager_greedy(model, prompt, n):
    model.reset_cache()
    for pos, t in enumerate(prompt):
        _, tok = model(torch.tensor(t), torch.tensor(pos))
    out = []
    for i in range(n):
        out.append(int(tok))
        _, tok = model(torch.tensor(int(tok)), torch.tensor(len(prompt) + i))
    return out


@pytest.fixture(scope="module")
def setup():
    return compiled_tiny(seed=5)


def test_greedy_generate_equals_eager_loop(setup):
    # each step starts from the token the previous one chose, on the device; the LM head's token keys
    # are cleared between steps
    model, ck = setup
    prompt = [3, 141, 59]
    want = eager_greedy(model, prompt, 6)
    got = ck.generate(prompt, 6)
    assert got == want
    assert ck.buffers.OUT[1].item() == 6           # all 6 steps ran inside one launch


def test_tokens_arrive_while_the_interpreted_launch_runs(setup):
    # the interpreter runs a whole generation in one call (minutes for a real model): the launch runs in a
    # worker thread while the caller's thread hands on each token as the kernel records it
    import threading
    model, ck = setup
    prompt = [3, 141, 59, 2]
    seen, prefill = [], []

    def on_token(tok):
        running = any(t.name == "kogc-interpreted-launch" for t in threading.enumerate())
        seen.append((tok, running, threading.current_thread() is threading.main_thread()))

    got = ck.generate(prompt, 6, on_token=on_token, on_prefill=lambda done, total: prefill.append((done, total)))
    assert got == eager_greedy(model, prompt, 6) == [tok for tok, _, _ in seen]
    assert all(main for _, _, main in seen)
    assert seen[0][1], "the first token was handed on only after the launch ended"
    assert prefill == [(1, 3), (2, 3), (3, 3)]


def test_on_token_failing_stops_generate_after_the_launch(setup):
    _, ck = setup

    def on_token(tok):
        raise RuntimeError("the caller's own error")
    with pytest.raises(RuntimeError, match="the caller's own error"):
        ck.generate([1, 2], 3, on_token=on_token)
    assert ck.generate([1, 2], 2) == ck.generate([1, 2], 2)     # the kernel is usable after it


def test_eos_stops_within_the_step(setup):
    model, ck = setup
    prompt = [7, 7, 8]
    full = eager_greedy(model, prompt, 16)
    eos = full[5]
    stop = full.index(eos)
    got = ck.generate(prompt, 16, eos_token_id=eos)
    assert got == full[:stop + 1]
    # the counters' epochs follow the steps that really ran: stepping on works, nothing hangs
    epoch = ck.epoch
    logits, tok = ck.step(1, 0)
    assert ck.epoch == epoch + 1 and 0 <= tok < model.config.vocab_size


def test_any_of_several_eos_ids_stops(setup):
    # a list of stop ids (as a chat model's generation_config names them): the first step producing any;
    # a later generation with other ids runs its whole length (each launch passes its own ids)
    model, ck = setup
    prompt = [7, 7, 8]
    full = eager_greedy(model, prompt, 10)
    absent = next(t for t in range(model.config.vocab_size) if t not in full)
    first = min(full.index(full[7]), full.index(full[4]))
    assert ck.generate(prompt, 10, eos_token_id=[absent, full[7], full[4]]) == full[:first + 1]
    assert ck.generate(prompt, 10, eos_token_id=[absent]) == full


@pytest.mark.parametrize("kwargs,needle", [
    (dict(prompt_ids=[], max_new_tokens=4), "empty"),
    (dict(prompt_ids=[1, 999], max_new_tokens=4), "outside the vocabulary"),
    (dict(prompt_ids=[1, 2], max_new_tokens=10_000), "do not fit the KV cache"),
    (dict(prompt_ids=[1], max_new_tokens=4, top_p=0.0), "top_p"),
    (dict(prompt_ids=[1], max_new_tokens=4, top_p=1.5), "top_p"),
    (dict(prompt_ids=[1], max_new_tokens=4, temperature=-1.0), "temperature"),
    (dict(prompt_ids=[1], max_new_tokens=4, temperature=1e-40), "fp32's smallest normal"),
    (dict(prompt_ids=[1], max_new_tokens=0), "max_new_tokens"),
    (dict(prompt_ids=[1], max_new_tokens=4, eos_token_id=-3), "eos_token_id"),
    (dict(prompt_ids=[1.5, 2], max_new_tokens=4), "a prompt id must be an integer, got 1.5"),
    (dict(prompt_ids="hello", max_new_tokens=4), "must be token ids, got text"),
    (dict(prompt_ids=[1], max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (dict(prompt_ids=[1], max_new_tokens=4, temperature="hot"), "temperature must be a number"),
    (dict(prompt_ids=[1], max_new_tokens=4, temperature=1.0, top_k=2.5), "top_k must be an integer"),
    (dict(prompt_ids=[1], max_new_tokens=4, eos_token_id=list(range(5))), "the kernel stops at up to 4"),
    (dict(prompt_ids=[1], max_new_tokens=4, eos_token_id=[3, 999]), "eos_token_id 999 is outside the vocabulary"),
    (dict(prompt_ids=[1], max_new_tokens=4, eos_token_id=[3.5]), "an integer or a list of integers"),
    (dict(prompt_ids=[1], max_new_tokens=4, temperature=1.0, seed=1.5), "seed must be an integer"),
])
def test_bad_input_is_refused_before_launch(setup, kwargs, needle):
    _, ck = setup
    epoch = ck.epoch
    with pytest.raises(KogcError, match=needle):
        ck.generate(**kwargs)
    assert ck.epoch == epoch


def test_step_closure_names_a_task_that_does_not_feed_the_token(setup):
    _, ck = setup
    check_step_closure(ck.schedule)
    broken = copy.copy(ck.schedule)
    broken.tasks = copy.deepcopy(ck.schedule.tasks)
    victim = next(t for t in broken.tasks if t.kind == "embed")
    for t in broken.tasks:
        t.deps = [d for d in t.deps if d != victim.id]
    with pytest.raises(SchedulerError, match=f"task {victim.id} .*does not feed the sampled token"):
        check_step_closure(broken)


def test_kogc_run_prints_tokens_and_rate(tmp_path, capsys):
    import os

    from conftest import ROOT
    micro = os.path.join(ROOT, "tests", "micro_laneformer.py")      # one lane, one layer: fast steps
    from kogc.cli import main
    assert main(["run", micro, "--config", "micro", "--prompt-ids", "4,5", "--max-new-tokens", "3", "--interpret"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines[0].split()) == 3 and all(t.isdigit() for t in lines[0].split())
    assert "3 tokens" in lines[1] and "tok/s" in lines[1]
    assert main(["run", micro, "--config", "micro", "--prompt-ids", "4,9999", "--interpret"]) == 2
    err = capsys.readouterr().err
    assert "outside the vocabulary" in err and "Traceback" not in err


def test_kogc_run_refuses_sampling_settings_before_building(capsys):
    """A setting no model could take is refused before the model is built, compiled or a GPU is asked for:
    the preset named here would take minutes to build and compile on this machine, and it has no GPU."""
    from kogc.cli import main
    for argv, message in ((["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
                          (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
                          (["--seed", "-3"], "seed must be in [0, 2**31)"),
                          (["--temperature", "1e-40"], "temperature must be 0 (greedy) or at least")):
        assert main(["run", "--config", "laneformer-7b", "--prompt-ids", "1,2", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "built" not in err and "no GPU" not in err, err
