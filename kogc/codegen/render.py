"""Schedule -> the source of one persistent Triton kernel (jinja2 template)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import jinja2

from ..fp8 import TRITON_TYPES
from ..scheduler import Schedule
from ..scheduler.errors import SchedulerError
from ..scheduler.config import ESIZE
from ..scheduler.tasks import column_parts, next_pow2, row_groups, stream_layout
from ..scheduler.tile import heads_per_combine
from ..scheduler import tasks as T

KERNEL_NAME = "kogc_monokernel"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined)
ARG_NAMES = SimpleNamespace(**{name[2:]: getattr(T, name) for name in dir(T) if name.startswith("A_")})


def render(schedule: Schedule, kernel_name: str = KERNEL_NAME, interpret: bool = False,
           only_variant: int | tuple[int, ...] | None = None) -> str:
    """interpret: the source runs under Triton's interpreter (no inline assembly there). only_variant:
    a kernel whose dispatch holds that code variant (or those) alone (for inspecting its machine code:
    `kogc compile --per-variant`, the tests of the machine code; it cannot run the schedule)."""
    only = None if only_variant is None else {only_variant} if isinstance(only_variant, int) else set(only_variant)
    if only is not None and not all(0 <= i < len(schedule.variants) for i in only):
        raise ValueError(f"only_variant {only_variant}: the schedule has variants 0..{len(schedule.variants) - 1}")
    dispatch = [(i, v) for i, v in enumerate(schedule.variants) if only is None or i in only]
    return _ENV.get_template("monokernel.py.j2").render(
        act_dt=TL_DTYPES[schedule.dtype], publish_some=len(schedule.published) < len(schedule.events),
        model=schedule.graph.meta.get("model", "model"), target=schedule.target.name,
        num_programs=schedule.num_programs, num_tasks=len(schedule.tasks), variants=schedule.variants,
        dispatch_variants=dispatch,
        nargs=T.NARGS, header=schedule.header, publish_twice=schedule.publishes_twice, A=ARG_NAMES,
        kernel_name=kernel_name, timer_asm=schedule.target.timer_asm,
        walign=weight_alignment(schedule), aalign=activation_alignment(schedule),
        kalign=attention_alignment(schedule), valign=vector_alignment(schedule),
        ralign=residual_alignment(schedule), halign=head_norm_alignment(schedule),
        prefetch_asm=schedule.target.l2_prefetch_asm, line_elems=128 // schedule.weight_esize,
        scaled=int(schedule.tile_config.weights == "fp8"), esize=schedule.weight_esize,
        # (a prefetch changes no value: left out under the interpreter, which has no inline assembly)
        step_prefetch_elems=0 if interpret else step_prefetch_elements(schedule), token_keys=T.TOKEN_KEYS, max_stop=T.MAX_STOP,
        hist_bins=T.HIST_BINS, hist_words=T.HIST_WORDS,
        # the LM head's tasks count their logits per 16-bit key for top-k / top-p (a rank's its shard, its
        # count tasks its peers' shards as they arrive; fp32 logits are searched)
        count_logits=ESIZE[schedule.dtype] == 2,
        attn_prefetch=bool(schedule.target.l2_prefetch_asm) and not interpret,
        # Triton 3.6's interpreter multiplies bf16 matrices wrongly (tl.dot: errors of 1e10): there its
        # operands are widened to fp32 first, which changes no product (bf16 x bf16 is exact in fp32)
        widen_dot=interpret and schedule.dtype == "bfloat16",
        attn_window=any(op.p.get("window") for op in schedule.ops if op.kind == "attention"),
        attn_softcap=model_constant(schedule, "attention", "softcap"),
        logit_softcap=model_constant(schedule, "matvec", "softcap"),
        kv_line=128 // ESIZE[schedule.dtype],        # KV-cache elements per 128-byte line (the activations' dtype)
        run_vids={i for i, v in enumerate(schedule.variants) if v in schedule.run_variants},
        npeer=schedule.ranks - 1, remote_bit=T.REMOTE_BIT,
        release_fence_asm="" if interpret else schedule.target.release_fence_asm,
        release_fence_sys_asm=schedule.target.release_fence_sys_asm,
        volatile_loads=schedule.target.volatile_loads, target_desc=schedule.target,
        threads=schedule.target.num_warps * schedule.target.warp_size)


def model_constant(schedule: Schedule, kind: str, key: str) -> float:
    """A fused-op parameter that is one constant for the whole model, rendered into the kernel (a soft cap:
    Gemma 2's on every layer's attention scores, and on the logits): 0.0 where no op of the kind has it."""
    values = {op.p.get(key, 0.0) for op in schedule.ops if op.kind == kind} - {0.0}
    if len(values) > 1:
        raise SchedulerError(f"{kind} ops with different {key} values {sorted(values)}: kogc renders one per model")
    return values.pop() if values else 0.0


def _pow2_divisor(values, cap: int = 16) -> int:
    """The largest power of two <= cap dividing every value."""
    a = cap
    for v in values:
        while a > 1 and v % a:
            a //= 2
    return a


_ENV.filters["pow2_divisor"] = _pow2_divisor     # e.g. a masked matvec row's alignment: [K, WALIGN]
_ENV.filters["next_pow2"] = next_pow2
_ENV.filters["heads_per_combine"] = lambda v: heads_per_combine(v[1], v[2])     # an attention variant's
# a matvec variant's tile in the weight stream: (where its scales start, its length), from (R, K, esize, scaled)
_ENV.filters["stream_layout"] = lambda v, esize, scaled: stream_layout(v[1], v[2], esize, bool(scaled))


def matvec_parts(v, esize: int, target, walign: int) -> str:
    """A matvec variant's input parts as the kernel's constexprs (kogc.scheduler.tasks.column_parts): each
    part's width, lanes, row alignment in the stream (for a masked part's rows) and row groups."""
    R, K = v[1], v[2]
    (k1, p1), (k2, p2) = column_parts(K)
    return (f"K1={k1}, KP1={p1}, KA1={_pow2_divisor([k1, walign])}, GROUPS1={row_groups(R, k1, esize, target)}, "
            f"K2={k2}, KP2={p2}, KA2={_pow2_divisor([k2 or 1, walign])}, GROUPS2={row_groups(R, k2, esize, target) if k2 else 1}")


_ENV.filters["matvec_parts"] = matvec_parts
TL_DTYPES = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}


def weight_alignment(schedule: Schedule) -> int:
    return _pow2_divisor(t.weight.stream_elems for t in schedule.tasks if t.weight)


def activation_alignment(schedule: Schedule) -> int:
    """The common power of two of the input vectors' offsets in matvec tasks' arguments (`_vec`; the
    attention partials' base). Outputs and residual rows start at a task's first row and have their own
    (`residual_alignment`): with 2-row tiles (Llama-3.2-1B's W2) they would make every input load 32 bits."""
    return _pow2_divisor(v for t in schedule.tasks if t.kind == "matvec" for v in (t.args[T.A_X], t.args[T.A_X2]))


def residual_alignment(schedule: Schedule) -> int:
    """The common power of two of the offsets a matvec's residual epilogue reads (h and the extra term
    at its first row, the term's lane stride, the peers' sums)."""
    return _pow2_divisor(t.args[i] for t in schedule.tasks if t.kind == "matvec" and t.variant[4] == "residual"
                         for i in (T.A_H, T.A_TERM, T.A_TERM_STRIDE, T.A_RECV, T.A_RECV_STRIDE))


def head_norm_alignment(schedule: Schedule) -> int:
    """The common power of two of the norms per head's offsets: the stored q or k, the tiled scale, and
    where the result goes (activations or the KV cache; heads are head_dim apart, a power of two)."""
    return _pow2_divisor(v for t in schedule.tasks if t.kind == "head_norm"
                         for v in (t.args[T.A_X], t.args[T.A_X2], t.args[T.A_OUT] if t.variant[3] == 0 else t.args[T.A_CACHE],
                                   t.variant[2]))


STEP_PREFETCH_BYTES = 32 * 1024    # of its weight stream each program asks L2 for at a step's end


def step_prefetch_elements(schedule: Schedule) -> int:
    """Elements of the next step's weight stream a program asks L2 for at the end of a step (whole
    128-byte lines), on a target with a prefetch instruction; 0 elsewhere."""
    return STEP_PREFETCH_BYTES // schedule.weight_esize if schedule.target.l2_prefetch_asm else 0


VECTOR_KINDS = ("embed", "residual", "normed_residual", "final_norm", "argmax", "send")   # bodies over whole vectors (D or a block)


def vector_alignment(schedule: Schedule) -> int:
    """The common power of two of every offset the whole-vector bodies (embed, residual, normed residual,
    final norm, argmax, send) add to a vector index: their bases, strides and lengths. Without it their loads were
    16 bits wide (the final norm's 16 per thread per lane vector, one after another)."""
    vals = []
    for t in schedule.tasks:
        a = t.args
        if t.kind in VECTOR_KINDS:
            vals += [a[T.A_X], a[T.A_X2], a[T.A_OUT], a[T.A_ROW0], a[T.A_H], a[T.A_TERM], a[T.A_TERM_STRIDE],
                     t.variant[1]]
            if t.kind == "residual":        # a term's peers' sums (0 on one GPU)
                vals += [a[T.A_RECV], a[T.A_RECV_STRIDE]]
    return _pow2_divisor(vals)


def attention_alignment(schedule: Schedule) -> int:
    """The common power of two of attention's query and cache offsets (derived, never assumed: a
    wrong hint would make misaligned wide loads)."""
    return _pow2_divisor(v for t in schedule.tasks if t.kind == "attention"
                         for v in (t.args[T.A_X], t.args[T.A_X2], t.args[T.A_CACHE]))


def signature(schedule: Schedule) -> tuple[dict[str, str], dict[str, object]]:
    """Argument types for ahead-of-time compilation (triton.compile), and the constexprs."""
    dt = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[schedule.dtype]
    wdt = TRITON_TYPES.get(schedule.weight_format, dt)     # FP8 weights: fp8e4nv (NVIDIA) or fp8e4b8 (gfx942)
    sig = {"W": f"*{wdt}", "WOFF": "*i64", "TABLE": "*i32", "QLEN": "*i32", "ACT": f"*{dt}", "F32": "*fp32",
           "KV": f"*{dt}", "SMALL": f"*{dt}", "EMB": f"*{dt}", "COS": "*fp32", "SIN": "*fp32", "CNT": "*i32",
           "ERR": "*i32", "OUT": "*i32", "PROF": "*i64", "PEERS": "*i64",
           "token": "i32",
           "pos0": "i32", "epoch0": "i32", "limit": "i32", "nsteps": "i32",
           **{f"stop{i}": "i32" for i in range(T.MAX_STOP)}, "seed": "i64", "temperature": "fp32", "top_k": "i32",
           "top_p": "fp32", "host_poll": "i32", "step0": "i32", "MAXLEN": "constexpr", "ROW": "constexpr",
           "PROFILE": "constexpr", "SAMPLE_EV": "constexpr", "FILTER": "constexpr"}
    consts = {"MAXLEN": max(len(q) for q in schedule.queues), "ROW": schedule.row_width, "PROFILE": 0,
              "SAMPLE_EV": schedule.sample_event,
              "FILTER": 0}   # the kernel greedy and plain-temperature decoding run (no top-k / top-p code)
    return sig, consts
