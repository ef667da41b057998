"""The bench's correctness check: a kernel's logits for one step against eager PyTorch's, on the same
KV cache and the same weights (an FP8 kernel: the model with the same quantized weights), with
`kogc check`'s limit and tie-aware argmax (kogc.check).

Where a 16-bit model's step misses that limit, an fp32 copy of the same weights and cache decides, as
`kogc check --fp32-ref` does: the step passes if kogc is no farther from it than eager is and picks its
token (tie-aware). Some models' own 16-bit arithmetic is the noisier side at long contexts (BLOOM's
fp16 scores on an ALiBi bias of hundreds: eager fp16 1e-2 from fp32 at position 1024)."""
from __future__ import annotations

import copy

import torch

from ..compare import TIE_ULPS, default_max_rel_err, no_farther_than_eager, rel_err, tie_dtype, token_miss
from ..runtime.kernel import stored_schedule
from ..ir.shard import vocab_shard

TOKEN = 7       # the token of the checked step


def check_step(ck, model: torch.nn.Module, context: int, device: str, mirror_of: int = 0) -> dict:
    """Run one step of `ck` (token TOKEN at position `context`, its cache filled from `model`'s) and the
    same step eagerly. Both write the cache row at `context` only, which every later step rewrites.
    mirror_of=G: `ck` is rank 0 of G with its peers mirrored (kogc.runtime.ranks.mirror_rank), `model` the one
    it computes (mirror_lane_groups): compared on rank 0's vocabulary shard."""
    logits, tok = ck.step(TOKEN, context)
    m = reference_module(model, stored_weights(ck), ck.ir)
    dtype = next(model.parameters()).dtype
    ref, ref_tok = _eager_step(m, context, device, mirror_of)
    limit = default_max_rel_err(dtype)
    logits = logits.float().cpu()
    err = rel_err(logits, ref)
    miss = token_miss(ref, tok, TIE_ULPS, tie_dtype(dtype))
    out = {"position": context, "rel_err": err, "limit": limit, "token": tok, "eager_token": int(ref_tok),
           "argmax_miss": miss, "ok": err <= limit and miss is None}
    if not out["ok"] and fp32_decides(dtype):
        out["fp32"] = fp32_verdict(m, context, device, mirror_of, logits, tok, ref, dtype)
        out["ok"] = out["fp32"]["ok"]
    return out


def _eager_step(m: torch.nn.Module, context: int, device: str, mirror_of: int) -> tuple[torch.Tensor, int]:
    """Eager's logits (fp32, on the CPU; rank 0's shard where mirrored) and token for TOKEN at `context`."""
    with torch.no_grad():
        m.to(device)
        ref, ref_tok = m(torch.tensor(TOKEN, device=device), torch.tensor(context, device=device))
        ref = ref.float().cpu()
        m.to("cpu")
    if mirror_of:
        ref = ref[:vocab_shard(ref.shape[0], mirror_of, 0)[1]]
        ref_tok = ref.argmax()
    return ref, int(ref_tok)


def fp32_decides(dtype: torch.dtype) -> bool:
    """Whether an fp32 copy decides a step of a model of `dtype` that misses the limit: 16-bit models only."""
    return dtype in (torch.float16, torch.bfloat16)


def fp32_verdict(m: torch.nn.Module, context: int, device: str, mirror_of: int, logits: torch.Tensor, tok: int,
                 eager: torch.Tensor, dtype: torch.dtype) -> dict:
    """The same step by an fp32 copy of `m` (weights and cache upcast): kogc's and eager's relative errors
    against it, and whether kogc is no farther (kogc.compare.no_farther_than_eager) with its token."""
    m32 = copy.deepcopy(m).float()
    ref32, _ = _eager_step(m32, context, device, mirror_of)
    del m32
    k, e = rel_err(logits, ref32), rel_err(eager, ref32)
    miss = token_miss(ref32, tok, TIE_ULPS, tie_dtype(dtype))
    return {"kogc_rel_err": k, "eager_rel_err": e, "argmax_miss": miss,
            "ok": no_farther_than_eager(k, e) and miss is None}


def mirror_lane_groups(model: torch.nn.Module, gpus: int) -> None:
    """In place: every lane group's weights and KV cache made a copy of rank 0's, the model that rank 0 of
    `gpus` with its peers mirrored computes (kogc.runtime.ranks.copy_lane_groups)."""
    from ..frontend import to_ir
    from ..runtime.ranks import copy_lane_groups
    copy_lane_groups(to_ir(model, gpus=gpus), {**dict(model.named_parameters()), **dict(model.named_buffers())},
                     gpus)


def stored_weights(ck) -> str:
    """What a compiled kernel streams ("model" or "fp8")."""
    return stored_schedule(ck).tile_config.weights


def reference_module(model: torch.nn.Module, weights: str, graph) -> torch.nn.Module:
    """The module whose eager step a kernel storing `weights` must match: the model itself, or for FP8 a
    copy with the same quantized weights (kogc.fp8.fake_quantize_module)."""
    if weights != "fp8":
        return model
    from ..fp8 import fake_quantize_module
    m = copy.deepcopy(model)
    fake_quantize_module(m, graph)
    return m


def token_words(c: dict) -> str:
    """Whether a check's token is eager's, in a few words."""
    return ("the same token" if c["token"] == c["eager_token"] else
            "another token within a tie" if c["argmax_miss"] is None else
            f"ANOTHER TOKEN ({c['token']} against {c['eager_token']})")


def format_check(name: str, c: dict) -> str:
    """One line of the bench's table."""
    token = token_words(c)
    verdict = "ok" if c["ok"] else "FAILED"
    f = c.get("fp32")
    fp32 = ("" if f is None else f"; against an fp32 copy kogc {f['kogc_rel_err']:.1e}, eager "
            f"{f['eager_rel_err']:.1e}" + ("" if f["argmax_miss"] is None else ", not its token"))
    return (f"{name} against eager at position {c['position']}: rel err {c['rel_err']:.1e} (limit "
            f"{c['limit']:.0e}), {token}{fp32}: {verdict}")
