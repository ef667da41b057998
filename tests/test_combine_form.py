"""TileConfig.combine_1d (a candidate form of the attention splits' combine, one split at a time over 1-D
vectors): equal to eager in the output projection's prologue and where the last split combines (the default
form is every other test's)."""
import dataclasses

import pytest
import torch

import kogc
from conftest import tiny
from kogc.api import INTERPRETER_TILES
from test_ranks import _eager_steps


@pytest.mark.parametrize("combine_width", [512, 8], ids=["wo-combines", "last-split-combines"])
def test_the_1d_combine_equals_eager(combine_width):
    model = tiny(seed=3, num_hidden_layers=2)
    cfg = dataclasses.replace(INTERPRETER_TILES, attn_splits=4, attn_block=16, combine_1d=1,
                              attn_combine_width=combine_width)
    ck = kogc.compile(model, tile_config=cfg)
    tokens = torch.randint(0, model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    for pos, (tok, (want, _)) in enumerate(zip(tokens, _eager_steps(model, tokens))):
        logits, _ = ck.step(tok, pos)
        assert torch.allclose(logits, want, atol=1e-5, rtol=1e-5), (pos, float((logits - want).abs().max()))
