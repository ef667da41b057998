"""On a GPU: compile laneformer-2b (random fp16 weights), check it against eager fp16 step by step,
time it, and record memory. Prints a summary line and writes JSON to $OUT (or ./out) if set.

    python scripts/gpu_check.py [--preset laneformer-2b] [--steps 256] [--lanes L] [--timing-steps 200]
        [--fp32-ref] [--twin] [--tile-config '{"attn_impl": "dot", "attn_block": 64}']

--twin also runs the same fp16 model through torch.compile (Inductor's own kernels, another valid
fp16 implementation) and reports how often IT agrees with eager: the agreement two correct fp16
implementations reach on this model, against which kogc's is read.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402
from kogc.bench.measure import time_steps, write_result  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--timing-steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lanes", type=int)
    ap.add_argument("--tile-config", help="JSON of TileConfig fields to use instead of the defaults")
    ap.add_argument("--fp32-ref", action="store_true",
                    help="also run the same weights upcast to fp32 and report how often kogc and eager fp16 each "
                         "pick the fp32 model's argmax (who is off at near-ties)")
    ap.add_argument("--twin", action="store_true",
                    help="also run the fp16 model compiled by torch.compile and report its agreement with eager")
    args = ap.parse_args(argv)
    res = {"preset": args.preset, "date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name()}
    over = {"num_lanes": args.lanes} if args.lanes else {}
    t0 = time.perf_counter()
    model = lf.kogc_model(args.preset, seed=args.seed, **over)          # CPU, fp16 for the 2b preset
    res["build_model_s"] = time.perf_counter() - t0
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    cfg = None
    if args.tile_config:
        from kogc.scheduler.tile import tile_config_from_json
        cfg = tile_config_from_json(args.tile_config)
        res["tile_config"] = json.loads(args.tile_config)
    ck = kogc.compile(model, target="h200", tile_config=cfg)
    res["compile_s"] = time.perf_counter() - t0
    res["schedule_report"] = ck.schedule.report()
    print(res["schedule_report"], flush=True)
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated() - mem0
    parts = ck.memory_bytes()
    needed = parts["W"] + parts["EMB"] + parts["KV"] + parts["ACT"] + parts["F32"] + parts["SMALL"]
    res["gpu_bytes_used"], res["gpu_bytes_needed"] = used, needed
    res["memory_ratio"] = used / needed
    # first launch compiles the kernel
    t0 = time.perf_counter()
    ck.step(1, 0)
    res["first_launch_s"] = time.perf_counter() - t0
    ck.reset()

    ref32 = None
    if args.fp32_ref:
        import copy
        ref32 = copy.deepcopy(model).float().to("cuda")
        ref32.reset_cache()
    eager = model.to("cuda")
    eager.reset_cache()
    twin = None
    if args.twin:          # another fp16 implementation of the same model: Inductor's generated kernels
        import copy
        twin_model = copy.deepcopy(eager)
        twin = torch.compile(twin_model)
        twin_stats = {"agree": 0, "errs": [], "agree32": 0}
    errs, agree, tok, misses, near_ties = [], 0, 1, [], 0
    err32 = {"kogc": [], "eager": []}
    agree32 = {"kogc": 0, "eager": 0}
    with torch.no_grad():
        for pos in range(args.steps):
            ref_logits, ref_tok = eager(torch.tensor(tok, device="cuda"), torch.tensor(pos, device="cuda"))
            logits, got = ck.step(tok, pos)
            ref = ref_logits.float()
            errs.append(float((logits.float() - ref).norm() / ref.norm()))
            agree += int(got == int(ref_tok))
            # how close was eager's own choice? (top-2 gap vs the fp16 spacing at the maximum)
            top2 = torch.topk(ref, 2).values
            gap, spacing = float(top2[0] - top2[1]), float(torch.finfo(torch.float16).eps * abs(top2[0]))
            near_ties += int(gap <= spacing)           # a near-tie: eager's own choice is a rounding matter
            if got != int(ref_tok):
                misses.append({"pos": pos, "eager_top2_gap": gap,
                               "eager_logit_gap_of_kogc_choice": float(ref.max() - ref[got]),
                               "fp16_spacing_at_max": spacing})
            if twin is not None:
                tw_logits, tw_tok = twin(torch.tensor(tok, device="cuda"), torch.tensor(pos, device="cuda"))
                twin_stats["agree"] += int(int(tw_tok) == int(ref_tok))
                twin_stats["errs"].append(float((tw_logits.float() - ref).norm() / ref.norm()))
            if ref32 is not None:
                l32, t32 = ref32(torch.tensor(tok, device="cuda"), torch.tensor(pos, device="cuda"))
                for name, (lg, tk) in {"kogc": (logits, got), "eager": (ref_logits, int(ref_tok))}.items():
                    err32[name].append(float((lg.float() - l32.float()).norm() / l32.float().norm()))
                    agree32[name] += int(tk == int(t32))
                if twin is not None:
                    twin_stats["agree32"] += int(int(tw_tok) == int(t32))
            tok = int(ref_tok)
    if ref32 is not None:
        for name in ("kogc", "eager"):
            res[f"{name}_vs_fp32_mean_rel_err"] = sum(err32[name]) / len(err32[name])
            res[f"{name}_vs_fp32_argmax_agreement"] = agree32[name] / args.steps
        print(f"fp32 reference: kogc rel err {res['kogc_vs_fp32_mean_rel_err']:.2e} argmax "
              f"{res['kogc_vs_fp32_argmax_agreement']:.3f}; eager fp16 rel err {res['eager_vs_fp32_mean_rel_err']:.2e} "
              f"argmax {res['eager_vs_fp32_argmax_agreement']:.3f}", flush=True)
        del ref32
    if twin is not None:
        res["twin_vs_eager_argmax_agreement"] = twin_stats["agree"] / args.steps
        res["twin_vs_eager_mean_rel_err"] = sum(twin_stats["errs"]) / args.steps
        if args.fp32_ref:
            res["twin_vs_fp32_argmax_agreement"] = twin_stats["agree32"] / args.steps
        print(f"twin (torch.compile fp16) vs eager fp16: rel err {res['twin_vs_eager_mean_rel_err']:.2e}, argmax "
              f"agreement {res['twin_vs_eager_argmax_agreement']:.3f}"
              + (f"; twin vs fp32 argmax {res['twin_vs_fp32_argmax_agreement']:.3f}" if args.fp32_ref else ""),
              flush=True)
        del twin, twin_model
    res["steps"] = args.steps
    res["max_rel_err"] = max(errs)
    res["mean_rel_err"] = sum(errs) / len(errs)
    res["argmax_agreement"] = agree / args.steps
    res["argmax_misses"] = misses
    res["eager_near_ties"] = near_ties         # steps whose top two eager logits are <= one fp16 step apart
    res["misses_within_2_fp16_steps"] = sum(m["eager_logit_gap_of_kogc_choice"] <= 2 * m["fp16_spacing_at_max"]
                                            for m in misses)
    del eager, model
    torch.cuda.empty_cache()

    # timing: back-to-back launches (one launch per token), device events
    times = time_steps(lambda i: ck.launch(1 + i, 10 + i), args.timing_steps, 3, "cuda", warmup=10)
    ck.raise_if_stuck()
    ms = sorted(times)[1]
    res["ms_per_token"] = ms
    res["tok_per_s"] = 1e3 / ms
    res["ms_per_token_reps"] = times
    wbytes = parts["W"]
    res["weight_TBps"] = wbytes / (ms * 1e-3) / 1e12
    line = (f"RESULT {args.preset}: max rel err {res['max_rel_err']:.2e}, argmax agreement "
            f"{res['argmax_agreement']:.3f} over {args.steps} steps ({res['misses_within_2_fp16_steps']} of "
            f"{len(misses)} misses within 2 fp16 steps of eager's max; {near_ties} steps are near-ties in eager), "
            f"{res['tok_per_s']:.1f} tok/s "
            f"({ms:.3f} ms/token, weights at {res['weight_TBps']:.2f} TB/s), memory used/needed "
            f"{res['memory_ratio']:.3f}, compile {res['compile_s']:.1f}s + first launch {res['first_launch_s']:.1f}s")
    print(line, flush=True)
    write_result(f"gpu_check_{args.preset}.json", res)
    return res


if __name__ == "__main__":
    main()
