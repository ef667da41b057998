"""Where the command line's model comes from: a model file and a preset or checkpoint, or a transformers
model (--model-dir, --checkpoint of another format, --max-len), and `kogc run --prompt`'s text."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import KogcError, ModelFileError


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def non_negative(text: str) -> float:
    """argparse type: a number >= 0."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return x


def positive(text: str) -> float:
    """argparse type: a number > 0."""
    x = non_negative(text)
    if x == 0:
        raise argparse.ArgumentTypeError("must be > 0, got 0")
    return x


def model_args(p: argparse.ArgumentParser, default_config: str | None) -> None:
    """Where the model comes from: a model file and a preset, or a checkpoint. A command with a
    default preset defaults to the example model file too."""
    p.add_argument("model_file", nargs="?", default=None,
                   help="a Python file defining kogc_model(...), e.g. examples/llama.py"
                        + (" (default examples/laneformer.py)" if default_config else "")
                        + ", or a transformers model directory (as --model-dir)")
    p.set_defaults(default_model_file=os.path.join("examples", "laneformer.py") if default_config else None)
    p.add_argument("--config", default=default_config, help="a preset of the model file, e.g. tiny | laneformer-2b")
    p.add_argument("--checkpoint", help="a directory with config.json and *.safetensors (instead of --config): "
                                        "the model file's format, or, without a model file, a transformers model")
    p.add_argument("--model-dir", metavar="DIR",
                   help="a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, Gemma, SmolLM2, ...): a directory "
                        "with config.json and *.safetensors, or one .gguf file; needs pip install 'kogc[hf]'")
    p.add_argument("--max-len", type=positive_int, metavar="N",
                   help="positions of the static KV cache: a transformers model's (default min(4096, its maximum, "
                        "its sliding window)), or passed to a model file's kogc_model as max_len (both examples take it)")
    p.add_argument("--lanes", type=positive_int, help="override the preset's num_lanes")
    p.add_argument("--weights", choices=("model", "fp8"), default="model",
                   help="how the kernel stores matvec weights: model (its dtype, the default) or fp8 (E4M3 with one "
                        "fp32 scale per row, quantized when packed: half the bytes of fp16)")
    p.add_argument("--tile-config", metavar="JSON",
                   help='schedule settings instead of the defaults, e.g. \'{"attn_splits": 32}\' '
                        "(fields of kogc.scheduler.TileConfig)")


def resolve_model(args) -> None:
    """MODEL_FILE from --model-dir, or from a --checkpoint that is not a model file's (a transformers
    directory), or the command's default model file; a transformers model's --max-len rides in the
    overrides kogc.frontend.model_file.build_model takes."""
    if not hasattr(args, "model_dir"):
        return
    if args.model_dir:
        if args.model_file or args.checkpoint:
            raise ModelFileError("--model-dir names the whole model: not with MODEL_FILE or --checkpoint")
        args.model_file, args.config = args.model_dir, None
    elif args.model_file is None and args.checkpoint and not is_laneformer_checkpoint(args.checkpoint):
        args.model_file, args.checkpoint, args.config = args.checkpoint, None, None
    elif args.model_file is None:
        args.model_file = args.default_model_file
        if args.model_file is None:
            raise ModelFileError("no model: give MODEL_FILE (with --config or --checkpoint) or --model-dir DIR")


def model_overrides(args) -> dict:
    """Preset fields from the command line (--lanes), and a transformers model's --max-len."""
    out = {"num_lanes": args.lanes} if args.lanes else {}
    if getattr(args, "max_len", None):
        out["max_len"] = args.max_len
    return out


def is_laneformer_checkpoint(path: str) -> bool:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return "num_lanes" in json.load(f)
    except (OSError, ValueError):
        return False


class TextStream:
    """`kogc run --prompt TEXT`: the prompt's token ids (chat template applied unless --raw) and the
    answer printed as text while tokens arrive (decoded whole each time: a token may complete a
    character the previous one began)."""

    def __init__(self, args):
        from .frontend.model_file import is_transformers_dir
        from .frontend.transformers_dir import load_tokenizer, stop_tokens
        if not is_transformers_dir(args.model_file):
            raise KogcError("--prompt takes text for a transformers model (--model-dir DIR, with its tokenizer); "
                            "for a model file give --prompt-ids")
        self.tok = load_tokenizer(args.model_file)
        if not args.raw and getattr(self.tok, "chat_template", None):
            ids = self.tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = self.tok.encode(args.prompt)
        self.ids = [int(i) for i in ids]
        self.eos = stop_tokens(args.model_file, self.tok)
        self.tokens: list[int] = []
        self.shown = ""

    def add(self, token: int) -> None:
        self.tokens.append(token)
        text = self.tok.decode(self.tokens, skip_special_tokens=True)
        if text.startswith(self.shown):
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text


def compensated_head(args, step, tok=None) -> dict:
    """`kogc run --compensate-head`: the LM head of the transformers model in `step` (its decode step)
    in FP8 with compensated rounding over the model's own greedy answers to eight prompts, named as
    kogc.compile(step, weights=...) takes it. `tok`: the model's tokenizer if already loaded."""
    from .api import step_names
    from .fp8 import calibration_text, compensate_head
    from .frontend.model_file import is_transformers_dir
    from .frontend.transformers_dir import load_tokenizer
    if not is_transformers_dir(args.model_file) or not hasattr(step, "model"):
        raise KogcError("--compensate-head takes a transformers model (--model-dir DIR, with its tokenizer): its "
                        "calibration text is the model's answers to a few prompts")
    model = step.model
    print("[run] calibrating the LM head's FP8 rounding: the model's greedy answers to 8 prompts", file=sys.stderr)
    cal = calibration_text(model, tok or load_tokenizer(args.model_file))
    return step_names(compensate_head(model, cal), model, step)
