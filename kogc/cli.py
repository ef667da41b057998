"""`kogc` command line. Every user error prints one line `kogc: error: ...` and exits with code 2."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from .cli_common import (OUTPUT_FILES, fail, needs_gpu, parse_floats, parse_ints, parse_tile_config, save_json,
                         use_interpreter)
from .cli_model import (TextStream, compensated_head, model_args, model_overrides, non_negative, positive, positive_int,
                        resolve_model)
from .errors import KogcError

EMITS = ("ir", "ir-json", "tasks", "schedule", "source")




def _tile_json(args) -> str | None:
    """--tile-config with --weights merged in (for the commands that take the settings as JSON: sweep's
    base of every variant, analyze's record)."""
    import json
    if getattr(args, "weights", "model") == "model":
        return args.tile_config
    try:
        fields = json.loads(args.tile_config) if args.tile_config else {}
    except json.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        return args.tile_config       # (tile_config_from_json names the error)
    return json.dumps({**fields, "weights": args.weights})


def _versions() -> str:
    """kogc's version and the two it runs on (the GPU machine has torch 2.11; Triton is pinned)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    def of(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return f"kogc {__version__} (torch {of('torch')}, triton {of('triton')})"


class _Parser(argparse.ArgumentParser):
    """argparse with kogc's one-line errors: `kogc: error: ...`, exit code 2."""

    def error(self, message):
        self.exit(2, f"kogc: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    from .cli_ranks import gpus_args
    p = _Parser(prog="kogc", description="Compile a PyTorch decoder into one persistent GPU kernel.")
    p.add_argument("--version", action="version", version=_versions())
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model file for a target",
                       description="Trace the model of MODEL_FILE, lower it, and print a stage (--emit) "
                                   "or write the kernel and its reports (--out).")
    model_args(c, None)
    c.add_argument("--target", help="h200 | h100 | mi300x (default: the GPU at hand's kind: mi300x on a ROCm "
                                    "build of PyTorch, h100 on an H100, else h200)")
    c.add_argument("--emit", choices=EMITS, help="print this stage to stdout")
    c.add_argument("--out", help="write the compiled kernel, schedule and report to this directory")
    c.add_argument("--per-variant", action="store_true",
                   help="with --out: also compile each task body (code variant) alone and write OUT/variants.txt: "
                        "registers, spills, global loads by width, barriers per variant (about 30 s for "
                        "laneformer-2b)")
    c.add_argument("--gpus", type=positive_int, default=1, metavar="G",
                   help="delayed tensor parallelism: one kernel per rank, the lanes spread over G GPUs; --out "
                        "writes OUT/rank0, OUT/rank1, ... (--emit prints rank 0's)")
    b = sub.add_parser("bench", help="time kogc's kernel against eager, CUDA graphs, torch.compile and a "
                                     "hand-written step of its shapes",
                       description="Measure, in one run on the same weights: kogc's monokernel, PyTorch eager "
                                   "(static KV cache), the whole step in one CUDA graph, torch.compile"
                                   "(max-autotune-no-cudagraphs) + one CUDA graph, and the memory floor; every "
                                   "kogc kernel's step first checked against eager on the same cache and weights "
                                   "(exit code 1 if it computed something else).")
    model_args(b, "laneformer-2b")
    b.add_argument("--context", default="1024",
                   help="tokens already in the KV cache (default 1024); with --scaling a comma-separated list")
    b.add_argument("--steps", type=positive_int, default=100, help="decode steps per timed repetition (default 100)")
    b.add_argument("--reps", type=positive_int, default=5, help="repetitions; the table shows median and spread")
    b.add_argument("--baselines", default="eager,cuda_graph,compile,cuda_graph_trim,handwritten,handwritten_compile",
                   help="comma-separated subset of eager,cuda_graph,compile,cuda_graph_trim,handwritten,"
                        "handwritten_compile ('' for none): the first four run the model as its file writes it, the "
                        "last two a hand-written step of its shapes (fused QKV and gate/up, the KV cache trimmed) in "
                        "one CUDA graph, alone and after torch.compile (the strongest rows); "
                        "cuda_graph_trim: one CUDA graph of the model with its KV cache trimmed to the positions "
                        "the bench uses (the fairer graph baseline)")
    b.add_argument("--json", help="also write the results to this file")
    b.add_argument("--profile", nargs="?", const=True, default=False, choices=["detail"], metavar="detail",
                   help="also record per-task timestamps of one kogc step and print where the time goes; "
                        "--profile detail also splits matvec bodies into operands / compute / publish and every "
                        "task's start into header / issue / wait fields / acquire")
    b.add_argument("--interpret", action="store_true",
                   help="no GPU: run kogc's kernel under Triton's interpreter (CPU figures; kogc and eager only)")
    b.add_argument("--task-times", metavar="FILE",
                   help="with --profile: also write the profiled step's per-task stamps to FILE (.npz), the input "
                        "of kogc analyze")
    gpus_args(b)
    b.add_argument("--mirror", action="store_true",
                   help="with --gpus G: rank 0 alone on this GPU with all its programs, every peer mirrored by the "
                        "rank itself (its sends land in its own buffers): one GPU's share of a G-GPU step with free "
                        "exchanges, the fastest G GPUs can run it; beside the one-GPU kernel; --profile [detail] "
                        "and --task-times apply to it")
    b.add_argument("--scaling", action="store_true",
                   help="the scaling table instead: kogc alone for every preset of --config (comma-separated) x "
                        "every context of --context, each with its floor")
    k = sub.add_parser("check", help="check kogc's kernel against eager PyTorch, step by step and as one generation",
                       description="Compile the model and compare it with eager PyTorch on the same weights: "
                                   "--steps decode steps one launch each (relative error, tie-aware argmax), and "
                                   "--generate greedy tokens from one launch against eager and against a loop of "
                                   "one-step launches. Exit code 0: passed, 1: failed.")
    model_args(k, "laneformer-2b")
    k.set_defaults(config=None)
    k.add_argument("--steps", type=int, help="decode steps compared one by one (default 256; 2 with --interpret)")
    k.add_argument("--generate", type=int, metavar="N",
                   help="greedy tokens generated in one launch and checked (default 256; 2 with --interpret; 0: skip)")
    k.add_argument("--prompt-ids", default="1,2,3,4", help="the generation's prompt (default 1,2,3,4)")
    k.add_argument("--fp32-ref", action="store_true",
                   help="also run the weights upcast to fp32: kogc must be no farther from it than eager is")
    k.add_argument("--seed", type=int, default=0, help="of the random weights (default 0)")
    k.add_argument("--max-rel-err", type=positive,
                   help="largest relative error of the logits allowed per step (default 1e-2 for a 16-bit model, "
                        "1e-4 for fp32)")
    k.add_argument("--json", help="also write the results to this file")
    k.add_argument("--interpret", action="store_true",
                   help="no GPU: run under Triton's interpreter (default preset tiny: a CPU smoke test)")
    gpus_args(k)
    w = sub.add_parser("sweep", help="time several schedule settings x contexts in one run, each checked against eager",
                       description="Compile the model once per variant (TileConfig fields, and optionally "
                                   "num_programs, num_warps, max_registers, profile), time it at every context "
                                   "(one launch per step, and all steps in one launch), and check every variant's "
                                   "logits against eager PyTorch and the first variant's. Exit code 1 if any variant "
                                   "failed or computed something else.")
    model_args(w, "laneformer-2b")
    w.add_argument("--variants", default="[{}]", metavar="JSON",
                   help='a JSON list of variants, e.g. \'[{}, {"attn_splits": 32}, {"num_programs": 264}]\' '
                        '(default [{}]: the defaults); "profile": true or "detail" adds a profile of the variant')
    w.add_argument("--context", default="1024", help="comma-separated contexts (default 1024)")
    w.add_argument("--steps", type=positive_int, default=100, help="decode steps per timed repetition (default 100)")
    w.add_argument("--reps", type=positive_int, default=3, help="repetitions (default 3)")
    w.add_argument("--json", help="write the rows to this file (after every variant)")
    w.add_argument("--out", metavar="DIR", help="where a profiled variant's task times (task-times-CONTEXT[-vI].npz, "
                                               "for kogc analyze) and trace (trace-*.json) go")
    w.add_argument("--interpret", action="store_true", help="no GPU: a smoke run under Triton's interpreter")
    w.add_argument("--gpus", type=positive_int, default=1, metavar="G",
                   help="with --mirror: the ranks of the schedule timed")
    w.add_argument("--mirror", action="store_true",
                   help="with --gpus G: every variant is rank 0 of G alone on this GPU, its peers mirrored (as kogc "
                        "bench --mirror), checked against eager on the model with its lane groups copied from rank 0's")
    m = sub.add_parser("predict", help="model the speed of delayed tensor parallelism on G GPUs (no GPU needed)",
                       description="Replay every rank's schedule together, one GPU each (kogc.analysis.stream): "
                                   "task bodies measured where HBM idles (laneformer-2b's on an H200, or --bodies "
                                   "from a profile), each GPU's HBM serving the issued tiles in order, a hop within "
                                   "a GPU and one across GPUs. A model, not a measurement; --measured-ms also "
                                   "calibrates it by a measured one-GPU step.")
    model_args(m, "laneformer-2b")
    m.add_argument("--gpus", default="1,2,4,8", help="rank counts (comma-separated; default 1,2,4,8)")
    m.add_argument("--context", type=positive_int,
                   help="positions in the KV cache the step is priced at (attention's reads; default 1024, or the "
                        "cache's length if shorter), whatever context the queues were placed for (cost_context)")
    m.add_argument("--target", default="h200", help="h200 | h100 | mi300x (default h200)")
    m.add_argument("--local-us", type=non_negative, default=0.5,
                   help="a producer's publish reaching a waiter on the same GPU (default 0.5, measured)")
    m.add_argument("--bodies", metavar="TASK_TIMES",
                   help="task bodies per kind from a profiled step (kogc bench --profile detail --task-times FILE; "
                        "best a rank whose HBM idles, e.g. --gpus 8 --mirror); default: laneformer-2b's on an H200")
    m.add_argument("--remote-us", type=non_negative, default=3.0, help="a put + flag between GPUs (default 3)")
    m.add_argument("--measured-ms", type=positive, help="the measured one-GPU ms per token (kogc bench) to calibrate by")
    m.add_argument("--json", help="also write the rows to this file")
    a = sub.add_parser("analyze", help="where a profiled step's time goes (no GPU): replay, chain, phases",
                       description="Read a profiled step's per-task stamps (kogc bench --profile --task-times FILE, "
                                   "or kogc sweep with a profiled variant and --out), build the same schedule again "
                                   "and print: replay: the profile summary and the step replayed as scheduled, as "
                                   "the dependency chain alone and perfectly balanced; chain: what the chain is made "
                                   "of per task kind; phases: where a lane's layer spends its time.")
    a.add_argument("analysis", choices=("replay", "chain", "phases"), help="replay | chain | phases")
    a.add_argument("task_times", metavar="TASK_TIMES", help="a task-times file (.npz)")
    a.add_argument("model_file", nargs="?",
                   help="the model file (default: the file's own record, else examples/laneformer.py)")
    a.add_argument("--config", help="preset (default: the file's record, else laneformer-2b)")
    a.add_argument("--checkpoint", help="a checkpoint directory instead of a preset")
    a.add_argument("--lanes", type=positive_int, help="override the preset's num_lanes")
    a.add_argument("--tile-config", metavar="JSON", help="the TileConfig fields the kernel was compiled with "
                                                         "(default: the file's record)")
    a.add_argument("--target", help="h200 | mi300x (default: the file's record, else h200)")
    a.add_argument("--programs", type=int, help="the persistent grid (default: the file's record, else the target's)")
    a.add_argument("--latency-us", default="1.0",
                   help="publish-to-acquire latency per hop in the replays (comma-separated for several; chain: "
                        "the first; default 1.0)")
    a.add_argument("--first-layers", type=int, default=0, metavar="N",
                   help="phases: also the step's first N layers with all lanes together, the weight rate per 5 us "
                        "and the step's tail")
    a.add_argument("--place-with", metavar="JSON",
                   help="replay: also the same tasks placed with these TileConfig fields over the profiled ones "
                        "(e.g. '{\"place_latency_us\": 2.0}'), replayed with the profile's measured times: a "
                        "placement ranked without a GPU; a JSON list of such objects replays each and ranks them")
    a.add_argument("--attention-scale", metavar="F[,F...]",
                   help="replay --place-with: the two placements also with attention's bodies times each F (a "
                        "longer context: its splits read more of the cache; the queues serve every context), "
                        "e.g. 2,3")
    a.add_argument("--remote-us", metavar="US[,US...]",
                   help="replay of a mirrored rank's profile (kogc bench --gpus G --mirror): also with every wait on "
                        "a peer's sum taking these latencies (a hop across GPUs), e.g. 1,3,5")
    a.add_argument("--scale-bodies", type=float, metavar="F",
                   help="replay: also with one task kind's bodies scaled by F at a time (e.g. 0.5), the rest as "
                        "measured: which kinds' bodies the step waits for")
    a.add_argument("--json", help="also write the results to this file")
    n = sub.add_parser("inspect", help="what the compiler made and where the time went (no GPU): summary, a "
                                       "task, a queue, a layer's graph, a profile's timeline, trace and roofline",
                       description="Inspect a build folder (kogc compile ... --out DIR): tasks per kind, bytes and "
                                   "predicted time per program, the dependency chain per layer, registers and spills; "
                                   "--task, --program, --layer (--graph) for one of each. With --profile FILE (kogc "
                                   "bench --profile --task-times FILE): a roofline table per kind, --png a timeline, "
                                   "--trace a Perfetto trace. --diff A B: two builds or two profiles side by side. "
                                   "Figures need matplotlib: pip install 'kogc[inspect]'. See docs/inspect.md.")
    n.add_argument("build", nargs="?", metavar="BUILD_DIR", help="a folder written by kogc compile ... --out DIR")
    n.add_argument("--profile", metavar="FILE",
                   help="a task-times file (.npz) of this build's schedule (without BUILD_DIR: the schedule its "
                        "record names is built again)")
    n.add_argument("--task", type=int, metavar="N", help="decode task N: kind, op, source line, weight tile, waits, "
                                                         "the tasks it feeds")
    n.add_argument("--program", type=int, metavar="P", help="print program P's queue, one task per line")
    n.add_argument("--layer", type=int, metavar="I", help="layer I's groups (fused op, lane) and its chain")
    n.add_argument("--graph", metavar="OUT", help="with --layer: write its task graph: .svg/.png/.pdf (matplotlib) or "
                                                  ".dot (Graphviz text)")
    n.add_argument("--png", metavar="OUT", help="with --profile: the timeline, one row per program")
    n.add_argument("--trace", metavar="OUT", help="with --profile: a Chrome/Perfetto trace (JSON), one track per "
                                                  "program")
    n.add_argument("--programs", metavar="A:B", help="the PNG's and the trace's programs A..B-1 (default: all)")
    n.add_argument("--window", metavar="T0:T1", help="the PNG's and the trace's time window, us (default: the step)")
    n.add_argument("--width", type=int, default=2400, help="the PNG's width in pixels (default 2400)")
    n.add_argument("--row-px", type=float, default=6, help="the PNG's pixels per program row (default 6)")
    n.add_argument("--bandwidth", type=float, metavar="TBPS",
                   help="the roofline's floor bandwidth in TB/s, e.g. a measured 4.05 (default: the target's "
                        "hbm_read_bw)")
    n.add_argument("--context", type=int, metavar="N",
                   help="the roofline's attention bytes at N positions (the profile's context; default: the cost "
                        "model's)")
    n.add_argument("--kind-us", metavar="JSON|FILE",
                   help="the cost model's task times (us per kind) for a build, whose schedule.json does not record "
                        "them, e.g. examples/profiles/laneformer-2b.h200.json (default: the bytes model)")
    n.add_argument("--diff", nargs=2, metavar=("A", "B"), help="two build folders or two task-times files side by "
                                                               "side, with the difference B - A")
    r = sub.add_parser("run", help="generate tokens in one kernel launch and stream them",
                       description="Compile the model, prefill the prompt, then generate up to N tokens in ONE "
                                   "kernel launch (sampling and the EOS test on the device), printing tokens as "
                                   "they arrive, then tokens/s and time to first token.")
    model_args(r, "laneformer-2b")
    prompt = r.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    prompt.add_argument("--prompt", metavar="TEXT",
                        help="text, for a transformers model (--model-dir): tokenized with its tokenizer, its chat "
                             "template applied (unless --raw), the answer decoded and streamed as text; stops at "
                             "its EOS tokens")
    r.add_argument("--raw", action="store_true", help="with --prompt: no chat template")
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    r.add_argument("--top-k", type=int)
    r.add_argument("--top-p", type=float)
    r.add_argument("--seed", type=int, help="for sampling (default: drawn at random and printed)")
    r.add_argument("--eos-id", type=int, nargs="+", metavar="ID",
                   help="stop after any of these tokens (up to 4; default with --prompt: the tokenizer's EOS and "
                        "those the model's generation_config.json names)")
    r.add_argument("--interpret", action="store_true", help="no GPU: run under Triton's interpreter (slow)")
    r.add_argument("--compensate-head", action="store_true",
                   help="with --weights fp8 and a transformers model with its tokenizer: the LM head's FP8 rounding "
                        "compensated over the model's own greedy answers to eight prompts (kogc.fp8.compensate_head; "
                        "SmolLM2-135M-Instruct: perplexity +1.62%% against +2.40%% plain; about 2 minutes of "
                        "generation on a CPU for that model)")
    r.add_argument("--profile", metavar="FILE",
                   help="record every task's start, end of waits and end (GPU timers) and write the generation's "
                        "last step to FILE (.npz), for kogc inspect --profile and kogc analyze")
    gpus_args(r)
    return p
















def cmd_bench(args) -> int:
    if args.mirror and args.gpus < 2:
        return fail("--mirror runs rank 0 of G ranks: give --gpus G with G >= 2")
    if args.mirror and args.one_gpu:
        return fail("--mirror runs rank 0 alone, --one-gpu every rank side by side: give one of them")
    # the arguments first, so that a bad one is named on a machine without a GPU too
    contexts = parse_ints(args.context, "--context")
    presets = [x for x in (args.config or "").split(",") if x]
    overrides = model_overrides(args)
    tile_config = parse_tile_config(_tile_json(args) if args.scaling else args.tile_config)
    from .bench import ALL_BASELINES
    baselines = [b for b in args.baselines.split(",") if b]
    bad = [b for b in baselines if b not in ALL_BASELINES]
    if bad:
        return fail(f"unknown baseline {bad[0]!r}; known: {', '.join(ALL_BASELINES)}")
    refused = needs_gpu(args, "kogc bench measures on a CUDA GPU (use --interpret for CPU figures of kogc and eager "
                              "on a small preset)")
    if refused is not None:
        return refused
    if args.scaling:
        if args.profile or args.task_times:
            return fail("--scaling times kogc alone: --profile and --task-times do not apply")
        from .bench.scaling import format_scaling, run_scaling
        save = (lambda res: save_json(res, args.json, quiet=True)) if args.json else None
        res = run_scaling(args.model_file, [None] if args.checkpoint or not presets else presets, contexts,
                          steps=args.steps, reps=args.reps, interpret=args.interpret, checkpoint=args.checkpoint,
                          overrides=overrides, tile_config=tile_config, on_row=save)
        print(format_scaling(res))
        if args.json:
            save_json(res, args.json)
        return 0 if res["passed"] else 1
    if len(contexts) > 1 or len(presets) > 1:
        return fail("several presets or contexts are the scaling table: add --scaling")
    preset = presets[0] if presets and not args.checkpoint else None    # None: the model file's or directory's own
    if args.gpus != 1:
        from .cli_ranks import bench_ranks
        return bench_ranks(args, preset, contexts[0], overrides)
    if args.task_times and (not args.profile or args.interpret):
        return fail("--task-times writes the stamps of a profiled step: it needs --profile (on a GPU)")
    from .bench import format_table, run_bench, write_json
    try:
        res = run_bench(args.model_file, preset, context=contexts[0],
                        steps=args.steps, reps=args.reps, baselines=baselines, interpret=args.interpret,
                        profile=args.profile, checkpoint=args.checkpoint, overrides=overrides,
                        kogc_options={"tile_config": tile_config, "weights": args.weights},
                        task_times=args.task_times)
    except ValueError as e:
        return fail(str(e))
    print(format_table(res))
    if args.json:
        write_json(res, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if res["passed"] else 1      # a kernel that computed something else: its times are no result


def _ranks_started(args) -> bool:
    """--gpus G: whether G processes were started for this command (kogc.cli_ranks.start_ranks)."""
    from .cli_ranks import start_ranks
    return start_ranks(args) is not None


def _cmd_predict(args) -> int:
    from .cli_ranks import cmd_predict
    return cmd_predict(args)


def cmd_check(args) -> int:
    prompt = parse_ints(args.prompt_ids, "--prompt-ids")      # (bad arguments named before the GPU check)
    tile_config = parse_tile_config(args.tile_config)
    refused = needs_gpu(args, "kogc check runs the kernel on a CUDA GPU (use --interpret for a CPU smoke test on "
                              "the tiny preset)")
    if refused is not None:
        return refused
    from .check import format_check, run_check
    if args.gpus != 1 and _ranks_started(args):
        return 0
    default = 2 if args.interpret else 256
    from .frontend.model_file import is_transformers_dir
    preset = None if args.checkpoint or is_transformers_dir(args.model_file) else \
        (args.config or ("tiny" if args.interpret else "laneformer-2b"))
    res = run_check(args.model_file, preset, steps=default if args.steps is None else args.steps,
                    generate=default if args.generate is None else args.generate, prompt=prompt,
                    fp32_ref=args.fp32_ref, seed=args.seed, checkpoint=args.checkpoint,
                    overrides=model_overrides(args), tile_config=tile_config, interpret=args.interpret,
                    max_rel_err=args.max_rel_err, gpus=args.gpus, one_gpu=args.one_gpu, weights=args.weights)
    print(format_check(res))
    if args.json:
        save_json(res, args.json)
    return 0 if res["passed"] else 1


def cmd_sweep(args) -> int:
    if (args.gpus != 1) != args.mirror:
        return fail("kogc sweep times one kernel: --gpus G (G >= 2) goes with --mirror (rank 0 of G, its peers "
                    "mirrored); several GPUs are timed by kogc bench --gpus G")
    from .bench.sweep import parse_variants, run_sweep
    contexts = parse_ints(args.context, "--context")          # (bad arguments named before the GPU check)
    parse_variants(args.variants, args.interpret, _tile_json(args))
    refused = needs_gpu(args, "kogc sweep times on a CUDA GPU (use --interpret for a smoke run on a small preset)")
    if refused is not None:
        return refused
    res = run_sweep(args.model_file, None if args.checkpoint else args.config, args.variants, contexts,
                    steps=args.steps, reps=args.reps, interpret=args.interpret, checkpoint=args.checkpoint,
                    overrides=model_overrides(args), out_dir=args.out, json_path=args.json,
                    tile_config=_tile_json(args), mirror_of=args.gpus if args.mirror else 0)
    if args.json:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if res["passed"] else 1


def cmd_analyze(args) -> int:
    from .analysis import analyze
    if args.first_layers < 0 or (args.programs is not None and args.programs < 1):
        return fail("--first-layers must be >= 0 and --programs >= 1")
    res, text = analyze(args.analysis, args.task_times, latencies=parse_floats(args.latency_us, "--latency-us"),
                        first_layers_n=args.first_layers, model_file=args.model_file, preset=args.config,
                        checkpoint=args.checkpoint, lanes=args.lanes, tile_config=_tile_json(args),
                        target=args.target, num_programs=args.programs, place_with=args.place_with,
                        remote_us=parse_floats(args.remote_us, "--remote-us") if args.remote_us else (),
                        body_scale=args.scale_bodies,
                        attention_scales=parse_floats(args.attention_scale, "--attention-scale")
                        if args.attention_scale else ())
    print(text)
    if args.json:
        save_json(res, args.json)
    return 0




def cmd_inspect(args) -> int:
    from .inspection.command import run
    return run(args)


def cmd_run(args) -> int:
    import torch

    from .request import check_request
    text = None
    if args.prompt is not None:     # text: tokenized by the model's own tokenizer (CPU, no weights loaded)
        text = TextStream(args)
        prompt = text.ids
        args.eos_id = (text.eos or None) if args.eos_id is None else args.eos_id
    else:
        try:
            prompt = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            return fail(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}")
    # what the model does not decide is refused before it is built and compiled or a GPU is asked for
    check_request(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.eos_id)
    refused = needs_gpu(args, "kogc run needs a CUDA GPU (use --interpret to run a small preset on the CPU)")
    if refused is not None:
        return refused
    from .api import compile as kogc_compile
    from .frontend.model_file import build_model
    if args.compensate_head and args.weights != "fp8":
        return fail("--compensate-head compensates FP8 rounding: give it with --weights fp8")
    if args.profile and (args.interpret or args.gpus != 1):
        return fail("--profile records GPU timers of one kernel: not with --interpret or --gpus")
    if args.gpus != 1 and _ranks_started(args):
        return 0
    from .runtime.distributed import rank_tag
    run = f"[run{rank_tag()}]"      # each rank of several tells its own progress
    t0 = time.perf_counter()
    overrides = model_overrides(args)
    model = build_model(args.model_file, preset=None if args.checkpoint else args.config, checkpoint=args.checkpoint,
                        **overrides)
    print(f"{run} built {args.checkpoint or args.config or args.model_file} ({time.perf_counter() - t0:.1f}s); "
          "compiling", file=sys.stderr)
    weights = args.weights
    if args.compensate_head:
        weights = compensated_head(args, model, text.tok if text is not None else None)
        print(f"{run} LM head compensated over calibration text ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    ck = kogc_compile(model, interpret=args.interpret, tile_config=parse_tile_config(args.tile_config), gpus=args.gpus,
                      one_gpu=args.one_gpu, profile=bool(args.profile), weights=weights)
    ck.check_generate(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.eos_id)
    if not args.interpret:   # keep one-time work out of the timings: the kernel's first compile (the prefill's
        # greedy variant and the one the sampling settings launch), the step-closure proof (a walk over every task)
        # and the pinned token buffer
        ck.generate(prompt[:2], 1, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    on_token=lambda t: None)
        torch.cuda.synchronize()
    print(f"{run} compiled in {time.perf_counter() - t0:.1f}s; generating", file=sys.stderr)
    arrivals = []
    start = time.perf_counter()

    def on_token(tok):
        arrivals.append(time.perf_counter())
        if text is not None:
            text.add(tok)
        else:
            print(tok, end=" ", flush=True)

    def on_prefill(done, total):     # under the interpreter a launch takes seconds: say where it is
        step = (time.perf_counter() - start) / done
        print(f"{run} prefill {done}/{total} ({step:.1f} s a launch under the interpreter)", file=sys.stderr,
              flush=True)

    tokens = ck.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, eos_token_id=args.eos_id, on_token=on_token,
                         on_prefill=on_prefill if args.interpret else None)
    end = time.perf_counter()
    print()
    seed = f", seed {ck.last_seed}" if args.temperature > 0 else ""
    stop = " (stopped at EOS)" if tokens and tokens[-1] in (args.eos_id or ()) else ""
    if not arrivals and tokens:     # a rank other than 0 (its tokens are rank 0's, which prints them)
        return 0
    if args.profile:
        from .analysis.stamps import save_stamps
        path = save_stamps(ck, args.profile, model_file=args.model_file, preset=args.config,
                           checkpoint=args.checkpoint, overrides=overrides)
        print(f"{run} wrote the last step's task stamps to {path} (kogc inspect --profile, kogc analyze)",
              file=sys.stderr)
    if args.interpret:
        print(f"{len(tokens)} tokens{stop} in {end - start:.1f} s with the prefill: {len(tokens) / (end - start):.2f} "
              f"tok/s [CPU interpreter]{seed}")
    else:
        rate = (len(tokens) - 1) / (end - arrivals[0]) if len(tokens) > 1 else float("nan")
        print(f"{len(tokens)} tokens{stop}; time to first token {(arrivals[0] - start) * 1e3:.1f} ms (prefill of "
              f"{len(prompt) - 1} launches + 1 step), then {rate:.1f} tok/s{seed}")
    return 0


def _check_outputs(args) -> None:
    """Every file a command will write can be: its folder exists and is writable, and it is not a folder
    itself; --out, a folder, can be made or written in. Checked before the work, so that a long GPU run does not end
    in an unwritable path."""
    for name in OUTPUT_FILES:
        path = getattr(args, name, None)
        if not isinstance(path, str) or not path:
            continue
        where = os.path.dirname(os.path.abspath(path))
        flag = "--" + name.replace("_", "-")
        if os.path.isdir(path):
            raise KogcError(f"{flag} {path}: a folder is there, not a file")
        if not os.path.isdir(where):
            raise KogcError(f"{flag} {path}: no folder {where}")
        writable(where, f"{flag} {path}")
    out = getattr(args, "out", None)          # a folder a command writes into (compile's build, sweep's stamps)
    if isinstance(out, str) and out:
        if os.path.exists(out) and not os.path.isdir(out):
            raise KogcError(f"--out {out}: a file is there, not a folder")
        made = os.path.abspath(out)           # it, or the folder it will be made in
        while not os.path.isdir(made) and os.path.dirname(made) != made:
            if os.path.exists(made):
                raise KogcError(f"--out {out}: {made} is a file, not a folder")
            made = os.path.dirname(made)
        writable(made, f"--out {out}")


def writable(folder: str, what: str) -> None:
    """A KogcError naming `what` unless a file can be made in `folder` (a probe file, not os.access: root
    passes that check on read-only mounts)."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise KogcError(f"{what}: cannot write in {folder} ({e.strerror})") from None


def main(argv: list[str] | None = None) -> int:
    from .scheduler import SchedulerError
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:          # --help (0) or a usage error (2, its line already printed)
        return e.code if isinstance(e.code, int) else 2
    args.argv = list(sys.argv[1:] if argv is None else argv)     # (--gpus G starts G processes with these)
    use_interpreter(args)
    from .cli_compile import cmd_compile
    try:
        _check_outputs(args)
        resolve_model(args)
        return {"compile": cmd_compile, "bench": cmd_bench, "run": cmd_run, "check": cmd_check, "sweep": cmd_sweep,
                "analyze": cmd_analyze, "inspect": cmd_inspect, "predict": _cmd_predict}[args.command](args)
    except (KogcError, SchedulerError) as e:   # the scheduler's refusals (sizes, settings) are user errors too
        return fail(str(e))
    except BrokenPipeError:  # `kogc compile ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
