"""On a GPU: time kogc's kernel for several schedule settings on the same weights, in one run.

    python scripts/sweep.py --preset laneformer-2b --context 1024 --variants '[{"tile_bytes": 32768}, ...]'
    TRITON_INTERPRET=1 python scripts/sweep.py --preset tiny --context 8,16 --steps 2 --variants '[{}, {"attn_impl": "dot"}]'
Each variant is a dict of TileConfig fields plus optional "programs_per_unit", "num_warps",
"max_registers" (ptxas's cap per thread: 3 programs of 4 warps fit an SM at <= 168), "num_programs" (the grid,
instead of programs_per_unit x SMs), "cooperative": false (launch without the cooperative attribute), "host_poll": true (launch as a
streamed generation does: each step's count published system-wide) and "profile": true (or "detail": matvec bodies split into operands / compute / publish; with $OUT set, the stamps go to $OUT/task-times-<context>.npz, or task-times-<context>-v<i>.npz for the variant at index i > 0). `--context` takes a comma-separated list: every variant is timed at each.
Correctness guard: at each context every variant's logits for the same token, position and KV cache
are compared with eager PyTorch's and with the first variant's (relative error, same argmax), so a
faster variant that computes something else shows up in the same run; so are the logits after 16
launches back to back from the same cache (each reading the rows the earlier ones wrote).
Prints one line per variant and context and writes $OUT/sweep.json.
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
from kogc.bench.measure import bytes_per_token, read_bandwidth, time_steps, write_result  # noqa: E402
from kogc.runtime.kernel import fill_kv_from  # noqa: E402
from kogc.scheduler import TileConfig  # noqa: E402
from kogc.targets import H200  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--context", default="1024", help="one context or several, comma-separated")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--variants", default='[{}]')
    args = ap.parse_args()
    model = lf.kogc_model(args.preset, seed=0)
    contexts = [int(c) for c in args.context.split(",")]
    kv_fills = {}                 # the same random cache contents for every variant
    gen = torch.Generator().manual_seed(1)
    for c in contexts:
        kv_fills[c] = [torch.randn(buf[:, :, :c].shape, generator=gen).to(buf.dtype) for _, buf in model.named_buffers()]

    def set_cache(context):       # the model's own cache: these contents up to `context`, zeros after
        for (_, buf), vals in zip(model.named_buffers(), kv_fills[context]):
            buf.zero_()
            buf[:, :, :context].copy_(vals.to(buf.device))

    gpu = torch.cuda.is_available()     # without one: a smoke run under the interpreter (no speed figures)
    # the eager model's logits for token 7 at each context, on the same cache contents: every variant
    # is checked against them (the guard that a faster variant still computes the model)
    dev = "cuda" if gpu else "cpu"
    eager = {}
    with torch.no_grad():
        model.to(dev)
        for c in contexts:
            set_cache(c)
            logits, tok = model(torch.tensor(7, device=dev), torch.tensor(c, device=dev))
            eager[c] = (logits.float().cpu(), int(tok))
        model.to("cpu")
    bw = read_bandwidth() if gpu else float("nan")
    print(f"read bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results, reference, chain_reference = [], {}, {}
    for vi, v in enumerate(json.loads(args.variants)):
        v = dict(v)
        ppu = v.pop("programs_per_unit", H200.programs_per_unit)
        profile = v.pop("profile", False)
        warps = v.pop("num_warps", None)
        maxreg = v.pop("max_registers", None)
        host_poll = v.pop("host_poll", False)
        cooperative = v.pop("cooperative", True)
        programs = v.pop("num_programs", None)      # the grid, overriding programs_per_unit
        cfg = dataclasses.replace(TileConfig(), **v)
        t0 = time.perf_counter()
        try:
            ck = kogc.compile(model, tile_config=cfg, num_programs=(programs or H200.compute_units * ppu) if gpu else None,
                              profile=profile,
                              num_warps=warps, max_registers=maxreg, cooperative=cooperative)
        except Exception as e:
            print(f"{v} ppu={ppu}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        compile_s = time.perf_counter() - t0
        for context in contexts:
            try:
                set_cache(context)
                fill_kv_from(ck, model)
                logits, tok = ck.step(7, context)
                ms = time_steps(lambda i: ck.launch(1 + i % 50, context + 1 + i, host_poll=host_poll), args.steps, 3, dev)
                # back to back, as timed: 16 launches, each reading the cache rows the ones before wrote
                # (a launch that overlapped its predecessor would have to see them), from the same cache
                set_cache(context)
                fill_kv_from(ck, model)
                for i in range(16):
                    ck.launch(1 + i, context + 1 + i, host_poll=host_poll)
                chain = (ck.logits_view.float().clone(), int(ck.buffers.OUT[0].item()))
                # the same steps generated in one launch (no launch gap; the token fed back on the GPU;
                # last, so that a profile's stamps are of this launch's last step, as before)
                gen = [x / args.steps for x in time_steps(
                    lambda i: ck.launch(1, context + 1, nsteps=args.steps, host_poll=host_poll), 1, 3, dev, warmup=1)]
                ck.raise_if_stuck()
            except Exception as e:
                print(f"{v} ppu={ppu} context {context}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            ref = reference.setdefault(context, (logits.float(), tok))
            rel = float((logits.float() - ref[0]).norm() / ref[0].norm())
            chain_ref = chain_reference.setdefault(context, chain)
            chain_rel = float((chain[0] - chain_ref[0]).norm() / chain_ref[0].norm())
            e_logits, e_tok = eager[context]
            rel_eager = float((logits.float().cpu() - e_logits).norm() / e_logits.norm())
            floor = bytes_per_token(ck, context + args.steps // 2)
            med = sorted(ms)[1]
            row = {"variant": v, "context": context, "programs_per_unit": ppu, "num_programs": ck.schedule.num_programs,
                   "num_warps": warps,
                   "max_registers": maxreg,
                   "profile": profile, "host_poll": host_poll, "ms": ms, "ms_median": med, "tok_per_s": 1e3 / med,
                   "generate_ms": gen, "generate_ms_median": sorted(gen)[1],
                   "of_floor": floor / bw / (med * 1e-3), "tasks": len(ck.schedule.tasks),
                   "waits": sum(len(t.waits) for t in ck.schedule.tasks), "compile_s": compile_s,
                   "rel_err_vs_first_variant": rel, "same_token_as_first_variant": tok == ref[1],
                   "rel_err_vs_eager": rel_eager, "same_token_as_eager": tok == e_tok, "cooperative": cooperative,
                   "chain16_rel_err_vs_first_variant": chain_rel, "chain16_same_token": chain[1] == chain_ref[1],
                   "regs_spills": [getattr(ck.compiled, "n_regs", None), getattr(ck.compiled, "n_spills", None)]}
            if profile:
                from kogc.runtime.profile import chrome_trace, format_summary, summarize
                row["profile"] = summarize(ck)
                print(format_summary(row["profile"]), flush=True)
                if os.environ.get("OUT"):
                    import numpy as np
                    from kogc.runtime.profile import timestamps
                    tag = f"{context}-v{vi}" if vi else f"{context}"     # v<index>: the variant's place in the list
                    chrome_trace(ck, os.path.join(os.environ["OUT"], f"trace-{tag}.json"))
                    ids, ts = timestamps(ck)       # per task: for scripts/critical_path.py --task-times
                    np.savez_compressed(os.path.join(os.environ["OUT"], f"task-times-{tag}.npz"), ids=ids, ts=ts)
            print(f"{v} programs={ck.schedule.num_programs}{'' if cooperative else ' not cooperative'} context {context}: {med:.3f} ms, in one launch {row['generate_ms_median']:.3f} ms "
                  f"({row['tok_per_s']:.0f} tok/s, "
                  f"{row['of_floor']:.0%} of floor), {row['tasks']} tasks, {row['waits']} waits, "
                  f"regs/spills {row['regs_spills']}, vs eager: rel err {rel_eager:.1e}, same token {tok == e_tok}; "
                  f"vs first variant: rel err {rel:.1e}, after 16 launches back to back {chain_rel:.1e}", flush=True)
            results.append(row)
        ck = None   # free its buffers before the next variant
        torch.cuda.empty_cache()
        write_result("sweep.json", results)   # after every variant: a run cut off by its time limit keeps what it measured


if __name__ == "__main__":
    main()
