"""Schedule -> the source of one persistent Triton kernel (jinja2 template)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import jinja2

from ..scheduler import Schedule, SchedulerError
from ..scheduler.fuse import is_pow2
from ..scheduler.tile import ESIZE, next_pow2
from ..scheduler import tasks as T
from ..scheduler.schedule import HEADER
from ..scheduler.prefetch import ARRIVE_FLAG

KERNEL_NAME = "kogc_monokernel"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined)
ARG_NAMES = SimpleNamespace(**{name[2:]: getattr(T, name) for name in dir(T) if name.startswith("A_")})


def render(schedule: Schedule, kernel_name: str = KERNEL_NAME, interpret: bool = False,
           only_variant: int | None = None) -> str:
    """interpret: the source runs under Triton's interpreter (no inline assembly there). only_variant:
    a kernel whose dispatch holds that one code variant (for inspecting its machine code alone:
    `kogc compile --per-variant`; it cannot run the schedule)."""
    cfg = schedule.tile_config
    if only_variant is not None and not 0 <= only_variant < len(schedule.variants):
        raise ValueError(f"only_variant {only_variant}: the schedule has variants 0..{len(schedule.variants) - 1}")
    dispatch = [(i, v) for i, v in enumerate(schedule.variants) if only_variant in (None, i)]
    ahead = cfg.read_ahead
    attn_prefetch = attention_prefetch_asm(schedule)     # checked even for the interpreter, which has no asm
    step_prefetch = prefetch_elements(schedule, "step_prefetch")
    barrier_prefetch = prefetch_elements(schedule, "barrier_prefetch")
    arrival_prefetch = prefetch_elements(schedule, "arrival_prefetch")
    for name, on in (("step_prefetch", step_prefetch), ("barrier_prefetch", barrier_prefetch),
                     ("arrival_prefetch", arrival_prefetch)):
        if cfg.dynamic and on:
            raise SchedulerError(f"{name} asks L2 for a program's own weight stream, which dynamic placement "
                                 f"(tasks by ticket) does not have")
    if cfg.dynamic and (cfg.read_ahead or cfg.l2_prefetch):
        raise SchedulerError("dynamic placement takes tasks by ticket: read_ahead and l2_prefetch read a "
                             "program's next queue entry, which it does not have")
    if cfg.attn_pipeline and cfg.attn_preload:
        raise SchedulerError("attn_pipeline and attn_preload both load cache rows ahead into registers: choose one")
    if cfg.parallel_waits and schedule.target.vendor == "amd":
        # Triton 3.6's AMD backend swaps the cache operations of tensor atomics with sem= (FACTS.md)
        raise SchedulerError(f"parallel_waits uses tensor atomics with acquire semantics, which Triton 3.6 "
                             f"gets wrong on {schedule.target.name}; use the default (one event at a time)")
    ll = cfg.ll_act
    if ll:
        check_flagged_layout(schedule)
    return _ENV.get_template("monokernel.py.j2").render(
        tevict=', eviction_policy="evict_last"' if cfg.cache_hints else "",
        wevict=', eviction_policy="evict_first"' if cfg.cache_hints else "",
        kvevict=', eviction_policy="evict_first"' if cfg.kv_evict_first else "",
        ll=ll, epw=4 // ESIZE[schedule.dtype], ll_store_asm="" if interpret else schedule.target.ll_store_asm,
        act_dt=TL_DTYPES[schedule.dtype], publish_some=len(schedule.published) < len(schedule.events),
        model=schedule.graph.meta.get("model", "model"), target=schedule.target.name,
        num_programs=schedule.num_programs, num_tasks=len(schedule.tasks), variants=schedule.variants,
        dispatch_variants=dispatch,
        nargs=T.NARGS, header=HEADER, A=ARG_NAMES, kernel_name=kernel_name, timer_asm=schedule.target.timer_asm,
        walign=weight_alignment(schedule), aalign=activation_alignment(schedule),
        kalign=attention_alignment(schedule), valign=vector_alignment(schedule), prefetch_asm=schedule.target.l2_prefetch_asm,
        prefetch_elems=prefetch_elements(schedule), line_elems=128 // ESIZE[schedule.dtype],
        # (checked under the interpreter too, where a prefetch, which changes no value, is left out)
        step_prefetch_elems=0 if interpret else step_prefetch, argmax_atomic=cfg.argmax_atomic,
        barrier_prefetch_elems=0 if interpret else barrier_prefetch, num_programs_const=len(schedule.queues),
        # (the table flags arrival_prefetch's tasks in their lane field whether or not the kernel prefetches)
        arrival_flag=ARRIVE_FLAG if arrival_prefetch else 0, arrival_prefetch_elems=0 if interpret else arrival_prefetch,
        token_keys=T.TOKEN_KEYS, final_norm_2d=cfg.final_norm_2d, final_norm_reload=cfg.final_norm_reload,
        table_ahead=ahead, header_ahead=cfg.header_ahead,
        wait_hdr="wn, wev, wneed, " if ahead else "",     # a task's waits read a task ahead (read_ahead)
        final_norm_lanes=next((v[2] for v in schedule.variants if v[0] == "final_norm"), 1),
        attn_preload=cfg.attn_preload, hoist=cfg.hoist_operands, attn_pipeline=cfg.attn_pipeline,
        attn_last_combines=cfg.attn_last_combines, wide_combine=cfg.wide_combine, arrive_base=len(schedule.events),
        attn_prefetch_asm="" if interpret else attn_prefetch,
        row_prefetch_asm=schedule.target.l2_prefetch_asm if ahead and not interpret else "",
        row_lines=row_lines(schedule.row_width), parallel_waits=cfg.parallel_waits,
        acquire_asm="" if interpret else schedule.target.acquire_asm, dynamic=cfg.dynamic,
        max_waits_pow2=next_pow2(max(schedule.max_waits, 2)))


def row_lines(width: int) -> int:
    """Points 32 ints (128 bytes) apart from a table row's first int, clamped to its last: one in
    every line the row touches (a power of two of them, for tl.arange)."""
    n = 1
    while (n - 1) * 32 < width - 1:
        n *= 2
    return max(n, 2)


def _pow2_divisor(values, cap: int = 16) -> int:
    """The largest power of two <= cap dividing every value."""
    a = cap
    for v in values:
        while a > 1 and v % a:
            a //= 2
    return a


_ENV.filters["pow2_divisor"] = _pow2_divisor     # e.g. a masked matvec row's alignment: [K, WALIGN]
_ENV.filters["next_pow2"] = next_pow2
TL_DTYPES = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}


def check_flagged_layout(schedule: Schedule) -> None:
    """Flagged activations pack 4 bytes of data per word: every activation region a task reads or
    writes must start and end on a word (an even element for 16-bit dtypes), or a reader would wait
    for half a word that no task writes."""
    epw = 4 // ESIZE[schedule.dtype]
    for t in schedule.tasks:
        for r in t.reads + t.writes:
            if r.arena == "act" and (r.start % epw or r.end % epw):
                raise SchedulerError(f"ll_act: task {t.id} ({t.op}) touches activation elements [{r.start}, {r.end}), "
                                     f"not whole {epw}-element words; use ll_act=False for this model")


def weight_alignment(schedule: Schedule) -> int:
    return _pow2_divisor(t.weight.numel for t in schedule.tasks if t.weight)


def activation_alignment(schedule: Schedule) -> int:
    """The common power of two of every vector offset in matvec tasks' arguments."""
    return _pow2_divisor(v for t in schedule.tasks if t.kind == "matvec"
                         for v in (t.args[T.A_X], t.args[T.A_X2], t.args[T.A_OUT], t.args[T.A_H]))


