"""A transformers causal LM from a local directory: `config.json` + `*.safetensors`, or one `.gguf` file
(transformers dequantizes it; needs the `gguf` package). Nothing is downloaded.

Weights stored in FP8 in the safetensors (float8 tensors with a per-row scale beside them as NAME_scale,
kogc.fp8.from_state_dict) are given to the module dequantized (transformers alone would load the bare
FP8 values) and kept, as they are, in the model's `kogc_fp8_weights`: `kogc.compile(..., weights="fp8")`
packs those bytes without a round trip through the model's dtype."""
from __future__ import annotations

import glob
import os

import torch

from ..errors import ModelFileError


def _gguf_file(path: str) -> tuple[str, str | None]:
    """(directory, the .gguf file in it or named by path, if any)."""
    if os.path.isfile(path) and path.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if not os.path.isdir(path):
        raise ModelFileError(f"model directory {path}: no such directory")
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    if len(ggufs) == 1:
        return path, ggufs[0]
    raise ModelFileError(f"model directory {path}: needs config.json and *.safetensors, or exactly one .gguf file "
                         f"(found {len(ggufs)})")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ModelFileError("a transformers model needs the transformers package: pip install 'kogc[hf]'") from None
    return transformers


def load_model(path: str, device: str = "cpu", dtype: torch.dtype | None = None):
    """The causal LM of `path` (eval mode, no gradients)."""
    tf = _transformers()
    directory, gguf = _gguf_file(path)
    kwargs = {"gguf_file": gguf} if gguf else {}
    try:
        model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype or "auto", **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"model directory {path}: {str(e).splitlines()[0]}") from None
    if not gguf:
        _fp8_into(model, directory)
    return model.to(device).eval().requires_grad_(False)


FP8_ATTRIBUTE = "kogc_fp8_weights"


def _fp8_into(model, directory: str) -> None:
    """The directory's FP8 weights: each parameter set to its dequantized values, and the FP8 tensors
    kept in model.kogc_fp8_weights (by parameter name) when there are any."""
    from safetensors import safe_open

    from ..fp8 import SCALE_SUFFIXES, from_state_dict
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    names = {}
    for f in files:
        with safe_open(f, "pt") as h:
            names.update({k: (f, h.get_slice(k).get_dtype()) for k in h.keys()})
    wanted = [k for k, (_, dt) in names.items() if dt.startswith("F8")]
    wanted += [k + s for k in wanted for s in SCALE_SUFFIXES if k + s in names]
    if not wanted:
        return
    state = {}
    for k in wanted:
        with safe_open(names[k][0], "pt") as h:
            state[k] = h.get_tensor(k)
    fp8 = from_state_dict(state)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, w in fp8.items():
        if name not in params:
            raise ModelFileError(f"model directory {directory}: FP8 tensor {name} is no parameter of the model")
        with torch.no_grad():
            params[name].copy_(w.dequantize(params[name].dtype))
    setattr(model, FP8_ATTRIBUTE, fp8)


def load_tokenizer(path: str):
    tf = _transformers()
    directory, gguf = _gguf_file(path)
    try:
        return tf.AutoTokenizer.from_pretrained(directory, **({"gguf_file": gguf} if gguf else {}))
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"model directory {path}: no tokenizer: {str(e).splitlines()[0]}") from None


def stop_tokens(path: str, tok) -> list[int]:
    """The ids an answer ends at: the tokenizer's EOS and those the model's generation_config.json names (as
    transformers' generate stops: Llama 3's instruct models name <|eot_id|> besides <|end_of_text|>, Gemma 3's
    <end_of_turn> besides <eos>)."""
    ids = [] if tok.eos_token_id is None else [int(tok.eos_token_id)]
    directory, gguf = _gguf_file(path)
    if not gguf:
        try:
            named = _transformers().GenerationConfig.from_pretrained(directory).eos_token_id
        except OSError:     # no generation_config.json
            named = None
        for t in [] if named is None else [named] if isinstance(named, int) else named:
            if int(t) not in ids:
                ids.append(int(t))
    return ids


def load_decode_step(path: str, device: str = "cpu", dtype: torch.dtype | None = None, max_len: int | None = None):
    from .hf import DecodeStep
    return DecodeStep(load_model(path, device, dtype), max_len)
