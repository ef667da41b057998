"""`kogc check`: kogc's kernel against the model's own eager PyTorch on the same weights.

Two checks, in one run:

- step by step: `steps` decode steps from position 0, each fed eager's token; per step the relative
  error of kogc's logits against eager's, and whether kogc picked eager's token (tie-aware: kogc.compare);
  with `fp32_ref`, both against the same weights upcast to fp32 (kogc must be no farther from it than
  eager is, with a small slack);
- generation: `generate` greedy tokens from ONE launch (`CompiledKernel.generate`), checked against
  eager decoding the same sequence (teacher forcing, tie-aware), and the same tokens from a loop of
  one-step launches (they must be equal), with both speeds.
"""
from __future__ import annotations

import copy
import sys
import time

import torch

from .compare import (FP32_SLACK, TIE_ULPS, default_max_rel_err, is_near_tie, no_farther_than_eager, rel_err,
                      tie_aware_mismatches, tie_dtype, token_miss)
from .errors import KogcError
from .runtime.distributed import ranks_on
from .runtime.kernel import stored_schedule

MEMORY_RATIO_MAX = 1.05   # GPU bytes kogc allocates over the bytes the model's buffers need ...
MEMORY_SLACK = 16 << 20   # ... plus this (the task table and counters: most of a tiny model's bytes)
DEFAULT_PROMPT = (1, 2, 3, 4)
MODEL_BUFFERS = ("W", "EMB", "KV", "ACT", "F32", "SMALL")   # what the model itself needs (not the task table)


def _progress(msg: str, quiet: bool) -> None:
    if not quiet:
        from .runtime.distributed import rank_tag
        print(f"[check{rank_tag()}] {msg}", file=sys.stderr, flush=True)


class _Phases:
    """The check's phases: each one's seconds into res["seconds"], each start told with the time so far."""

    def __init__(self, res: dict, quiet: bool):
        self.seconds = res["seconds"] = {}
        self.quiet = quiet
        self.start = self.t = time.perf_counter()
        self.phase: str | None = None

    def next(self, phase: str | None, msg: str = "") -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.seconds[self.phase] = now - self.t
        self.phase, self.t = phase, now
        if msg:
            _progress(f"{msg} ({now - self.start:.1f}s so far)", self.quiet)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reset(model) -> None:
    """The eager model's KV cache back to zeros (its own reset_cache if it has one)."""
    if callable(getattr(model, "reset_cache", None)):
        model.reset_cache()
        return
    for name, buf in model.named_buffers():
        if name.endswith("cache"):
            buf.zero_()


