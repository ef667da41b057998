"""Tasks: the units a program of the persistent kernel runs, as plain data.

A task names its variant (the code body: kind plus compile-time sizes), its table arguments (ints),
the element regions it reads and writes (from which every dependency is derived), the weight tile
it streams, and its cost in bytes.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

# Arenas: one flat buffer each. act and kv hold the model's dtype, f32 fp32 scratch, small the norm
# scales, out the sampled token. Weights are not an arena: they are packed per program.
ARENAS = ("act", "f32", "kv", "small", "out")

NARGS = 14
(A_X, A_X2, A_OUT, A_ROW0, A_CACHE, A_H, A_RES_OUT, A_TERM, A_TERM_STRIDE, A_TERM_SEL, A_EPS, A_OWN_COEF,
 A_TERM_COEF, A_SLOT) = range(NARGS)
A_KEYS = A_CACHE    # the LM head (store_argmax) and the argmax: where the step's token keys are (no cache there)
A_BIAS = A_H        # a biased matvec: its rows' bias in the small arena (never a residual epilogue: fuse)
A_ROPE = A_TERM     # RoPE (a matvec's rope epilogue, head_norm): its table's first element in COS and SIN
A_NORM_BIAS = A_TERM_COEF   # a LayerNorm's bias in the small arena (a matvec's prologue, the final norm; never a
                            # residual epilogue: fuse)
A_XIELU = (A_TERM, A_TERM_STRIDE, A_TERM_SEL, A_OWN_COEF)   # xIELU's alpha_p, alpha_n, beta and eps as fp32 bits (a
                                                            # matvec's store epilogue: no residual term)
A_WINDOW = A_TERM   # attention: its sliding window W (positions max(0, pos - W + 1)..pos; 0: 0..pos)
A_ALIBI = A_TERM_STRIDE     # attention with ALiBi: its slopes' first element in COS, and the offset c of its
A_ALIBI_AT = A_EPS          # bias slope_h * (k + c) (kogc.ir.executor.alibi_bias)
# Delayed tensor parallelism (several ranks) reuses slots the kinds involved leave free:
A_RECV = A_CACHE         # a receive buffer in the f32 arena: [2 step parities][peers][n]
A_RECV_STRIDE = A_SLOT   # a residual term's n (one peer's partial) in that buffer
A_RECV_EVENT = A_RES_OUT  # a sender's event id in its peers' counters (the same on every rank)
A_HIST = A_OUT     # the argmax: where top-k / top-p over 16-bit logits count each key's logits (f32 arena, int32
                   # each; HIST_WORDS of them, zero between draws)
A_COUNTS = A_RES_OUT   # the LM head (store_argmax): the same counts, which its tasks make as they store their logits
                       # where the kernel that filters counts there (16-bit logits)
TOKEN_KEYS = 128    # the LM head's tasks fold their (max, row) into key (task % this), int64 each in the
                    # f32 arena; one word for all 16k tasks made each one's publish queue behind the others'
                    # atomics at one L2 address (+17 us per step). Not regions: unordered by design, and the
                    # next step's folds come after the argmax clears them through the token they wait for
WAIT_SKIPPING_KINDS = ("count",)     # Task.may_skip_waits
HIST_BINS = 1 << 16     # one count per 16-bit order key (kogc/codegen/templates/sampling.j2)
HIST_WORDS = 3 * HIST_BINS + 2 * TOKEN_KEYS + 64    # the counts, then the LM head's tasks' largest and smallest keys,
                                                    # each folded into word (task % TOKEN_KEYS) like the token keys,
                                                    # then per key the largest (random number, id) of its logits (int64
                                                    # each), then the keys a deferred clear leaves (2 words, padded to
                                                    # 128 bytes). The kernel keeps two: one per step parity
MAX_STOP = 4        # token ids one generation can stop at (the kernel's scalar arguments stop0..; Llama 3.1's
                    # instruct models name 3)
SELECT_CODES = {None: 0, "own": 1, "others": 2, "all": 3}
REMOTE_BIT = 1 << 30    # a wait on event e written as e + this in the task table: a count peers raise


class Region(NamedTuple):
    """Elements [start, end) of one arena. A named tuple, not a dataclass: dependencies hash millions of
    them, and a tuple's hash is computed in C (laneformer-7b: 6.3 M hashes, 2.3 s as a dataclass)."""
    arena: str
    start: int
    end: int          # exclusive

    def overlaps(self, other: "Region") -> bool:
        return self.arena == other.arena and self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class WeightTile:
    param: str        # qualified weight name
    lane: int         # -1 for a shared weight
    row0: int
    rows: int
    cols: int
    esize: int = 2    # bytes per stored weight (1: FP8)
    scaled: bool = False    # FP8: the rows' fp32 scales follow the tile in the stream
    up: str = ""      # a gated pair's second weight: rows alternate, row0 + i of `param` then of `up`

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def where(self) -> str:
        """Which rows of which weight(s), for listings: `w1[lane 0, rows 0:8]`, a pair's `w1 + w3[rows 0:4 of each]`."""
        lane = f"lane {self.lane}, " if self.lane >= 0 else ""
        if self.up:
            return f"{self.param} + {self.up}[{lane}rows {self.row0}:{self.row0 + self.rows // 2} of each]"
        return f"{self.param}[{lane}rows {self.row0}:{self.row0 + self.rows}]"

    @property
    def stream_elems(self) -> int:
        """Stream elements the tile takes: its weights, then (FP8) its scales, each part padded to
        16 bytes so that the next tile and the scales start aligned (stream_layout)."""
        return stream_layout(self.rows, self.cols, self.esize, self.scaled)[1]

    @property
    def nbytes(self) -> int:
        """Bytes a step reads for this tile: weights and scales."""
        return self.numel * self.esize + (4 * self.rows if self.scaled else 0)


