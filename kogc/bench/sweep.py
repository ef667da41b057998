"""`kogc sweep`: several schedule settings x several contexts, timed in one run on the same weights,
each checked against eager.

A variant is a JSON object of `TileConfig` fields (on top of --tile-config's, if given) plus,
optionally, "target" (h200 | h100: the description fitted to the GPU, and the placement profile it takes),
"num_programs" (the persistent grid), "num_warps", "max_registers" (ptxas's cap per thread) and "profile"
(true, or "detail": per-task timestamps of one step, summarised; with an output
folder also saved for `kogc analyze`).

At every context every variant computes the step for token 7 at that position on the same KV cache
(random up to the context) and is compared with eager PyTorch's logits on that cache (relative error,
tie-aware argmax: kogc.check) and with the first variant's; on a GPU also after 16 launches back to
back from the same cache, each reading the rows the ones before wrote, run twice: the kernel is
deterministic, so a variant whose two runs differ fails (a race, not rounding).

With `--gpus G --mirror` every variant is rank 0 of G alone on this GPU, its peers mirrored
(kogc.runtime.ranks.mirror_rank: one GPU's share of a G-GPU step with free exchanges), and the model
checked against is the same model with every lane group's weights and cache a copy of rank 0's, on
rank 0's vocabulary shard (what the mirror computes).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import torch

from ..compare import TIE_ULPS, default_max_rel_err, rel_err, tie_dtype, token_miss
from ..errors import KogcError
from ..ir.shard import vocab_shard
from ..targets import ALIASES
from .against_eager import fp32_decides, fp32_verdict, reference_module
from .measure import bytes_per_token, check_timing, kernel_id, read_bandwidth, time_steps

RUN_OPTIONS = ("target", "num_programs", "num_warps", "max_registers", "profile")
CHAIN = 16          # launches back to back in the chained check (GPU)
TOKEN = 7           # the token every variant computes the checked step for


def parse_variants(text: str, interpret: bool, base: str | None = None) -> list[tuple[dict, object, dict]]:
    """--variants JSON -> [(the variant as given, its TileConfig or None, its run options)]; a
    KogcError / SchedulerError for bad JSON, a non-object, an unknown field or a bad value. `base`
    (--tile-config JSON): TileConfig fields every variant starts from."""
    from ..settings import INTERPRETER_TILES
    from ..scheduler import TileConfig
    from ..scheduler.config import tile_config_from_json
    try:
        variants = json.loads(text)
    except json.JSONDecodeError as e:
        raise KogcError(f"--variants is not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if isinstance(variants, dict):
        variants = [variants]
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) for v in variants):
        raise KogcError(f"--variants must be a JSON list of objects (TileConfig fields and {', '.join(RUN_OPTIONS)}), "
                        f"got {text!r}")
    common = {}
    if base:
        tile_config_from_json(base)                       # checks the names and values
        common = json.loads(base)
    out = []
    for v in variants:
        fields = {**common, **{k: x for k, x in v.items() if k not in RUN_OPTIONS}}
        opts = {k: x for k, x in v.items() if k in RUN_OPTIONS}
        for k in ("num_programs", "num_warps", "max_registers"):
            if k in opts and (not isinstance(opts[k], int) or isinstance(opts[k], bool) or opts[k] < 1):
                raise KogcError(f"variant {json.dumps(v)}: {k} must be a positive integer")
        if "target" in opts and str(opts["target"]).lower() not in ALIASES:
            known = ", ".join(sorted(set(ALIASES.values())))
            raise KogcError(f"variant {json.dumps(v)}: target must be one of {known}")
        if opts.get("profile", False) not in (False, True, "detail"):
            raise KogcError(f"variant {json.dumps(v)}: profile must be true, false or \"detail\"")
        if opts.get("profile") and interpret:
            raise KogcError("profile needs a GPU timer: not available under the interpreter")
        cfg = None
        if fields:
            tile_config_from_json(json.dumps(fields))     # checks the names and values
            cfg = dataclasses.replace(INTERPRETER_TILES if interpret else TileConfig(), **fields)
        out.append((v, cfg, opts))
    return out


def run_sweep(model_file: str, preset: str | None, variants: str, contexts: list[int], steps: int = 100,
              reps: int = 3, interpret: bool = False, checkpoint: str | None = None, overrides: dict | None = None,
              seed: int = 0, out_dir: str | None = None, json_path: str | None = None, quiet: bool = False,
              tile_config: str | None = None, mirror_of: int = 0) -> dict:
    """Time every variant at every context; returns {"read_bw_Bps", "rows": [...], "passed"}.
    tile_config: TileConfig fields as JSON that every variant starts from. mirror_of=G: each variant is
    rank 0 of G with its peers mirrored (kogc.runtime.ranks.mirror_rank), checked against eager on the
    model with every lane group (weights and cache) a copy of rank 0's, on rank 0's vocabulary shard."""
    from ..api import compile as kogc_compile
    from ..frontend.model_file import build_model

    parsed = parse_variants(variants, interpret, tile_config)
    if out_dir and not any(opts.get("profile") for _, _, opts in parsed):
        # (a rows file given as --out would otherwise be silently not written)
        raise KogcError(f"--out {out_dir}: only a profiled variant ({{\"profile\": true}}) writes there, and no variant "
                        f"asks for one; the rows go to --json FILE")
    check_timing(contexts, steps, reps)
    if mirror_of and interpret and steps > 1:     # (each row times a launch of `steps` steps: kernel.launch)
        raise KogcError(f"--steps {steps}: under the interpreter a mirrored rank runs one step a launch (its queue "
                        f"is cut before each wait on its peers): give --steps 1")
    device = "cpu" if interpret else "cuda"
    warmup = 0 if interpret else 3
    model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
    full_graph = None
    if mirror_of:
        from ..frontend import to_ir
        from ..ir.shard import check_shardable
        from ..runtime.ranks import copy_lane_groups
        full_graph = to_ir(model, gpus=mirror_of)       # (an ordinary decoder cut into its lanes)
        check_shardable(full_graph, mirror_of)
        copy_lane_groups(full_graph, dict(model.named_parameters()), mirror_of)
    dtype = next(model.parameters()).dtype
    ties, limit = tie_dtype(dtype), default_max_rel_err(dtype)
    room = steps + (CHAIN if not interpret else 0) + 2
    fills: dict = {}     # context -> {cache buffer's name: its random rows}, from the first compiled kernel's IR

    def random_caches(ck) -> None:
        """The cache contents of every context (the same for every variant), once the caches are known."""
        from ..runtime.kernel import kv_cache_buffers, random_kv_rows
        if fills:
            return
        if max(contexts) + room > ck.max_pos:
            raise KogcError(f"context {max(contexts)} + {room} positions do not fit the KV cache of {ck.max_pos}")
        gen = torch.Generator().manual_seed(seed + 1)
        caches = kv_cache_buffers(ck.ir, model)
        for c in contexts:
            fills[c] = random_kv_rows(caches, c, gen)
            if mirror_of:
                copy_lane_groups(full_graph, fills[c], mirror_of)

    def set_cache(context, module=None):     # these contents up to `context`, zeros after (the model's caches,
        # or a copy's), found by name: moving a module to a device and back replaces its buffers' tensors
        bufs = dict((model if module is None else module).named_buffers())
        for name, vals in fills[context].items():
            buf = bufs[name]
            buf.zero_()
            buf.narrow(-2, 0, context).copy_(vals.to(buf.device))

    eager = {}       # eager's logits for TOKEN at each context, on the same cache, per weight format

    def eager_logits(weights: str, graph) -> None:
        """Eager's logits at every context with the weights a kernel of this format computes with (FP8:
        the same quantized weights, on a copy of the model)."""
        if weights in eager:
            return
        m = reference_module(model, weights, graph)
        eager[weights] = {}
        with torch.no_grad():
            m.to(device)
            for c in contexts:
                set_cache(c, m)
                logits, tok = m(torch.tensor(TOKEN, device=device), torch.tensor(c, device=device))
                logits = logits.float().cpu()
                if mirror_of:       # rank 0's vocabulary shard, its best id
                    logits = logits[:vocab_shard(logits.shape[0], mirror_of, 0)[1]]
                    tok = logits.argmax()
                eager[weights][c] = (logits, int(tok))
            m.to("cpu")
    bw = None if interpret else read_bandwidth()
    if bw:
        _say(f"read bandwidth {bw / 1e12:.2f} TB/s", quiet)
    res = {"config": {"model_file": model_file, "preset": preset, "checkpoint": checkpoint, "contexts": contexts,
                      "steps": steps, "reps": reps, "date": time.strftime("%Y-%m-%d %H:%M"),
                      "device": "CPU (Triton interpreter)" if interpret else torch.cuda.get_device_name()},
           "read_bw_Bps": bw, "rows": []}
    first: dict = {}
    for vi, (v, cfg, opts) in enumerate(parsed):
        t0 = time.perf_counter()
        try:
            ck = kogc_compile(model, target=opts.get("target"), interpret=interpret, tile_config=cfg,
                              num_programs=opts.get("num_programs"),
                              profile=opts.get("profile", False), num_warps=opts.get("num_warps"),
                              max_registers=opts.get("max_registers"),
                              **(dict(gpus=mirror_of, one_gpu="mirror") if mirror_of else {}))
        except Exception as e:     # a variant that cannot compile is a result, not the end of the sweep
            res["rows"].append({"variant": v, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            _say(f"{json.dumps(v)}: FAILED {res['rows'][-1]['error']}", quiet, always=True)
            continue
        compile_s = time.perf_counter() - t0
        random_caches(ck)
        weights = ck.schedule.tile_config.weights
        eager_logits(weights, ck.ir)
        for context in contexts:
            try:
                row = _measure(ck, model, set_cache, context, steps, reps, device, warmup, interpret)
            except Exception as e:
                res["rows"].append({"variant": v, "context": context, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                _say(f"{json.dumps(v)} context {context}: FAILED {res['rows'][-1]['error']}", quiet, always=True)
                continue
            logits, tok, chain = row.pop("_logits"), row["token"], row.pop("_chain")
            e_logits, e_tok = eager[weights][context]
            # (variants are compared with the first of their weight format: FP8 computes other values)
            ref = first.setdefault((weights, context), {"logits": logits, "token": tok, "chain": chain,
                                                        "ms": row["ms_median"]})
            miss = token_miss(e_logits, tok, TIE_ULPS, ties)
            floor = bytes_per_token(ck, context + steps // 2)
            row.update(variant=v, context=context, target=ck.schedule.target.name,
                       num_programs=ck.schedule.num_programs, tasks=len(ck.schedule.tasks),
                       kernel_source_sha1=kernel_id(ck),
                       compile_s=compile_s, rel_err_vs_eager=rel_err(logits, e_logits),
                       same_token_as_eager=tok == e_tok,
                       argmax_miss_vs_eager=miss, rel_err_vs_first_variant=rel_err(logits, ref["logits"]),
                       same_token_as_first_variant=tok == ref["token"],
                       ms_vs_first_variant=row["ms_median"] / ref["ms"] - 1, floor_bytes=floor,
                       of_floor=floor / bw / (row["ms_median"] * 1e-3) if bw else None,
                       regs_spills=[getattr(ck.compiled, "n_regs", None), getattr(ck.compiled, "n_spills", None)])
            if chain is not None and ref["chain"] is not None:
                row["chain_rel_err_vs_first_variant"] = rel_err(chain[0], ref["chain"][0])
                row["chain_same_token"] = chain[1] == ref["chain"][1]
            close = row["rel_err_vs_eager"] <= limit and miss is None
            if not close and fp32_decides(dtype):
                m = reference_module(model, weights, ck.ir)
                set_cache(context, m)
                row["fp32"] = fp32_verdict(m, context, device, mirror_of, logits, tok, e_logits, dtype)
                close = row["fp32"]["ok"]
            row["ok"] = bool(close and row.get("chain_same_token", True) and not row.get("chain_repeat_rel_err"))
            if mirror_of:
                row["mirror_of"] = mirror_of
            if opts.get("profile"):
                _profile(ck, row, out_dir, context, vi, model_file, preset, checkpoint, overrides, bw, quiet)
            res["rows"].append(row)
            _say(format_row(row), quiet, always=True)
        ck = None                      # free its buffers before the next variant
        if not interpret:
            torch.cuda.empty_cache()
        if json_path:                  # after every variant: a run cut short keeps what it measured
            _write(res, json_path)
    res["passed"] = all(r.get("ok") for r in res["rows"]) and bool(res["rows"])
    if json_path:
        _write(res, json_path)
    return res


def _measure(ck, model, set_cache, context: int, steps: int, reps: int, device: str, warmup: int,
             interpret: bool) -> dict:
    from ..runtime.kernel import fill_kv_from

    def fresh_cache():      # the random cache up to the context, in the model and the kernel
        set_cache(context)
        fill_kv_from(ck, model)
    fresh_cache()
    logits, tok = ck.step(TOKEN, context)
    logits = logits.float().cpu()
    ms = time_steps(lambda i: ck.launch(1 + i % 50, context + 1 + i), steps, reps, device, warmup=warmup)
    chain = repeat = None
    if not interpret:
        # back to back, as timed: each launch reads the cache rows the ones before wrote (a launch that
        # overlapped its predecessor would not see them), from the same cache; twice, since the kernel is
        # deterministic: the same launches giving other logits would be a race, not rounding
        chains = []
        for _ in range(2):
            fresh_cache()
            for i in range(CHAIN):
                ck.launch(1 + i, context + 1 + i)
            chains.append((ck.logits_view.float().cpu().clone(), int(ck.buffers.OUT[0].item())))
        chain, repeat = chains[0], rel_err(chains[1][0], chains[0][0])
    # the same steps in ONE launch (no launch gap, each token fed back on the GPU); last, so that a
    # profile's stamps are of this launch's last step
    gen = [x / steps for x in time_steps(lambda i: ck.launch(1, context + 1, nsteps=steps), 1, reps, device,
                                         warmup=min(warmup, 1))]
    ck.raise_if_stuck()
    med = sorted(ms)[len(ms) // 2]
    return {"_logits": logits, "token": tok, "_chain": chain, "chain_repeat_rel_err": repeat, "ms": ms,
            "ms_median": med, "tok_per_s": 1e3 / med, "generate_ms": gen,
            "generate_ms_median": sorted(gen)[len(gen) // 2]}


def _profile(ck, row, out_dir, context, vi, model_file, preset, checkpoint, overrides, bw, quiet) -> None:
    from ..analysis.stamps import save_stamps
    from ..inspection.profiled import chrome_trace
    from ..runtime.profile import format_summary, summarize
    row["profile"] = summarize(ck)
    _say(format_summary(row["profile"]), quiet, always=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        tag = f"{context}-v{vi}" if vi else f"{context}"
        chrome_trace(ck, os.path.join(out_dir, f"trace-{tag}.json"))
        row["task_times"] = save_stamps(ck, os.path.join(out_dir, f"task-times-{tag}.npz"), model_file=model_file,
                                       preset=preset, checkpoint=checkpoint, overrides=overrides, read_bw_Bps=bw)


def format_row(r: dict) -> str:
    if "error" in r:
        where = f" context {r['context']}" if "context" in r else ""
        return f"{json.dumps(r['variant'])}{where}: FAILED {r['error']}"
    floor = f", {r['of_floor']:.1%} of floor" if r.get("of_floor") else ""
    chain = (f", after {CHAIN} launches back to back {r['chain_rel_err_vs_first_variant']:.1e}"
             if "chain_rel_err_vs_first_variant" in r else "")
    if r.get("chain_repeat_rel_err"):
        chain += f" (the same launches again: {r['chain_repeat_rel_err']:.1e}, NOT REPRODUCED: a race?)"
    vs_first = f" ({r['ms_vs_first_variant']:+.1%} vs the first variant)" if r.get("ms_vs_first_variant") else ""
    return (f"{json.dumps(r['variant'])} programs={r['num_programs']} context {r['context']}: {r['ms_median']:.3f} ms"
            f"{vs_first}, "
            f"in one launch {r['generate_ms_median']:.3f} ms ({r['tok_per_s']:.0f} tok/s{floor}), {r['tasks']} tasks; "
            f"vs eager: rel err {r['rel_err_vs_eager']:.1e}, "
            + ("same token" if r["same_token_as_eager"] else
               "other token (a near-tie)" if r["argmax_miss_vs_eager"] is None else "OTHER TOKEN")
            + (f" (against an fp32 copy: kogc {r['fp32']['kogc_rel_err']:.1e}, eager {r['fp32']['eager_rel_err']:.1e})"
               if "fp32" in r else "")
            + f"; vs first variant: rel err {r['rel_err_vs_first_variant']:.1e}{chain}"
            + ("" if r["ok"] else "  <- MISMATCH"))


def _say(msg: str, quiet: bool, always: bool = False) -> None:
    if always:
        print(msg, flush=True)
    elif not quiet:
        print(f"[sweep] {msg}", file=sys.stderr, flush=True)


def _write(res: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