def run_check(model_file: str, preset: str | None, steps: int = 256, generate: int = 256,
              prompt=DEFAULT_PROMPT, fp32_ref: bool = False, seed: int = 0, checkpoint: str | None = None,
              overrides: dict | None = None, tile_config=None, interpret: bool = False,
              max_rel_err: float | None = None, quiet: bool = False, gpus: int = 1, one_gpu: bool = False,
              repeats: int = 20, weights: str = "model") -> dict:
    """Compile the model and run both checks; returns the results with "passed" and "failures".
    weights="fp8": the kernel streams FP8 weights, and eager runs the same quantized weights
    (kogc.fp8.fake_quantize_module); the kernel with the model's weights is compared too (reported)."""
    from .api import compile as kogc_compile
    from .bench.replayed import ReplayedStep
    from .frontend.model_file import build_model

    if steps < 0 or generate < 0:
        raise KogcError("--steps and --generate must be >= 0")
    if steps == 0 and generate == 0:
        raise KogcError("nothing to check: --steps and --generate are both 0")
    prompt = [int(t) for t in prompt]
    device = "cpu" if interpret else "cuda"
    res: dict = {"model_file": model_file, "preset": preset, "checkpoint": checkpoint, "seed": seed,
                 "device": "CPU (Triton interpreter)" if interpret else torch.cuda.get_device_name(),
                 "date": time.strftime("%Y-%m-%d %H:%M"), "steps": steps, "generate": generate}
    phases = _Phases(res, quiet)
    phases.next("build")
    model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
    dtype = next(model.parameters()).dtype
    ties = tie_dtype(dtype)
    limit = max_rel_err if max_rel_err is not None else default_max_rel_err(dtype)
    res.update(dtype=str(dtype).replace("torch.", ""), max_rel_err_allowed=limit, tie_ulps=TIE_ULPS,
               tie_dtype=str(ties).replace("torch.", ""))
    phases.next("compile", f"built {preset or checkpoint}; compiling")
    if not interpret:
        torch.cuda.synchronize()
        mem0 = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    ck = kogc_compile(model, interpret=interpret, tile_config=tile_config, gpus=gpus, one_gpu=one_gpu, weights=weights)
    res["gpus"], res["weights"] = gpus, weights
    if gpus > 1:
        res["ranks_on"] = ranks_on(gpus, interpret, one_gpu)
    res["compile_s"] = time.perf_counter() - t0
    phases.next("memory check")
    vocab, max_pos = ck.vocab, ck.max_pos
    if steps > max_pos:
        raise KogcError(f"--steps {steps} does not fit the KV cache of {max_pos} positions")
    if generate:
        ck.check_generate(prompt, generate, 0.0, None, None, None, None)
    failures: list[str] = []
    if not interpret:
        torch.cuda.synchronize()
        used = torch.cuda.memory_allocated() - mem0
        parts = ck.memory_bytes()
        needed = sum(parts.get(k, 0) for k in MODEL_BUFFERS)
        res.update(gpu_bytes_used=used, gpu_bytes_needed=needed, memory_ratio=used / needed)
        if used > needed * MEMORY_RATIO_MAX + MEMORY_SLACK:
            failures.append(f"memory: kogc allocated {used / needed:.3f}x the bytes its buffers need (more than "
                            f"{MEMORY_RATIO_MAX}x + {MEMORY_SLACK >> 20} MiB)")
    if weights == "fp8":
        if steps:
            phases.next("fp8 against model weights",
                        f"{steps} steps of the FP8 kernel against the kernel with the model's weights")
            full = kogc_compile(model, interpret=interpret, tile_config=tile_config)
            res["fp8_vs_model_weights"] = _against_model_weights(ck, full, steps, prompt[0])
            full = None
            ck.reset()
        from .fp8 import fake_quantize_module
        res["fake_quantized"] = len(fake_quantize_module(model, ck.ir, stored_schedule(ck).weight_format))
    ref32 = None
    phases.next("eager models")
    if fp32_ref:
        ref32 = copy.deepcopy(model).float().to(device)
        _reset(ref32)
    eager = model.to(device)
    _reset(eager)
    eager_step = ReplayedStep(eager, device, _reset)
    res["reference"] = eager_step.how
    step32 = None
    if ref32 is not None:
        step32 = ReplayedStep(ref32, device, _reset)
        res["reference_fp32"] = step32.how
    _progress(f"eager references: {eager_step.how}" + (f"; fp32: {step32.how}" if step32 else ""), quiet)
    with torch.no_grad():
        if steps:
            phases.next("steps", f"{steps} steps against eager, one launch each")
            res.update(_check_steps(ck, eager_step, step32, steps, prompt[0], ties))
            if res["max_rel_err"] > limit:
                failures.append(f"steps: max relative error {res['max_rel_err']:.2e} > {limit:.0e}")
            if res["argmax_misses"]:
                failures.append(f"steps: {len(res['argmax_misses'])} argmax misses beyond {TIE_ULPS:g} steps of "
                                f"eager's maximum")
            if ref32 is not None and not res["fp32"]["kogc_no_farther_than_eager"]:
                f = res["fp32"]
                failures.append(f"fp32 reference: kogc's mean error {f['kogc_mean_rel_err']:.2e} > eager's "
                                f"{f['eager_mean_rel_err']:.2e} (+{FP32_SLACK:.0%})")
        ref32 = step32 = None
        if generate:
            phases.next("generation", f"{generate} greedy tokens in one launch against eager and a step loop")
            _reset(eager)
            ck.reset()
            res["generation"] = g = _check_generate(ck, eager_step, prompt, generate, device, ties, interpret)
            if g["argmax_misses"]:
                failures.append(f"generation: {len(g['argmax_misses'])} tokens beyond {TIE_ULPS:g} steps of "
                                f"eager's maximum")
            if not g["step_loop_same_tokens"]:
                failures.append(f"generation: a loop of one-step launches gave other tokens than one launch (first "
                                f"difference at token {g['step_loop_first_difference']})")
        if gpus > 1:
            phases.next("ranks against one GPU", f"{gpus} ranks against the one-GPU kernel: {steps} steps, "
                        f"{generate} tokens, {repeats} repeated launches")
            ck.reset()
            # the one-GPU kernel stores the weights as the ranks do (FP8: quantized again from the fake-quantized
            # model, which gives the same codes and scales)
            single = kogc_compile(model, interpret=interpret, tile_config=tile_config, weights=weights)
            res["single_gpu"] = s = _check_against_single(ck, single, steps, generate, prompt, ties, repeats)
            if s["steps"] and s["max_rel_err"] > limit:
                failures.append(f"ranks vs one GPU: max relative error {s['max_rel_err']:.2e} > {limit:.0e}")
            if s["argmax_misses"]:
                failures.append(f"ranks vs one GPU: {s['argmax_misses']} tokens beyond {TIE_ULPS:g} steps")
            if s.get("generation_misses"):
                failures.append(f"ranks vs one GPU: {len(s['generation_misses'])} generated tokens beyond "
                                f"{TIE_ULPS:g} steps of the one-GPU kernel's maximum")
            if s["hangs"]:
                failures.append(f"ranks: {s['hangs']} of {repeats} repeated launches stopped on a stuck wait")
    phases.next(None)
    res["vocab"] = vocab
    res["failures"] = failures
    res["passed"] = not failures
    return res


