"""The scaling table of issue 4: kogc's tokens/s for several presets and context lengths, each with
its floor, in one run. One compile per preset; the KV cache is filled with random values up to each
context. Prints a markdown table and writes $OUT/scaling.json.

    python scripts/scaling.py --presets laneformer-0.5b,laneformer-2b,laneformer-7b --contexts 128,1024,4096 [--tile-config JSON]
    TRITON_INTERPRET=1 python scripts/scaling.py --presets tiny --contexts 8,16 --steps 2 --reps 1   # CPU smoke run
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402
from kogc.bench.measure import bytes_per_token, read_bandwidth, time_steps, write_result  # noqa: E402
from kogc.runtime.kernel import fill_kv_from  # noqa: E402
from kogc.scheduler.tile import tile_config_from_json  # noqa: E402


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="laneformer-0.5b,laneformer-2b,laneformer-7b")
    ap.add_argument("--contexts", default="128,1024,4096")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tile-config", help="JSON of TileConfig fields instead of the defaults")
    args = ap.parse_args(argv)
    tiles = tile_config_from_json(args.tile_config) if args.tile_config else None
    gpu = torch.cuda.is_available()
    bw = read_bandwidth() if gpu else None
    rows = []
    for preset in args.presets.split(","):
        t0 = time.perf_counter()
        model = lf.kogc_model(preset, seed=0)
        params = sum(p.numel() for p in model.parameters())
        ck = kogc.compile(model, tile_config=tiles)
        print(f"[scaling] {preset}: {params / 1e9:.2f}B parameters, built and compiled in "
              f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        gen = torch.Generator().manual_seed(1)
        for context in (int(c) for c in args.contexts.split(",")):
            for _, buf in model.named_buffers():
                buf[:, :, :context].copy_(torch.randn(buf[:, :, :context].shape, generator=gen).to(buf.dtype))
            fill_kv_from(ck, model)
            ms = time_steps(lambda i: ck.launch(1 + i % 50, context + i), args.steps, args.reps,
                            "cuda" if gpu else "cpu")
            ck.raise_if_stuck()
            med = sorted(ms)[len(ms) // 2]
            floor_bytes = bytes_per_token(ck, context + args.steps // 2)
            row = {"preset": preset, "params": params, "context": context, "ms": ms, "ms_median": med,
                   "tok_per_s": 1e3 / med, "floor_bytes": floor_bytes,
                   "floor_tok_per_s": bw / floor_bytes if bw else None,
                   "of_floor": floor_bytes / bw / (med * 1e-3) if bw else None}
            rows.append(row)
            share = f", {row['of_floor']:.0%} of floor" if bw else ""
            print(f"[scaling] {preset} context {context}: {med:.3f} ms, {row['tok_per_s']:.1f} tok/s{share}",
                  file=sys.stderr, flush=True)
            save(bw, rows)   # after every row: a run cut short keeps what it measured
        ck = model = None   # free the GPU memory before the next preset
        if gpu:
            torch.cuda.empty_cache()
    print("| preset | parameters | context | ms/token | tok/s | floor tok/s | of floor |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        floor = f"{r['floor_tok_per_s']:.0f}" if r["floor_tok_per_s"] else "-"
        share = f"{r['of_floor']:.0%}" if r["of_floor"] else "-"
        print(f"| {r['preset']} | {r['params'] / 1e9:.2f}B | {r['context']} | {r['ms_median']:.3f} | "
              f"{r['tok_per_s']:.1f} | {floor} | {share} |")
    return rows


def save(bw, rows):
    write_result("scaling.json", {"read_bw_Bps": bw, "rows": rows})


if __name__ == "__main__":
    main()
