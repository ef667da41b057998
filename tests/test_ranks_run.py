"""Delayed tensor parallelism under Triton's interpreter, part 2: eight ranks (one lane each) against
eager and the IR reference, and generation (a second file: the suite spreads files over workers)."""
import pytest

import kogc
from conftest import tiny
from kogc.errors import KogcError
from test_ranks import ONE_SPLIT, check_steps


def test_eight_ranks_equal_eager_and_ir_reference():
    """One lane per rank; with the two cases of test_ranks: G 2, 4, 8; d 1, 2; the first layers'
    immediate sum on and off; shared and per-lane norm scales."""
    check_steps(8, dict(broadcast_delay=1, use_early_comm=True, replicated_rmsn_scale=False, num_hidden_layers=2))


def test_ranked_generation_gives_the_one_gpu_tokens():
    """Temperature sampling over 2 ranks gives the one-GPU kernel's tokens (the noise is keyed by seed,
    step and token id, whichever rank holds that id; greedy tokens: the step tests); top-k is refused."""
    model = tiny(seed=3, vocab_size=250, num_hidden_layers=2)       # 125 ids per rank
    single, ranked = kogc.compile(model, tile_config=ONE_SPLIT), kogc.compile(model, gpus=2, tile_config=ONE_SPLIT)
    prompt = [5]
    kw = dict(temperature=1.5, seed=1234)
    assert ranked.generate(prompt, 2, **kw) == single.generate(prompt, 2, **kw)
    with pytest.raises(KogcError, match="top_k / top_p"):
        ranked.generate(prompt, 2, temperature=1.0, top_k=5)
