"""A transformers causal LM from a local directory: `config.json` + `*.safetensors`, or one `.gguf` file
(transformers dequantizes it; needs the `gguf` package). Nothing is downloaded."""
from __future__ import annotations

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
    return model.to(device).eval().requires_grad_(False)


def load_tokenizer(path: str):
    tf = _transformers()
    directory, gguf = _gguf_file(path)
    try:
        return tf.AutoTokenizer.from_pretrained(directory, **({"gguf_file": gguf} if gguf else {}))
    except (OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"model directory {path}: no tokenizer: {str(e).splitlines()[0]}") from None


def load_decode_step(path: str, device: str = "cpu", dtype: torch.dtype | None = None, max_len: int | None = None):
    from .hf import DecodeStep
    return DecodeStep(load_model(path, device, dtype), max_len)
