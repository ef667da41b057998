"""A `transformers` causal LM as a kogc decode step: forward(token, pos) -> (logits, next token).

The model runs as transformers runs it, with its own `StaticCache` (the KV cache as fixed tensors
written in place at the position), so torch.export sees the library's code unchanged. The cache's
tensors are registered as buffers of the step module: kogc finds them as the model's state.
"""
from __future__ import annotations

import contextlib
import copy
import inspect

import torch
from torch import nn

from .trace import FrontendError

# the kinds of layer (a config's layer_types) kogc compiles; others (linear attention, state spaces, convolutions)
# are refused by name
ATTENTION_LAYERS = {"full_attention", "sliding_attention"}

DEFAULT_MAX_LEN = 4096


def is_transformers_model(module: nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)


class DecodeStep(nn.Module):
    """One decode step of a transformers causal LM over a static KV cache of `max_len` positions."""

    def __init__(self, model: nn.Module, max_len: int | None = None):
        super().__init__()
        from transformers import StaticCache
        config = model.config.get_text_config()
        other = sorted(set(getattr(config, "layer_types", None) or ()) - ATTENTION_LAYERS)
        if other:
            raise FrontendError(f"{type(model).__name__}: layers of kind {', '.join(map(repr, other))} (its config's "
                                f"layer_types) are not supported: kogc compiles decoders whose every layer is attention "
                                f"(full or over a sliding window)")
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "max_seq_len", None) or \
            DEFAULT_MAX_LEN         # (MPT's is max_seq_len)
        self.max_len = min(max_len or DEFAULT_MAX_LEN, limit)
        self.model = model
        fp8 = getattr(model, "kogc_fp8_weights", None)       # weights stored in FP8 (kogc.frontend.transformers_dir)
        if fp8:
            self.kogc_fp8_weights = {"model." + k: v for k, v in fp8.items()}
        window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        # Every layer's cache holds all max_len positions, indexed by position (transformers' sliding-window
        # layers keep a rolling buffer of the window instead): the cache is made from the config with its
        # windows off, while the model keeps them in its masks, which kogc reads as a sliding window per
        # layer. A window no shorter than the cache never bites: a model without per-layer kinds then runs
        # its plain causal path.
        self.no_window = bool(window) and window >= self.max_len and not getattr(config, "layer_types", None)
        if window:
            config = copy.copy(config)
            _set(config, "sliding_window", None)
            if getattr(config, "layer_types", None):
                _set(config, "layer_types", ["full_attention"] * len(config.layer_types))
        # (transformers 5 names the cache argument `cache`; earlier versions `past_key_values`)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        param = next(model.parameters())
        self.cache = StaticCache(config=config, max_cache_len=self.max_len)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.cache.early_initialization(1, kv_heads, head_dim, param.dtype, param.device)
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"k_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"v_cache_{i}", layer.values, persistent=False)
            self.register_buffer(f"cache_length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, token: torch.Tensor, pos: torch.Tensor):
        for i, layer in enumerate(self.cache.layers):
            # the cache's tensors as this module's buffers (what torch.export sees as the model's state)
            layer.keys, layer.values = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            layer.cumulative_length = getattr(self, f"cache_length_{i}")
            layer.cumulative_length.copy_(pos)   # the cache writes at its own counter: set it to pos
            # the layer makes its positions on the device it was created on: the buffers' after .to(device)
            layer.device = layer.keys.device
        with _window_off(self.model.config if self.no_window else None):
            out = self.model(input_ids=token.reshape(1, 1), position_ids=pos.reshape(1, 1),
                             cache_position=pos.reshape(1), use_cache=True, **{self.cache_arg: self.cache})
        logits = out.logits.reshape(-1)
        return logits, torch.argmax(logits)

    def reset_cache(self) -> None:
        for layer in self.cache.layers:
            layer.keys.zero_()
            layer.values.zero_()


@contextlib.contextmanager
def _window_off(config):
    """config.sliding_window (and its text config's) set to None for one call, then restored."""
    configs = [] if config is None else list({id(c): c for c in (config, config.get_text_config())}.values())
    saved = [c.sliding_window for c in configs]
    try:
        for c in configs:
            _set(c, "sliding_window", None)
        yield
    finally:
        for c, w in zip(configs, saved):
            _set(c, "sliding_window", w)


def _set(config, name: str, value) -> None:
    """config.name = value, past a strict config's validation (huggingface_hub's strict dataclasses, e.g. Cwm's,
    refuse a sliding_window of None): the window off is kogc's own reading of the model, not a config the user sees."""
    object.__setattr__(config, name, value)


def decode_step(model: nn.Module, max_len: int | None = None) -> nn.Module:
    """`model` as a kogc decode step: a transformers model wrapped (DecodeStep), anything else as is."""
    if is_transformers_model(model):
        return DecodeStep(model.eval(), max_len)
    return model
