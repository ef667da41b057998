"""Sampling on the device's code path: the empirical distribution of many draws on fixed logits
matches the intended one (chi-square at a fixed significance, fixed seed); generation with a seed
is reproducible; top-k / top-p never emit a token outside the allowed set."""
import math

import pytest
import torch
from conftest import compiled_tiny

from kogc.codegen.sampler import filter_threshold, sample_tokens

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path")

LOGITS = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0, 0.0, 1.5, 2.5])


def intended(logits, temperature, top_k=0, top_p=1.0):
    """softmax(logits / T), restricted to the top_k largest, then to the smallest top-p nucleus."""
    x = logits.double() / temperature
    keep = torch.ones_like(x, dtype=torch.bool)
    if top_k:
        keep &= x >= torch.topk(x, top_k).values[-1]
    p = torch.where(keep, torch.softmax(x.masked_fill(~keep, -math.inf), 0), 0.0)
    if top_p < 1.0:
        order = torch.argsort(p, descending=True)
        cum = torch.cumsum(p[order], 0)
        n = int((cum < top_p - 1e-12).sum()) + 1
        nucleus = torch.zeros_like(keep)
        nucleus[order[:n]] = True
        p = torch.where(nucleus, p, 0.0)
        p = p / p.sum()
    return p


def chi_square_ok(tokens, probs, z=3.09):
    """Pearson's chi-square against `probs` below the 0.1% critical value (Wilson-Hilferty)."""
    counts = torch.bincount(tokens.long(), minlength=len(probs)).double()
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "a token outside the allowed set was drawn"
    live = probs > 0
    expected = probs[live] * n
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3 if df > 0 else 0.0
    return stat <= crit, stat, crit


@pytest.mark.parametrize("kwargs,draws", [(dict(temperature=0.7), 400),        # (interpreter draws cost
                                          (dict(temperature=0.7, top_k=3), 80),  # ~0.05 s, ~0.06 s with a
                                          (dict(temperature=1.3, top_p=0.6), 60),    # filter; the filtered
                                          (dict(temperature=0.7, top_k=3, top_p=0.7), 80)])
# sets are 3 tokens, >= 11 expected draws each; top-k's probabilities 0.58 / 0.28 / 0.14 tell a draw that
# ignores them: uniform draws would give a chi-square near 31 against 13.8; top-p 0.7 of them keeps two,
# 0.67 / 0.33)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])      # (fp16: drawn off counts per key)
def test_empirical_distribution_matches(kwargs, draws, dtype):
    tokens = sample_tokens(LOGITS.to(dtype), draws, seed=12345, **kwargs)
    ok, stat, crit = chi_square_ok(tokens, intended(LOGITS, **kwargs))
    assert ok, f"chi-square {stat:.1f} > {crit:.1f} for {kwargs}"


