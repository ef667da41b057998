"""What FP8 weights cost a trained model: perplexity of a fixed text and greedy answers, the model's own
weights against the values kogc's FP8 kernel computes with (one scale per row), against one scale per
block of rows x 128 inputs (the finer alternative), and with the LM head's rounding errors compensated
(kogc.fp8.compensate_head) over calibration text the model writes itself: its greedy answers to
kogc.fp8.CALIBRATION_PROMPTS, none of the measured text. On the CPU, in torch: the kernel's equality with this
arithmetic is tested separately (tests/test_fp8.py).

    python -m kogc.bench.quality --model-dir DIR --text tests/data/english.txt [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from ..fp8 import calibration_text, compensate_head, fake_quantize, quantize_blocks

PROMPTS = ("What is the capital of France?", "Write one sentence about the sea.", "How many legs does a spider have?")


def quantized_copy(model, per: str = "row", which: str = "all"):
    """A copy of a transformers causal LM whose matvec weights (every Linear: attention, MLP and the LM
    head, untied from the embedding, which stays as it is) hold the FP8 values: per="row" as kogc packs
    them, "block" with one scale per 128 inputs of a row. which="head" / "body": only the LM head / all
    but the head (where the loss comes from)."""
    m = copy.deepcopy(model)
    head = m.get_output_embeddings()
    if head is not None and head.weight is m.get_input_embeddings().weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and which in ("all", "head" if mod is head else "body"):
                w = mod.weight
                w.copy_(fake_quantize(w) if per == "row" else quantize_blocks(w).to(w.dtype))
    return m


@torch.no_grad()
def head_compensated_copy(model, calibration: list[torch.Tensor]):
    """quantized_copy(model) with the LM head as kogc.fp8.compensate_head gives it over the calibration
    token ids (the embedding keeps the model's values)."""
    (_, w), = compensate_head(model, calibration).items()
    m = quantized_copy(model, "row")
    m.get_output_embeddings().weight.copy_(w.dequantize(model.get_output_embeddings().weight.dtype))
    return m


@torch.no_grad()
def perplexity(model, ids: torch.Tensor) -> float:
    """exp(mean negative log-likelihood) of `ids` [1, n] in one forward pass."""
    out = model(input_ids=ids, labels=ids)
    return float(torch.exp(out.loss))


@torch.no_grad()
def greedy(model, tok, prompt: str, n: int = 24) -> str:
    msgs = [{"role": "user", "content": prompt}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def measure(model_dir: str, text_path: str, answers: bool = True) -> dict:
    from ..frontend.transformers_dir import load_model, load_tokenizer
    model = load_model(model_dir, dtype=torch.float32).eval()
    tok = load_tokenizer(model_dir)
    with open(text_path) as f:
        ids = tok(f.read(), return_tensors="pt")["input_ids"]
    res = {"model_dir": model_dir, "text": text_path, "tokens": int(ids.shape[1]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__, "rows": []}
    for name, m, answer in (
            ("model's weights (fp32)", model, True), ("fp8, a scale per row (kogc)", quantized_copy(model, "row"), True),
            ("fp8, a scale per row x 128 inputs", quantized_copy(model, "block"), True),
            ("fp8 per row, the LM head only", quantized_copy(model, "row", "head"), False),
            ("fp8 per row, all but the LM head", quantized_copy(model, "row", "body"), False),
            ("fp8 per row, the LM head compensated", head_compensated_copy(model, calibration_text(model, tok)), True)):
        row = {"weights": name, "perplexity": perplexity(m, ids)}
        if answers and answer:
            row["answers"] = {p: greedy(m, tok, p) for p in PROMPTS}
        res["rows"].append(row)
    base = res["rows"][0]["perplexity"]
    for r in res["rows"]:
        r["vs_model"] = r["perplexity"] / base - 1
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kogc.bench.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, help="a transformers model directory (or .gguf file)")
    p.add_argument("--text", required=True, help="an English text (tests/data/english.txt: 2,381 SmolLM2 tokens)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    res = measure(args.model_dir, args.text)
    print(f"{res['tokens']} tokens of {res['text']}")
    for r in res["rows"]:
        print(f"{r['weights']:40} perplexity {r['perplexity']:.3f} ({r['vs_model']:+.2%})")
        for q, a in r.get("answers", {}).items():
            print(f"    {q} -> {a!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
