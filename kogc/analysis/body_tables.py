"""Task bodies measured where HBM idles, by model width: the speed model's (`kogc predict`) bodies for a model
given no profile of its own (`--bodies FILE`).

Each table holds, per task kind, the median body (from the end of its waits to its end, us) of a detail profile
(`kogc bench --gpus 8 --mirror --profile detail --task-times FILE`) of rank 0 of 8 with its peers mirrored: one lane
a GPU, HBM idle most of the step. A detail profile's extra stamps add 0.1-2 us a body, which stands in for costs
the model has not got (late waits); a plain profile's bodies read 9-16% short at G = 4 and 8 (docs/multi-gpu.md,
the speed model). Every model's matvec tiles are 32 KB, but a kind's prologue and attention follow the model's
hidden size and head_dim, so a table serves the models of its widths. Other widths take laneformer-2b's, the
table the model's constants were fitted with: the nearest table by widths read the one-lane ordinary decoders 11-16%
short where laneformer-2b's read them within 4.3% (docs/multi-gpu.md, where it is off).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BodyTable:
    model: str                      # the model the bodies were measured on
    widths: tuple[int, int]         # its hidden size and attention's head_dim
    source: str                     # the GPU, date, kernel and file they come from
    body_us: dict                   # task kind -> median body (us)


LANEFORMER_2B = BodyTable("laneformer-2b", (2048, 128),
                          "H200, 2026-12-03, kernel of 499908f, docs/results/2026-12-03/mirror-g8-2b-detail-499908f.npz", {
    "embed": 2.18, "matvec/rmsnorm/rope_store": 1.76, "matvec/rmsnorm/rope_cache": 1.70, "matvec/rmsnorm/cache": 1.60,
    "attention": 5.25, "matvec/attn_combine/residual": 3.39, "matvec/attn_combine/store": 6.37,
    "matvec/rmsnorm/store": 1.79, "matvec/silu_mul/store": 2.93, "matvec/silu_mul/residual": 2.46,
    "matvec/plain/store_argmax": 2.85, "residual": 1.38, "send": 3.74, "keysend": 3.46, "final_norm": 6.02,
    "combine": 4.10, "argmax": 1.73,
    # not in that profile (its output projections combine the splits): where the last split combines, the output
    # projection reads o as a plain vector, a residual matvec like W2 (whose prologue forms SiLU of 64 inputs)
    "matvec/plain/residual": 2.46,
})

LANEFORMER_05B = BodyTable("laneformer-0.5b", (1024, 64),
                           "H100, 2026-12-06, kernel of 4a90c3f, "
                           "docs/results/2026-12-06/task-times-05b-g8-detail-h100-4a90c3f.npz", {
    "embed": 0.83, "matvec/rmsnorm/rope_store": 1.79, "matvec/rmsnorm/rope_cache": 1.81, "matvec/rmsnorm/cache": 1.73,
    "attention": 3.49, "matvec/plain/residual": 2.24, "matvec/plain/store": 3.63, "matvec/rmsnorm/store": 1.57,
    "matvec/silu_mul/store": 1.63, "matvec/silu_mul/residual": 1.95, "matvec/plain/store_argmax": 3.76,
    "residual": 1.28, "send": 3.66, "keysend": 2.91, "final_norm": 5.70, "combine": 2.59, "argmax": 1.57,
})

LANEFORMER_7B = BodyTable("laneformer-7b", (4096, 128),
                          "H100, 2026-12-06, kernel of 4a90c3f, "
                          "docs/results/2026-12-06/task-times-7b-g8-detail-h100-4a90c3f.npz", {
    "embed": 2.05, "matvec/rmsnorm/rope_store": 1.89, "matvec/rmsnorm/rope_cache": 2.24, "matvec/rmsnorm/cache": 2.27,
    "attention": 4.70, "matvec/plain/residual": 1.89, "matvec/plain/store": 3.39, "matvec/rmsnorm/store": 2.53,
    "matvec/silu_mul/store": 3.07, "matvec/silu_mul/residual": 3.42, "matvec/plain/store_argmax": 3.39,
    "residual": 1.63, "send": 3.84, "keysend": 3.65, "final_norm": 11.14, "combine": 7.62, "argmax": 2.18,
})

BODY_TABLES = (LANEFORMER_2B, LANEFORMER_05B, LANEFORMER_7B)


def body_table_for(widths: tuple[int | None, int | None]) -> BodyTable:
    """The table measured at these widths (hidden size, head_dim); laneformer-2b's where none was."""
    return next((t for t in BODY_TABLES if t.widths == tuple(widths)), LANEFORMER_2B)


def bodies_of(table: BodyTable) -> dict:
    """A table's bodies, with laneformer-2b's for the kinds it lacks (its profile had no such task)."""
    return {**LANEFORMER_2B.body_us, **table.body_us}