def test_logits_of_one_key_are_drawn_alike():
    """16-bit logits with one value are one key, of one probability: the draw picks a key, then one of its
    logits by the largest random number the counting folded per key, uniformly (not the first of them)."""
    logits = torch.tensor([2.0, 0.0, 2.0, 1.0, 2.0, -1.0, 2.0, 0.5], dtype=torch.float16)
    tokens = sample_tokens(logits, 48, seed=3, temperature=1.0, top_k=4)       # the four 2.0s, 12 draws each
    ok, stat, crit = chi_square_ok(tokens, intended(logits.float(), 1.0, top_k=4))
    assert ok, f"chi-square {stat:.1f} > {crit:.1f}: {torch.bincount(tokens.long(), minlength=8).tolist()}"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_filter_thresholds_are_the_exact_ones(seed, dtype):
    """The searches over the logits' order (counted in buckets, masses at three keys a pass, then per key)
    find top-k's k-th largest logit exactly (ties kept), and top-p's threshold meets its definition: the
    logits at or above it reach top_p of the mass (of what top-k kept), those above it do not. Logits of both
    signs, with ties, over several blocks, stored as fp16 or bf16 (counted per 16-bit key) and fp32
    (searched over 32-bit keys)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.bfloat16 if dtype == torch.bfloat16 else torch.float16        # 16-bit values: ties
    stored = (torch.randn(3000, generator=g) * 3).to(values).to(dtype)
    x = stored.float()
    for k in (1, 37, 2999):
        assert filter_threshold(stored, 1.0, k) == float(torch.topk(x, k).values[-1])
    for t, k, p in ((1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 200, 0.8)):
        thr = filter_threshold(stored, t, k, p)
        kept = x >= (torch.topk(x, k).values[-1] if k else x.min())
        w = torch.where(kept, torch.exp((x.double() - x.max()) / t), 0.0)
        need = p * w.sum()
        assert thr in x.tolist()
        assert w[x >= thr].sum() >= need * (1 - 1e-5) and w[x > thr].sum() < need * (1 + 1e-5), (t, k, p)


def test_greedy_ties_go_to_the_lowest_id():
    logits = torch.tensor([0.0, 2.0, 1.0, 2.0])
    assert sample_tokens(logits, 3, temperature=0.0).tolist() == [1, 1, 1]


@pytest.fixture(scope="module")
def setup():
    return compiled_tiny(seed=9)


def test_same_seed_same_tokens_other_seed_others(setup):
    _, ck = setup
    a = ck.generate([5], 2, temperature=5.0, seed=7)
    b = ck.generate([5], 2, temperature=5.0, seed=7)
    c = ck.generate([5], 2, temperature=5.0, seed=8)
    assert a == b and a != c


@pytest.mark.parametrize("kwargs", [dict(top_k=4), dict(top_p=0.3)])
def test_filters_keep_tokens_in_the_allowed_set(setup, kwargs):
    model, ck = setup
    prompt = [11, 12, 13]
    model.reset_cache()
    for pos, t in enumerate(prompt):
        logits, _ = model(torch.tensor(t), torch.tensor(pos))
    allowed = intended(logits.float(), 1.0, kwargs.get("top_k", 0), kwargs.get("top_p", 1.0)) > 0
    for seed in (3,):
        tok = ck.generate(prompt, 1, temperature=1.0, seed=seed, **kwargs)[0]
        assert allowed[tok], f"{kwargs}: token {tok} outside {allowed.nonzero().flatten().tolist()}"


def test_16_bit_logits_draw_from_the_allowed_set():
    """An fp16 model's kernel finds its thresholds from counts per 16-bit key (the histogram the argmax task
    keeps in the f32 arena, cleared after each draw): several filtered steps, each token in the allowed
    set of the eager model's logits at its position."""
    import kogc
    from conftest import tiny
    from kogc.scheduler.tasks import A_COUNTS, A_HIST, HIST_WORDS
    model = tiny(seed=4, vocab_size=250, num_hidden_layers=2, num_lanes=2, dtype=torch.float16)
    ck = kogc.compile(model)
    prompt = [11, 12]
    hist = next(t.args[A_HIST] for t in ck.schedule.tasks if t.kind == "argmax")
    # the LM head's tasks count into it as they store their logits (the kernel renders their counting)
    assert {t.args[A_COUNTS] for t in ck.schedule.tasks if t.kind == "matvec" and t.variant[4] == "store_argmax"} == {hist}
    assert "_count_keys(" in ck.source
    assert ck.generate(prompt, 1, temperature=50.0, seed=1, top_k=1) == ck.generate(prompt, 1)   # exact top-1
    for kwargs in (dict(top_k=4, top_p=0.9), dict(top_p=0.3)):
        toks = ck.generate(prompt, 2, temperature=1.0, seed=5, **kwargs)
        model.reset_cache()
        for pos, t in enumerate(prompt + toks[:-1]):
            logits, _ = model(torch.tensor(t), torch.tensor(pos))
            if pos >= len(prompt) - 1:
                tok = toks[pos - len(prompt) + 1]
                allowed = intended(logits.float(), 1.0, kwargs.get("top_k", 0), kwargs.get("top_p", 1.0)) > 0
                assert allowed[tok], f"{kwargs}: token {tok} at {pos + 1} outside {allowed.nonzero().tolist()}"
        assert not ck.buffers.F32[hist:hist + 2 * HIST_WORDS].any(), "counts or key ranges left for the next launch"
    # each draw leaves its counts to the next one, which clears them before its wait; a draw that stops the
    # launch at an EOS id clears its own
    kw = dict(temperature=1.0, seed=5, top_p=0.3)
    first = ck.generate(prompt, 1, **kw)
    assert ck.generate(prompt, 3, eos_token_id=first[0], **kw) == first
    assert not ck.buffers.F32[hist:hist + 2 * HIST_WORDS].any(), "a launch stopped at EOS left counts"
    # two programs: the LM head's tasks come in runs (_matvec_run), which count the same
    runs = kogc.compile(model, num_programs=2)
    assert any(v[4] == "store_argmax" for v in runs.schedule.run_variants)
    kw = dict(temperature=1.0, seed=5, top_k=4, top_p=0.9)
    assert runs.generate(prompt, 1, **kw) == ck.generate(prompt, 1, **kw)


def test_only_top_k_and_top_p_launches_need_the_filter_code(setup):
    _, ck = setup
    assert not ck.needs_filter(0.0, 4, 0.3)           # greedy: top-k / top-p do not apply
    assert not ck.needs_filter(1.0, 0, 1.0)           # plain temperature
    assert not ck.needs_filter(1.0, ck.vocab, 1.0)    # top-k of the whole vocabulary keeps everything
    assert ck.needs_filter(1.0, 4, 1.0) and ck.needs_filter(1.0, 0, 0.5)
    # as the kernel sees them (fp32): a top_p that rounds to 1, a temperature that rounds to 0
    assert not ck.needs_filter(1.0, 0, 1 - 1e-9) and not ck.needs_filter(1e-50, 4, 0.5)


def test_filtered_launches_run_the_kernel_with_the_filter(setup):
    """A launch that cannot need top-k / top-p runs a kernel compiled without that code; one that
    needs it must run the kernel with it: top-k=1 at a high temperature gives the greedy tokens (sent
    to the kernel without the filter it would draw from the whole distribution)."""
    _, ck = setup
    greedy = ck.generate([3, 4], 2)
    assert ck.generate([3, 4], 2, temperature=50.0, seed=1, top_k=1) == greedy
