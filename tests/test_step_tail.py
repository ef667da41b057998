"""The step's tail: the LM head folds each task's (max, row) into token keys by atomic max, and the
argmax task reads them; ties must go to the lowest row, like torch.argmax."""
import dataclasses

import pytest
import torch
from conftest import tiny

import kogc
from kogc.settings import INTERPRETER_TILES

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


def test_token_key_breaks_ties_to_the_lowest_row():
    # two rows of the LM head equal and the largest logit, in different tasks: like torch.argmax, the
    # lower row wins (the key's low bits; an atomic max does not depend on which task comes first)
    model = tiny(seed=23, num_lanes=2)
    tiles = dataclasses.replace(INTERPRETER_TILES, tile_bytes=4096)   # 16 rows a task
    ck = kogc.compile(model, tile_config=tiles)
    _, top = ck.step(4, 0)
    rows = next(t.weight.rows for t in ck.schedule.tasks if t.variant[:1] == ("matvec",) and t.variant[4] == "store_argmax")
    twin = top + rows if top + rows < model.config.vocab_size else top - rows      # a row of another task
    with torch.no_grad():
        model.lm_head.weight[twin] = model.lm_head.weight[top]
    ck = kogc.compile(model, tile_config=tiles)
    logits, tok = ck.step(4, 0)
    assert logits[top] == logits[twin] == logits.max()
    assert tok == min(top, twin) == int(torch.argmax(logits))