def _against_model_weights(ck, full, steps: int, token: int) -> dict:
    """The FP8 kernel `ck` against the kernel `full` streaming the model's own weights, both fed the
    tokens `full` picks: relative error of the logits and top-1 agreement per step (a report of what
    FP8 changes; with random weights not a quality figure)."""
    errs, agree, tok = [], 0, token
    for pos in range(steps):
        logits, got = ck.step(tok, pos)
        ref, want = full.step(tok, pos)
        errs.append(rel_err(logits.float(), ref.float()))
        agree += int(got == want)
        tok = want
    return {"steps": steps, "max_rel_err": max(errs), "mean_rel_err": sum(errs) / steps, "top1_agreement": agree / steps}


def _check_steps(ck, eager, ref32, steps: int, token: int, ties: torch.dtype) -> dict:
    """`eager` and `ref32` (or None): step(token, pos) -> (logits, token) of the references (ReplayedStep)."""
    errs, misses, agree, near = [], [], 0, 0
    e32 = {"kogc": [], "eager": []}
    miss32 = {"kogc": 0, "eager": 0}
    tok = token
    for pos in range(steps):
        ref_logits, ref_tok = eager(tok, pos)
        logits, got = ck.step(tok, pos)
        ref = ref_logits.float().cpu()
        errs.append(rel_err(logits.float(), ref))
        agree += int(got == int(ref_tok))
        near += int(is_near_tie(ref, dtype=ties))
        m = token_miss(ref, got, TIE_ULPS, ties)
        if m is not None:
            misses.append({"step": pos, **m})
        if ref32 is not None:
            l32, _ = ref32(tok, pos)
            l32 = l32.float().cpu()
            for name, (lg, tk) in {"kogc": (logits, got), "eager": (ref_logits, int(ref_tok))}.items():
                e32[name].append(rel_err(lg.float(), l32))
                miss32[name] += int(token_miss(l32, tk, TIE_ULPS, ties) is not None)
        tok = int(ref_tok)
    out = {"max_rel_err": max(errs), "mean_rel_err": sum(errs) / len(errs), "argmax_agreement": agree / steps,
           "argmax_misses": misses, "eager_near_ties": near}
    if ref32 is not None:
        k, e = sum(e32["kogc"]) / steps, sum(e32["eager"]) / steps
        out["fp32"] = {"kogc_mean_rel_err": k, "eager_mean_rel_err": e, "kogc_argmax_misses": miss32["kogc"],
                       "eager_argmax_misses": miss32["eager"],
                       "kogc_no_farther_than_eager": no_farther_than_eager(k, e)}
    return out


