"""What a generation request may ask, checked before anything is built or launched: the kinds of generate's
arguments and the ranges that do not depend on the model (the model's vocabulary and KV cache are
CompiledKernel.check_generate's). No Triton here: `kogc run` asks before it sets up the interpreter."""
from __future__ import annotations

import numbers

import torch

from .errors import KogcError
from .scheduler.tasks import MAX_STOP

FP32_TINY = torch.finfo(torch.float32).tiny     # the smallest positive temperature a launch takes


def as_index(x, what: str) -> int:
    """An integer token or position: a Python or NumPy integer, or a one-element integer tensor; anything else
    (a float, a bool) is refused by name rather than truncated."""
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not (x.dtype.is_floating_point or x.dtype == torch.bool):
        return int(x.item())
    if _is_int(x):
        return int(x)
    raise KogcError(f"{what} must be an integer, got {x!r}")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def stop_ids(eos_token_id) -> tuple[int, ...]:
    """generate's eos_token_id (None, one id, or several, as transformers' generate takes it) as a tuple."""
    if eos_token_id is None:
        return ()
    return (eos_token_id,) if _is_int(eos_token_id) else tuple(eos_token_id)


def prompt_ids_of(prompt_ids) -> list[int]:
    """The prompt as a list of ints (each as_index); text or floats are refused by name."""
    if isinstance(prompt_ids, str):
        raise KogcError(f"the prompt must be token ids, got text {prompt_ids[:40]!r} (kogc run --prompt tokenizes "
                        f"text for a transformers model)")
    return [as_index(t, "a prompt id") for t in prompt_ids]


def _check_types(prompt, **args) -> None:
    """generate's arguments of the right kinds: integers (max_new_tokens; top_k, seed or None), an integer or
    a list of up to MAX_STOP (eos_token_id, or None), and real numbers (temperature; top_p or None); a
    KogcError names the first that is not."""
    prompt_ids_of(prompt)
    for name in ("max_new_tokens", "top_k", "seed"):
        x = args[name]
        if (x is not None or name == "max_new_tokens") and not _is_int(x):
            raise KogcError(f"{name} must be an integer, got {x!r}")
    eos = args["eos_token_id"]
    if not (eos is None or _is_int(eos) or (isinstance(eos, (list, tuple)) and all(_is_int(t) for t in eos))):
        raise KogcError(f"eos_token_id must be an integer or a list of integers, got {eos!r}")
    if len(stop_ids(eos)) > MAX_STOP:
        raise KogcError(f"eos_token_id names {len(eos)} tokens: the kernel stops at up to {MAX_STOP}")
    for name in ("temperature", "top_p"):
        x = args[name]
        if (x is not None or name == "temperature") and not (isinstance(x, numbers.Real) and not isinstance(x, bool)):
            raise KogcError(f"{name} must be a number, got {x!r}")


def check_request(prompt, max_new_tokens, temperature, top_k, top_p, seed, eos) -> None:
    """What `generate` refuses whatever the model (KogcError naming it): `kogc run` asks this before it builds
    and compiles a model, CompiledKernel.check_generate adds the model's vocabulary and KV cache."""
    _check_types(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                 seed=seed, eos_token_id=eos)
    if not prompt:
        raise KogcError("the prompt is empty: give at least one token id")
    if max_new_tokens < 1:
        raise KogcError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise KogcError(f"temperature must be >= 0, got {temperature}")
    if 0 < temperature < FP32_TINY:      # the kernel divides by it in fp32, which flushes it to 0 or inf
        raise KogcError(f"temperature must be 0 (greedy) or at least {FP32_TINY:.3g}, fp32's smallest normal "
                        f"number, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise KogcError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < 1:
        raise KogcError(f"top_k must be >= 1, got {top_k}")
    if seed is not None and not 0 <= seed < 2**31:
        raise KogcError(f"seed must be in [0, 2**31), got {seed}")
