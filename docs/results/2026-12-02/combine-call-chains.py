"""Is the chained difference between two forms of the last split's combine a race or rounding?
Each form: 16 launches from the same cache, logits after each (synced), 3 times; and 16 launches back to
back (no sync), final logits, 3 times. Prints self-differences and the cross difference per step.

Ran on the H200 on 2026-12-02 in a checkout of 067d842 (where the two forms were TileConfig.combine_call):
    PYTHONPATH=. python combine-call-chains.py llama-3.2-1b     (output: combine-call-chains-qwen3-gpu-tests.log)
"""
import sys
import torch
from kogc.frontend.model_file import build_model
from kogc.api import compile as kc
from kogc.scheduler import TileConfig
from kogc.runtime.kernel import fill_kv_from

preset = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
model = build_model("examples/llama.py", preset=preset, seed=0, max_len=2048)
caches = [(n, b) for n, b in model.named_buffers() if n.endswith("cache")]
gen = torch.Generator().manual_seed(1)
fills = [torch.randn(b[:, :, :1024].shape, generator=gen).to(b.dtype) for _, b in caches]


def set_cache():
    for (n, b), v in zip(caches, fills):
        b.zero_()
        b[:, :, :1024].copy_(v)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


res = {}
for name, cfg in [("inline", TileConfig()), ("call", TileConfig(combine_call=True))]:
    ck = kc(model, tile_config=cfg)
    synced, b2b = [], []
    for rep in range(3):
        set_cache(); fill_kv_from(ck, model)
        outs = []
        for i in range(16):
            ck.launch(1 + i, 1025 + i)
            outs.append(ck.logits_view.float().cpu().clone())
        synced.append(outs)
        set_cache(); fill_kv_from(ck, model)
        for i in range(16):
            ck.launch(1 + i, 1025 + i)
        b2b.append(ck.logits_view.float().cpu().clone())
    res[name] = (synced, b2b)
    print(name, "self, synced, max rel per step over reps:",
          [max(rel(synced[r][i], synced[0][i]) for r in (1, 2)) for i in range(16)], flush=True)
    print(name, "self, back to back:", [rel(b2b[r], b2b[0]) for r in (1, 2)],
          "b2b vs synced:", rel(b2b[0], synced[0][15]), flush=True)
    del ck
    torch.cuda.empty_cache()
print("call vs inline, synced, per step:", [rel(res["call"][0][0][i], res["inline"][0][0][i]) for i in range(16)])
print("call vs inline, tokens equal per step:",
      [int(res["call"][0][0][i].argmax() == res["inline"][0][0][i].argmax()) for i in range(16)])