def _check_generate(ck, eager, prompt: list[int], n: int, device: str, ties: torch.dtype, interpret: bool) -> dict:
    if not interpret:                      # the kernel's first compile out of the timing
        ck.generate(prompt, min(2, n))
        _sync(device)
    t0 = time.perf_counter()
    tokens = ck.generate(prompt, n)
    _sync(device)
    gen_s = time.perf_counter() - t0
    # the same tokens from one launch per token (and one host round trip each)
    for pos, t in enumerate(prompt[:-1]):
        ck.step(t, pos)
    _sync(device)
    t0 = time.perf_counter()
    tok, loop = prompt[-1], []
    for i in range(n):
        _, tok = ck.step(tok, len(prompt) - 1 + i)
        loop.append(tok)
    _sync(device)
    step_s = time.perf_counter() - t0
    rows, seq = [], prompt + tokens
    for pos in range(len(seq) - 1):        # eager decodes kogc's sequence (teacher forcing)
        logits, _ = eager(seq[pos], pos)
        if pos >= len(prompt) - 1:
            rows.append(logits.float().cpu())
    misses = tie_aware_mismatches(rows, tokens, TIE_ULPS, ties)
    exact = sum(int(torch.argmax(r)) == t for r, t in zip(rows, tokens))
    diff = next((i for i, (a, b) in enumerate(zip(tokens, loop)) if a != b), None)
    return {"tokens": len(tokens), "prompt": prompt, "equal_eager_argmax": exact, "argmax_misses": misses,
            "generate_tok_per_s": len(tokens) / gen_s, "step_loop_tok_per_s": n / step_s,
            "step_loop_same_tokens": tokens == loop, "step_loop_first_difference": diff}


