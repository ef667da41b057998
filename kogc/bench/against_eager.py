"""The bench's correctness check: a kernel's logits for one step against eager PyTorch's, on the same
KV cache and the same weights (an FP8 kernel: the model with the same quantized weights), with
`kogc check`'s limit and tie-aware argmax (kogc.check)."""
from __future__ import annotations

import copy

import torch

from ..compare import TIE_ULPS, default_max_rel_err, rel_err, tie_dtype, token_miss
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
    with torch.no_grad():
        m.to(device)
        ref, ref_tok = m(torch.tensor(TOKEN, device=device), torch.tensor(context, device=device))
        ref = ref.float().cpu()
        m.to("cpu")
    if mirror_of:
        ref = ref[:vocab_shard(ref.shape[0], mirror_of, 0)[1]]
        ref_tok = ref.argmax()
    limit = default_max_rel_err(dtype)
    err = rel_err(logits.float().cpu(), ref)
    miss = token_miss(ref, tok, TIE_ULPS, tie_dtype(dtype))
    return {"position": context, "rel_err": err, "limit": limit, "token": tok, "eager_token": int(ref_tok),
            "argmax_miss": miss, "ok": err <= limit and miss is None}


def mirror_lane_groups(model: torch.nn.Module, gpus: int) -> None:
    """In place: every lane group's weights and KV cache made a copy of rank 0's, the model that rank 0 of
    `gpus` with its peers mirrored computes (kogc.runtime.ranks.copy_lane_groups)."""
    from ..frontend import to_ir
    from ..runtime.ranks import copy_lane_groups
    copy_lane_groups(to_ir(model), {**dict(model.named_parameters()), **dict(model.named_buffers())}, gpus)


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
    return (f"{name} against eager at position {c['position']}: rel err {c['rel_err']:.1e} (limit "
            f"{c['limit']:.0e}), {token}: {verdict}")