def attention_prefetch_asm(schedule: Schedule) -> str:
    """The L2 prefetch instruction attention uses before its wait (TileConfig.attn_prefetch), or ""."""
    if not schedule.tile_config.attn_prefetch:
        return ""
    if not schedule.target.l2_prefetch_asm:
        raise SchedulerError(f"attn_prefetch: target {schedule.target.name} has no prefetch instruction in kogc")
    return schedule.target.l2_prefetch_asm


STEP_PREFETCH_DEFAULT = 32 * 1024    # TileConfig.step_prefetch=None on a target that can prefetch


def prefetch_elements(schedule: Schedule, option: str = "l2_prefetch") -> int:
    """Elements of the weight stream (whole 128-byte lines) a TileConfig prefetch option asks L2 for:
    l2_prefetch (a matvec, ahead of its tile), step_prefetch or barrier_prefetch (a program, at the end of
    a step), arrival_prefetch (a program, reaching a task after an all-lane barrier)."""
    nbytes = getattr(schedule.tile_config, option)
    if nbytes is None:      # the default: where the target has the instruction
        nbytes = STEP_PREFETCH_DEFAULT if schedule.target.l2_prefetch_asm and not schedule.tile_config.dynamic else 0
    if not nbytes:
        return 0
    if not schedule.target.l2_prefetch_asm:
        raise SchedulerError(f"{option}: target {schedule.target.name} has no prefetch instruction in kogc")
    if nbytes < 128 or not is_pow2(nbytes):
        raise SchedulerError(f"{option} must be a power of two of at least 128 bytes, got {nbytes}")
    return nbytes // ESIZE[schedule.dtype]


