"""Does a kernel's history change its chain? Per form of the last split's combine: a chain of 16 launches on a
fresh kernel (A); then the sweep's history (one step at 1024, 6 x 50 launches at 1025..1074), the cache reset,
the same chain (B); then B again (C).

Ran on the H200 on 2026-12-02 in a checkout of 067d842 (where the two forms were TileConfig.combine_call):
    PYTHONPATH=. python combine-call-chains-after-history.py     (output: combine-call-chains-after-history.log)
"""
import torch
from kogc.frontend.model_file import build_model
from kogc.api import compile as kc
from kogc.scheduler import TileConfig
from kogc.runtime.kernel import fill_kv_from
from kogc.bench.sweep import TOKEN

model = build_model("examples/llama.py", preset="llama-3.2-1b", seed=0, max_len=2048)
caches = [(n, b) for n, b in model.named_buffers() if n.endswith("cache")]
gen = torch.Generator().manual_seed(1)
fills = [torch.randn(b[:, :, :1024].shape, generator=gen).to(b.dtype) for _, b in caches]


def set_cache(ck):
    for (n, b), v in zip(caches, fills):
        b.zero_()
        b[:, :, :1024].copy_(v)
    fill_kv_from(ck, model)


def chain(ck):
    set_cache(ck)
    for i in range(16):
        ck.launch(1 + i, 1025 + i)
    return ck.logits_view.float().cpu().clone()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


out = {}
for name, cfg in [("inline", TileConfig()), ("call", TileConfig(combine_call=True))]:
    ck = kc(model, tile_config=cfg)
    A = chain(ck)
    set_cache(ck)
    ck.step(TOKEN, 1024)
    for r in range(6):
        for i in range(50):
            ck.launch(1 + i % 50, 1025 + i)
    torch.cuda.synchronize()
    B = chain(ck)
    C = chain(ck)
    out[name] = (A, B, C)
    print(name, "A vs B", rel(B, A), "B vs C", rel(C, B), flush=True)
    del ck
    torch.cuda.empty_cache()
for k in range(3):
    print("call vs inline", "ABC"[k], rel(out["call"][k], out["inline"][k]))
