"""Sliding-window attention: a layer whose mask keeps the last W positions (Mistral's, Gemma 3's local layers)
attends max(0, pos - W + 1)..pos in the IR, the kernel, the bench's floor and its hand-written baseline, over a
cache of every position (longer than the window)."""
import pytest
import torch
from conftest import rel_err
from test_gemma import gemma3
from test_ordinary import OneLayer, assert_equals_eager, hf_model

import kogc
from kogc.frontend import FrontendError, to_ir
from kogc.frontend.probe import window_of

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


def mask_of(first):
    """allowed_at(p) for a mask over 64 positions whose row at p attends first(p)..p."""
    return lambda p: ((torch.arange(64) >= first(p)) & (torch.arange(64) <= p))[None, :].expand(4, 64)


@pytest.mark.parametrize("first,want", [
    (lambda p: 0, 0),                               # causal
    (lambda p: max(0, p - 7), 8),                   # a window of 8
    (lambda p: max(0, p - 63), 0),                  # a window as long as the cache never bites
    (lambda p: max(0, p - 40), 41),                 # one the probes see only past the middle
    (lambda p: max(0, p - 7) if p != 9 else 0, None),   # off at one position next to the window's edge
    (lambda p: max(0, p // 2), None),               # a window that grows with the position
], ids=["causal", "window", "never-bites", "long", "edge-off", "growing"])
def test_window_of_a_mask(first, want):
    assert window_of(mask_of(first), 64) == want


def test_a_mask_with_a_gap_is_no_window():
    def allowed(p):
        a = (torch.arange(64) <= p) & (torch.arange(64) > p - 8)
        a[0] = True             # position 0 always (attention sinks): not one run
        return a[None, :]
    assert window_of(allowed, 64) is None


@pytest.mark.parametrize("mask,window", [("window", 3), ("causal", 0)])
def test_a_windowed_mask_gives_attention_its_window(monkeypatch, mask, window):
    # (the layer's later ops are refused on purpose: what matters is what its attention was lowered with)
    from kogc.frontend.aten_attention import AttentionLowering
    seen, lower = [], AttentionLowering.attention
    monkeypatch.setattr(AttentionLowering, "attention", lambda self, q, k, v, w: seen.append(w) or lower(self, q, k, v, w))
    with pytest.raises(FrontendError, match="aten.slice.Tensor on an activation"):
        to_ir(OneLayer(mask=mask))          # positions pos-2..pos over a cache of 8, or 0..pos
    assert seen == [window]


@pytest.mark.parametrize("make,windows", [
    (lambda: gemma3(sliding_window=4), [4, 0]),                       # a local layer, then a global one
    (lambda: hf_model("MistralForCausalLM", sliding_window=5), [5, 5]),
    (lambda: hf_model("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=4, max_window_layers=1), [0, 4]),
    (lambda: hf_model("Phi3ForCausalLM", sliding_window=3, pad_token_id=0), [3, 3]),      # (Phi-3-mini's: 2047)
], ids=["gemma3", "mistral", "qwen2", "phi3"])
def test_sliding_windows_equal_eager(make, windows):
    # a cache of 64 positions, every layer's full; 10 steps past windows of 4 and 5 (the IR at each, the
    # kernel at steps 0 and 9); and the eager step equal to the model's own forward over the whole sequence
    model = make()
    ck = assert_equals_eager(model, kernel_at=(0, 9), steps=10)
    assert ck.max_pos == 64 and [n.attrs.get("window", 0) for n in ck.ir.nodes if n.op.value == "attention"] == windows
    step, ids = kogc.frontend.decode_step(model), [7, 42, 99, 3, 5, 8, 13, 21]
    with torch.no_grad():
        for pos, t in enumerate(ids):
            got, _ = step(torch.tensor(t), torch.tensor(pos))
        want = model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("window", [0, 4, 5, 16, 64])
def test_hand_written_step_attends_the_window(window):
    from kogc.bench.handwritten import attended_rows
    first, mask = attended_rows(40, window, 40 + 256, "cpu", torch.float16)
    rows = first + torch.nonzero(mask == 0).flatten()
    assert first % 16 == 0 and mask.is_contiguous() and len(mask) == 40 + 256 - first
    assert rows.tolist() == list(range(max(0, 41 - window) if window else 0, 41))


def test_floor_and_hand_written_step_read_the_window():
    from kogc.bench.handwritten import shapes_of, step_fn
    from kogc.bench.measure import bytes_per_token
    ck = kogc.compile(kogc.frontend.decode_step(gemma3(sliding_window=4)))
    shapes = shapes_of(ck.schedule)
    assert shapes.windows == (4, 0)
    kv_row = 2 * 16 * 4         # K and V of one position: one KV head of 16, fp32
    assert bytes_per_token(ck, 40) - bytes_per_token(ck, 30) == 10 * kv_row      # the global layer's rows alone
    assert bytes_per_token(ck, 3) - bytes_per_token(ck, 2) == 2 * kv_row
    step, _ = step_fn(shapes, 40, "cpu", dtype=torch.float32)
    assert torch.isfinite(step()).all()