def stream_layout(rows: int, cols: int, esize: int, scaled: bool) -> tuple[int, int]:
    """(where a tile's scales start, the tile's whole length), in stream elements from the tile's start.
    Unscaled tiles are their weights alone (the model's dtype, aligned as before)."""
    if not scaled:
        return rows * cols, rows * cols
    pad = 16 // esize
    at = -(-rows * cols // pad) * pad
    return at, at + -(-4 * rows // 16) * 16 // esize


def column_parts(cols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """A matvec row's `cols` inputs as the kernel holds them, ((K1, lanes), (K2, lanes)): Triton's ranges are
    powers of two, so a width at most 9/8 of a power of two K1 (Gemma-2-2B's 2304 = 2048 + 256, SmolLM2-135M's
    576 = 512 + 64, Qwen2.5-1.5B's MLP 8960 = 8192 + 768 in 1024 lanes), which next_pow2 would hold in about
    twice its lanes, is cut into K1 and the rest K2, in next_pow2(K2) lanes (masked where K2 is not a power of
    two). The stream holds such a tile as its [rows, K1] part, then its [rows, K2] part (kogc.runtime.buffers),
    each ordered as a tile of its own width. Any other width is one part in next_pow2(K) lanes (K2 = 0): two
    parts cost a second reduction and more code, and on widths such as 1536 and 3072 (in 2048 and 4096 lanes)
    measured slower (docs/design.md). A first part must be at least 16 wide (the alignment every part keeps)."""
    k1 = 1 << (cols.bit_length() - 1)
    k2p = next_pow2(cols - k1)
    if k1 == cols or k1 < 16 or 8 * k2p > k1:
        return (cols, next_pow2(cols)), (0, 0)
    return (k1, k1), (cols - k1, k2p)


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


MAX_GROUP_COLUMNS = 64     # columns of its rows a thread may hold (and of x): laneformer-7b's 128 were slower


def row_groups(rows: int, cols: int, esize: int, target) -> int:
    """How a tile's elements are ordered in the stream for the kernel's products: in S row groups of
    one warp each (group s owning rows (rows / S) s .. + rows / S), so that every row's sum stays inside
    its warp (kogc.runtime.buffers.order_rows; the matvec's _grouped_products); or 1: rows as they are,
    loaded flat and reshaped to [rows, cols], where each thread holds a part of every row and a row
    wider than a warp's loads (16 bytes a lane) is summed across warps through shared memory, once per
    row. Grouped where the target says so (Target.warp_row_groups), the rows are wider than a warp's
    loads, a thread's share of a row is whole 16-byte loads and at most MAX_GROUP_COLUMNS, and, for
    16-bit and wider weights, the tile has 16 rows or more (fp16 8 x 2048 tiles were neutral in the probe;
    16 x 1024 and 32 x 512, laneformer-0.5b's, faster)."""
    groups = target.num_warps
    per_group = target.warp_size
    if not target.warp_row_groups or rows & (rows - 1) or cols & (cols - 1) or rows % groups:
        return 1
    if esize > 1 and rows < 16:
        return 1
    if cols <= per_group * (16 // esize) or cols // per_group > MAX_GROUP_COLUMNS:
        return 1
    return groups


@dataclass
class Exchange:
    """A sum a rank's peers send it: `value`'s partial over each peer's lanes (fp32, n elements), into
    the receive buffer `recv` of the f32 arena ([2 step parities][peers][n]), by each peer's tasks
    `sends` (task ids, the same on every rank: a sum sent in blocks has one a block), counted on the
    event `event` (filled when the rank's events are made; the same id on every rank)."""
    value: str
    recv: str
    n: int
    sends: list[int] = field(default_factory=list)
    event: int = -1


class Deps(Sequence):
    """A task's exact producers, ascending and without repeats: `shared`, a sorted list that many tasks hold
    as the same object (every residual tile of a lane reads all of its lane's MLP output: about a thousand
    producers on laneformer-7b), merged with `own`, the few sorted ids only this task adds (its row's other
    terms), none of them in `shared`. The merged list is never materialised: 114k such tiles would hold
    118M ids. Reads as a sequence of ints; the consumers that walk every task's producers (the soundness
    check, the shared lane events) take `shared` once per distinct list (`parts`)."""
    __slots__ = ("shared", "own")

    def __init__(self, shared: list[int], own: tuple[int, ...] = ()):
        self.shared, self.own = shared, own

    def __len__(self) -> int:
        return len(self.shared) + len(self.own)

    def __iter__(self) -> Iterator[int]:
        if not self.own:
            return iter(self.shared)
        return heapq.merge(self.shared, self.own)

    def __getitem__(self, i):
        if i == -1 and len(self):
            return max(self.shared[-1] if self.shared else -1, self.own[-1] if self.own else -1)
        return list(self)[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, Deps)) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Deps({list(self)})"

    def plus(self, more) -> Deps:
        """These producers and `more` (ids, in any order): the shared list kept, the others own."""
        extra = {d for d in more if not _holds(self.shared, d)}
        return Deps(self.shared, tuple(sorted(extra.union(self.own))))


def _holds(ids: list[int], d: int) -> bool:
    i = bisect.bisect_left(ids, d)
    return i < len(ids) and ids[i] == d


def parts(deps) -> tuple[list[int], tuple[int, ...]]:
    """(shared, own) of a task's producers: a Deps' two parts, or a plain list as shared with nothing own."""
    return (deps.shared, deps.own) if isinstance(deps, Deps) else (deps, ())


def as_deps(deps) -> Deps:
    """A task's producers as a Deps (a plain sorted list becomes its shared part)."""
    return deps if isinstance(deps, Deps) else Deps(sorted(deps))


@dataclass
class Task:
    id: int
    variant: tuple                  # (kind, constexpr, ...): which code body runs it
    op: str                         # the fused op (IR node name) it belongs to
    lane: int                       # -1: not lane-specific
    layer: int | None
    args: list[int]
    reads: list[Region]
    writes: list[Region]
    weight: WeightTile | None = None
    cost_bytes: int = 0
    group: int = -1                 # the event it publishes to
    waits: list[tuple[int, int]] = field(default_factory=list)   # (event, tasks needed per step)
    deps: Sequence[int] = field(default_factory=list)            # exact producers the waits must cover (Deps)
    publish_too: int = -1           # a second event it publishes to (its op's event over all lanes), -1: none

    @property
    def kind(self) -> str:
        return self.variant[0]

    @property
    def may_skip_waits(self) -> bool:
        """Its body skips its waits in a launch where it has nothing to do (a rank's count task, without a
        filtered draw), so no other task may count on them: what it waited for implies nothing to its program's
        later tasks or to its event's waiters (kogc.scheduler.deps.derive, kogc.scheduler.check)."""
        return self.kind in WAIT_SKIPPING_KINDS

    @property
    def published(self) -> tuple[int, ...]:
        """The events this task counts on: its group, and its op's event over all lanes if it has one."""
        return (self.group, self.publish_too) if self.publish_too >= 0 else (self.group,)

    @property
    def kind_key(self) -> str:
        """The kind, and for a matvec its prologue and epilogue (how profiles and costs group tasks)."""
        return self.kind if self.kind != "matvec" else f"matvec/{self.variant[3]}/{self.variant[4]}"
