"""Probe (one NVIDIA GPU): what top-k / top-p sampling costs rank 0 of G, its peers mirrored (one GPU's share of a
G-GPU generation with free exchanges, as `kogc bench --gpus G --mirror` times a step).

A rank gathers the whole vocabulary's logits for a filtered draw, its peers' shards into its receive buffer, and
counts them per 16-bit key before the draw. A mirrored rank's peers are itself, so their shards would never be
written: here that part of the buffer (both step parities) is filled once with random fp16 values of the logits'
spread, which each step's counting reads as it would read its peers'. Each setting generates N tokens in one launch,
R times; the figure is the median ms a token. Tokens are printed so two trees can be compared (the same counts and
draws give the same tokens).

    PYTHONPATH=. python experiments/mirror_sampling.py --config laneformer-2b --gpus 8 --out $OUT/mirror-sampling.json
"""
import argparse
import json
import statistics
import time

import torch

import kogc
from kogc.frontend.model_file import build_model
from kogc.scheduler.tasks import A_TERM, A_TERM_STRIDE

SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=50, top_p=0.9), dict(temperature=0.8, top_p=0.9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="laneformer-2b")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = build_model("examples/laneformer.py", a.config, device="cuda", dtype=torch.float16)
    ck = kogc.compile(model, gpus=a.gpus, one_gpu="mirror")
    argmax = next(t for t in ck.schedule.tasks if t.kind == "argmax")
    whole, vocab = argmax.args[A_TERM], argmax.args[A_TERM_STRIDE]
    g = torch.Generator(device="cuda").manual_seed(0)
    fill = (torch.randn(2 * vocab, device="cuda", generator=g) * 2.0).half().float()
    ck.buffers.F32[whole:whole + 2 * vocab] = fill
    out = {"config": a.config, "gpus": a.gpus, "tokens": a.tokens, "device": torch.cuda.get_device_name(),
           "counts_tasks": sum(t.kind == "count" for t in ck.schedule.tasks), "runs": []}
    for kw in SETTINGS:
        times, toks = [], None
        for r in range(a.reps + 1):             # the first: compiles the kernel (with the filter code if needed)
            ck.reset()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = ck.generate([1, 2, 3], a.tokens, seed=1, **kw)
            torch.cuda.synchronize()
            if r:
                times.append((time.perf_counter() - t0) * 1e3 / len(got))
            toks = got
        row = {**kw, "ms_per_token": statistics.median(times), "all_ms": times, "tokens": toks[:32]}
        out["runs"].append(row)
        print(f"{kw}: {row['ms_per_token']:.4f} ms/token ({1e3 / row['ms_per_token']:.0f} tok/s), first tokens "
              f"{toks[:8]}", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