VECTOR_KINDS = ("embed", "residual", "final_norm", "argmax")   # bodies over whole vectors (D or a block)


def vector_alignment(schedule: Schedule) -> int:
    """The common power of two of every offset the whole-vector bodies (embed, residual, final norm,
    argmax) and the residual reads (`_act_row`, also in a matvec's residual epilogue) add to a vector
    index: their bases, strides and lengths. Without it their loads were 16 bits wide (the final norm's
    16 per thread per lane vector, one after another)."""
    vals = []
    for t in schedule.tasks:
        a = t.args
        if t.kind in VECTOR_KINDS:
            vals += [a[T.A_X], a[T.A_X2], a[T.A_OUT], a[T.A_ROW0], a[T.A_H], a[T.A_TERM], a[T.A_TERM_STRIDE],
                     t.variant[1]]
            if t.kind == "final_norm":     # its part of x: first column, columns
                vals += [a[T.A_COL0], t.variant[4]]
        elif t.kind == "matvec" and t.variant[4] == "residual":
            vals += [a[T.A_H], a[T.A_TERM], a[T.A_TERM_STRIDE]]
    return _pow2_divisor(vals)


def attention_alignment(schedule: Schedule) -> int:
    """The common power of two of attention's query and cache offsets (derived, never assumed: a
    wrong hint would make misaligned wide loads)."""
    return _pow2_divisor(v for t in schedule.tasks if t.kind == "attention"
                         for v in (t.args[T.A_X], t.args[T.A_X2], t.args[T.A_CACHE]))


def signature(schedule: Schedule) -> tuple[dict[str, str], dict[str, object]]:
    """Argument types for ahead-of-time compilation (triton.compile), and the constexprs."""
    dt = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[schedule.dtype]
    act = "*i64" if schedule.tile_config.ll_act else f"*{dt}"
    sig = {"W": f"*{dt}", "WOFF": "*i64", "TABLE": "*i32", "QLEN": "*i32", "ACT": act, "F32": "*fp32",
           "KV": f"*{dt}", "SMALL": f"*{dt}", "EMB": f"*{dt}", "COS": "*fp32", "SIN": "*fp32", "CNT": "*i32",
           "ERR": "*i32", "OUT": "*i32", "PROF": "*i64", "WTASK": "*i64", "TICKET": "*i32", "token": "i32",
           "pos0": "i32", "epoch0": "i32", "limit": "i32", "nsteps": "i32", "eos": "i32", "seed": "i64", "temperature": "fp32", "top_k": "i32",
           "top_p": "fp32", "host_poll": "i32", "MAXLEN": "constexpr", "ROW": "constexpr",
           "PROFILE": "constexpr", "SAMPLE_EV": "constexpr", "FILTER": "constexpr"}
    consts = {"MAXLEN": max(len(q) for q in schedule.queues), "ROW": schedule.row_width, "PROFILE": 0,
              "SAMPLE_EV": schedule.sample_event,
              "FILTER": int(not schedule.tile_config.greedy_kernel)}   # the kernel greedy decoding runs
    return sig, consts
