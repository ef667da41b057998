"""On a GPU: time kogc's kernel for several schedule settings on the same weights, in one run.

    python scripts/sweep.py --preset laneformer-2b --context 1024 --variants '[{"tile_bytes": 32768}, ...]'
Each variant is a dict of TileConfig fields plus optional "programs_per_unit", "num_warps" and
"profile": true.
Prints one line per variant and writes $OUT/sweep.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402
from kogc.bench.measure import bytes_per_token, read_bandwidth, time_steps  # noqa: E402
from kogc.runtime.kernel import fill_kv_from  # noqa: E402
from kogc.scheduler import TileConfig  # noqa: E402
from kogc.targets import H200  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--variants", default='[{}]')
    args = ap.parse_args()
    model = lf.kogc_model(args.preset, seed=0)
    gen = torch.Generator().manual_seed(1)
    for name, buf in model.named_buffers():
        buf[:, :, :args.context].copy_(torch.randn(buf[:, :, :args.context].shape, generator=gen).to(buf.dtype))
    bw = read_bandwidth()
    print(f"read bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results = []
    for v in json.loads(args.variants):
        v = dict(v)
        ppu = v.pop("programs_per_unit", H200.programs_per_unit)
        profile = v.pop("profile", False)
        warps = v.pop("num_warps", None)
        cfg = dataclasses.replace(TileConfig(), **v)
        t0 = time.perf_counter()
        try:
            ck = kogc.compile(model, tile_config=cfg, num_programs=H200.compute_units * ppu, profile=profile,
                              num_warps=warps)
            fill_kv_from(ck, model)
            ms = time_steps(lambda i: ck.launch(1 + i % 50, args.context + i), args.steps, 3, "cuda")
            ck.raise_if_stuck()
        except Exception as e:
            print(f"{v} ppu={ppu}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        floor = bytes_per_token(ck, args.context + args.steps // 2)
        med = sorted(ms)[1]
        row = {"variant": v, "programs_per_unit": ppu, "num_warps": warps, "profile": profile, "ms": ms,
               "ms_median": med,
               "tok_per_s": 1e3 / med, "of_floor": floor / bw / (med * 1e-3), "tasks": len(ck.schedule.tasks),
               "waits": sum(len(t.waits) for t in ck.schedule.tasks), "compile_s": time.perf_counter() - t0}
        if profile:
            from kogc.runtime.profile import chrome_trace, format_summary, summarize
            row["profile"] = summarize(ck)
            print(format_summary(row["profile"]), flush=True)
            if os.environ.get("OUT"):
                chrome_trace(ck, os.path.join(os.environ["OUT"], "trace.json"))
        print(f"{v} ppu={ppu} profile={profile}: {med:.3f} ms ({row['tok_per_s']:.0f} tok/s, "
              f"{row['of_floor']:.0%} of floor), {row['tasks']} tasks, {row['waits']} waits", flush=True)
        results.append(row)
        del ck
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "sweep.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
