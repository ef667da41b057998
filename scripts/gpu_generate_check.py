"""On a GPU: greedy generation of laneformer-2b in ONE launch against eager greedy decoding, and its
speed against calling `step` in a loop. Prints a RESULT line and writes $OUT/gpu_generate_<preset>.json.

    python scripts/gpu_generate_check.py [--preset laneformer-2b] [--tokens 256]

Correctness: eager is fed kogc's tokens (teacher forcing) and, at every step, kogc's token must be
eager's argmax, or within one fp16 step of eager's maximum logit (a tie at fp16 resolution): how often
that happens is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args(argv)
    model = lf.kogc_model(args.preset, seed=0)
    ck = kogc.compile(model, target="h200")
    prompt = [1, 2, 3, 4]
    ck.generate(prompt, 2)                        # compile the kernel, warm up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = ck.generate(prompt, args.tokens)
    gen_s = time.perf_counter() - t0
    # the same tokens through `step`, one launch (and one host round trip) per token
    for pos, t in enumerate(prompt[:-1]):
        ck.step(t, pos)
    t0 = time.perf_counter()
    tok = prompt[-1]
    for i in range(args.tokens):
        _, tok = ck.step(tok, len(prompt) - 1 + i)
    step_s = time.perf_counter() - t0
    eager = model.to("cuda")
    eager.reset_cache()
    exact, ties, bad = 0, 0, []
    with torch.no_grad():
        seq = prompt + tokens
        for pos in range(len(seq) - 1):
            logits, arg = eager(torch.tensor(seq[pos], device="cuda"), torch.tensor(pos, device="cuda"))
            if pos < len(prompt) - 1:
                continue
            mine = seq[pos + 1]
            ref = logits.float()
            if mine == int(arg):
                exact += 1
            elif ref.max() - ref[mine] <= torch.finfo(torch.float16).eps * abs(float(ref.max())):
                ties += 1
            else:
                bad.append({"pos": pos, "kogc": mine, "eager": int(arg), "gap": float(ref.max() - ref[mine])})
    res = {"preset": args.preset, "date": time.strftime("%Y-%m-%d %H:%M"), "tokens": len(tokens),
           "exact": exact, "fp16_ties": ties, "bad": bad, "generate_tok_per_s": len(tokens) / gen_s,
           "step_loop_tok_per_s": args.tokens / step_s}
    print(f"RESULT generate {args.preset}: {len(tokens)} tokens in one launch, {exact} equal eager's argmax, "
          f"{ties} within one fp16 step of it, {len(bad)} worse; generate {res['generate_tok_per_s']:.1f} tok/s vs "
          f"step loop {res['step_loop_tok_per_s']:.1f} tok/s", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"gpu_generate_{args.preset}.json"), "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
