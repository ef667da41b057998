"""`kogc bench --scaling`: kogc's speed for several presets x several contexts, each with its floor.

One compile per preset; the KV cache holds random values up to each context; before timing, one step at
the context checked against eager (kogc.bench.against_eager); one launch per step, `steps` steps x `reps`,
the median. The floor of a row: the bytes a step must read at its mean position
(kogc.bench.measure.bytes_per_token) over the HBM read bandwidth measured once at the start.
"""
from __future__ import annotations

import sys
import time

import torch

from ..errors import KogcError
from .against_eager import check_step, token_words
from .measure import bytes_per_token, check_timing, read_bandwidth, time_steps


def run_scaling(model_file: str, presets: list[str | None], contexts: list[int], steps: int = 50, reps: int = 3,
                interpret: bool = False, checkpoint: str | None = None, overrides: dict | None = None,
                tile_config=None, seed: int = 0, quiet: bool = False, on_row=None) -> dict:
    """{"read_bw_Bps", "passed", "rows": [{preset, params, context, check, ms, ms_median, tok_per_s, floor_bytes,
    floor_tok_per_s, of_floor}]}; `on_row(result)` after every row (to save what was measured)."""
    from ..api import compile as kogc_compile
    from ..frontend.model_file import build_model
    from ..runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv

    check_timing(contexts, steps, reps)
    device = "cpu" if interpret else "cuda"
    bw = None if interpret else read_bandwidth()
    res = {"config": {"model_file": model_file, "presets": presets, "checkpoint": checkpoint, "contexts": contexts,
                      "steps": steps, "reps": reps, "date": time.strftime("%Y-%m-%d %H:%M"),
                      "device": "CPU (Triton interpreter)" if interpret else torch.cuda.get_device_name()},
           "read_bw_Bps": bw, "passed": True, "rows": []}
    for preset in presets:
        t0 = time.perf_counter()
        model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
        params = sum(p.numel() for p in model.parameters())
        ck = kogc_compile(model, interpret=interpret, tile_config=tile_config)
        name = preset or checkpoint or model_file
        if max(contexts) + steps + 2 > ck.max_pos:
            raise KogcError(f"{name}: context {max(contexts)} + {steps} steps do not fit the KV cache of "
                            f"{ck.max_pos} positions")
        _say(f"{name}: {params / 1e6:.1f}M parameters, built and compiled in {time.perf_counter() - t0:.1f}s", quiet)
        gen = torch.Generator().manual_seed(seed + 1)
        caches = kv_cache_buffers(ck.ir, model)
        for context in contexts:
            randomize_kv(caches, context, gen)
            fill_kv_from(ck, model)
            check = check_step(ck, model, context, device)
            res["passed"] = res["passed"] and check["ok"]
            ms = time_steps(lambda i: ck.launch(1 + i % 50, context + i), steps, reps, device,
                            warmup=0 if interpret else 3)
            ck.raise_if_stuck()
            med = sorted(ms)[len(ms) // 2]
            floor = bytes_per_token(ck, context + steps // 2)
            row = {"preset": name, "params": params, "context": context, "check": check, "ms": ms, "ms_median": med,
                   "tok_per_s": 1e3 / med, "floor_bytes": floor, "floor_tok_per_s": bw / floor if bw else None,
                   "of_floor": floor / bw / (med * 1e-3) if bw else None}
            res["rows"].append(row)
            share = f", {row['of_floor']:.1%} of floor" if bw else ""
            _say(f"{name} context {context}: {med:.3f} ms, {row['tok_per_s']:.1f} tok/s{share}; against eager: "
                 f"{_verdict(check)}", quiet)
            if on_row:
                on_row(res)
        ck = model = None               # free the GPU memory before the next preset
        if not interpret:
            torch.cuda.empty_cache()
    return res


def format_scaling(res: dict) -> str:
    c = res["config"]
    bw = res["read_bw_Bps"]
    lines = [f"{c['steps']} steps x {c['reps']} reps on {c['device']} ({c['date']}); "
             + (f"read bandwidth {bw / 1e12:.2f} TB/s" if bw else "no bandwidth on CPU (no floor)"),
             "| preset | parameters | context | ms/token | tok/s | floor tok/s | of floor | against eager |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        floor = f"{r['floor_tok_per_s']:.0f}" if r["floor_tok_per_s"] else "-"
        share = f"{r['of_floor']:.1%}" if r["of_floor"] else "-"
        params = f"{r['params'] / 1e9:.2f}B" if r["params"] >= 1e8 else f"{r['params'] / 1e6:.2f}M"
        lines.append(f"| {r['preset']} | {params} | {r['context']} | {r['ms_median']:.3f} | "
                     f"{r['tok_per_s']:.1f} | {floor} | {share} | {_verdict(r['check'])} |")
    return "\n".join(lines)


def _verdict(check: dict) -> str:
    """A row's check in a few words: the logits' relative error and whether the token is eager's."""
    return f"{check['rel_err']:.1e}, {token_words(check)}{'' if check['ok'] else ': FAILED'}"


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[scaling] {msg}", file=sys.stderr, flush=True)