def _check_against_single(ck, single, steps: int, generate: int, prompt: list[int], ties, repeats: int) -> dict:
    """The ranked kernel against the one-GPU kernel on the same weights: logits step by step (tie-aware
    tokens), one generation's tokens, and `repeats` more generations (each must finish: no stuck wait)."""
    from .runtime.kernel import KernelHangError
    errs, misses, tok = [], 0, prompt[0]
    for pos in range(steps):
        ref, ref_tok = single.step(tok, pos)
        logits, got = ck.step(tok, pos)
        errs.append(rel_err(logits.float(), ref.float()))
        misses += int(token_miss(ref.float().cpu(), got, TIE_ULPS, ties) is not None)
        tok = ref_tok
    out = {"steps": steps, "max_rel_err": max(errs, default=0.0), "argmax_misses": misses}
    if generate:
        # the ranks' generation, checked (tie-aware) against the one-GPU kernel decoding the same
        # sequence; their own generation may part from it at a near-tie (fp32 sums in another order)
        ck.reset()
        single.reset()
        a, b = ck.generate(prompt, generate), single.generate(prompt, generate)
        out["generated"] = len(a)
        out["generation_first_difference"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        single.reset()
        seq, rows = prompt + a, []
        for pos in range(len(seq) - 1):
            logits, _ = single.step(seq[pos], pos)
            if pos >= len(prompt) - 1:
                rows.append(logits.float().cpu())
        out["generation_misses"] = tie_aware_mismatches(rows, a, TIE_ULPS, ties)
    hangs = 0
    for _ in range(repeats):
        ck.reset()
        try:
            ck.generate(prompt, min(generate or 64, 64))
        except KernelHangError:
            hangs += 1
    out.update(repeats=repeats, hangs=hangs)
    return out


def format_check(res: dict) -> str:
    name = res['preset'] or res['checkpoint'] or res['model_file']
    lines = [f"{name} ({res['dtype']}) on {res['device']} ({res['date']}), compiled in {res['compile_s']:.1f}s"]
    if "memory_ratio" in res:
        lines.append(f"GPU memory: {res['gpu_bytes_used'] / 1e9:.3f} GB used for {res['gpu_bytes_needed'] / 1e9:.3f} "
                     f"GB of buffers ({res['memory_ratio']:.3f}x)")
    if res.get("reference"):
        lines.append(f"eager reference run as: {res['reference']}"
                     + (f"; the fp32 copy as: {res['reference_fp32']}" if res.get("reference_fp32") else ""))
    if res["steps"]:
        lines.append(f"steps: {res['steps']} against eager: relative error max {res['max_rel_err']:.2e} mean "
                     f"{res['mean_rel_err']:.2e} (allowed {res['max_rel_err_allowed']:.0e}); argmax equal "
                     f"{res['argmax_agreement']:.1%}, {len(res['argmax_misses'])} misses beyond "
                     f"{res['tie_ulps']:g} {res['tie_dtype']} steps; {res['eager_near_ties']} steps are near-ties "
                     f"in eager")
        for m in res["argmax_misses"][:5]:
            lines.append(f"  miss at step {m['step']}: kogc {m['kogc']}, eager {m['eager']}, "
                         f"{m['gap_ulps']:.1f} steps below eager's max")
        if "fp32" in res:
            f = res["fp32"]
            lines.append(f"fp32 reference: mean relative error kogc {f['kogc_mean_rel_err']:.2e}, eager "
                         f"{f['eager_mean_rel_err']:.2e}; argmax misses kogc {f['kogc_argmax_misses']}, eager "
                         f"{f['eager_argmax_misses']} -> kogc "
                         + ("no farther than eager" if f["kogc_no_farther_than_eager"] else "FARTHER than eager"))
    q = res.get("fp8_vs_model_weights")
    if q:
        lines.append(f"FP8 weights against the kernel with the model's weights ({q['steps']} steps, its tokens): "
                     f"relative error max {q['max_rel_err']:.2e} mean {q['mean_rel_err']:.2e}, top-1 agreement "
                     f"{q['top1_agreement']:.1%} (eager above ran the same FP8 weights)")
    g = res.get("generation")
    if g:
        lines.append(f"generation: {g['tokens']} tokens in one launch, {g['equal_eager_argmax']} equal eager's argmax, "
                     f"{len(g['argmax_misses'])} misses beyond {res['tie_ulps']:g} steps; step loop "
                     + ("same tokens" if g["step_loop_same_tokens"] else
                        f"DIFFERS from token {g['step_loop_first_difference']}")
                     + f"; generate {g['generate_tok_per_s']:.1f} tok/s, step loop "
                       f"{g['step_loop_tok_per_s']:.1f} tok/s")
    s = res.get("single_gpu")
    if s:
        lines.append(f"{res['gpus']} ranks ({res['ranks_on']}) against the one-GPU kernel: {s['steps']} steps, relative "
                     f"error max {s['max_rel_err']:.2e}, {s['argmax_misses']} token misses; generation of "
                     f"{s.get('generated', 0)} tokens: {len(s.get('generation_misses', []))} misses against the one-GPU "
                     f"kernel decoding them, "
                     + ("the same tokens as its own generation" if s.get("generation_first_difference") is None
                        else f"its own generation parts at token {s['generation_first_difference']}")
                     + f"; {s['hangs']} hangs in {s['repeats']} repeated launches")
    if res.get("seconds"):
        lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res["seconds"].items()))
    lines.append("RESULT: " + ("PASS" if res["passed"] else "FAIL: " + "; ".join(res["failures"])))
    return "\n".join(lines)
