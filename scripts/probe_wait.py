"""What does a wait cost when its count is already there? In the monokernel's profile (eighth
session) a task whose producers had ended before it started still spent 1.4-1.5 us between its
start and its body when it had a wait, 0.2-0.3 us when it had none. This probe runs that case alone:
every program runs `--tasks` tasks in a row, each streaming one 32 KB weight tile (issued before the
wait, as the kernel does), waiting on a counter that is already complete, computing its rows of
W @ x, storing them and publishing (barrier, release add), under one of these waits:

- none:  no table row, no wait (the floor of the rest of the task);
- table: today's: the task's row read from a table (event, count), then thread 0 spins on an
         acquire load and broadcasts it through shared memory (two barriers); the previous task's
         acquire emptied L1, so the row is an L2 round trip first;
- reg:   the event and count already in registers (`read_ahead`'s premise): only the acquire;
- each:  every thread acquires the counter itself (inline `ld.acquire.gpu` on a tensor of one
         address; a reduction so that all warps decide alike): no shared-memory broadcast;
- early: a relaxed load of the next task's counter is issued during this task; at the next task's
         start, if it already saw the count, one `fence.acq_rel.gpu` (a relaxed read then a fence is an
         acquire pattern in PTX's memory model) instead of the acquire round trip; else it spins.
         (ptxas makes the fence MEMBAR.ALL.GPU + CCTL.IVALL: the release's fence, ~0.5 us in the kernel);
- ahead: every thread acquires the next task's counter during this task, after this task's loads
         are out (an acquire orders only what comes after it) and before its compute; the next task
         spins only if someone saw it short. Sound for the next task's operands only if they bypass
         L1 (`.cg`, as here in every mode): this task's loads, in flight across that acquire's L1
         invalidation, may fill L1 with lines the next task's producers had not yet written.

Prints us per task for each mode and program count (the launch over --tasks tasks, minus the same
launch over 2, over --tasks - 2), and checks every mode's output against torch.

    python scripts/probe_wait.py [--programs 132,396] [--tasks 200] [--modes none,table,reg,each,early,ahead]  # GPU
    TRITON_INTERPRET=1 python scripts/probe_wait.py --programs 2 --tasks 3 --reps 1                   # CPU
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from kogc.bench.measure import time_once, write_result

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MODES = ("none", "table", "reg", "each", "early", "ahead")
ROW = 32            # ints per table row, as the kernel's (the event at 2, the count at 3 here)
NEV = 64            # counters the tasks wait on, round robin (all complete before the launch)


@triton.jit
def _load_each(ptrs, SEM: tl.constexpr, ASM: tl.constexpr):
    """Every thread loads its own copy of the counters at `ptrs`: SEM "acquire" or "relaxed" (gpu scope)."""
    if ASM:
        return tl.inline_asm_elementwise("ld.global." + SEM + ".gpu.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                         is_pure=False, pack=1)
    elif SEM == "acquire":
        return tl.atomic_add(ptrs, tl.zeros(ptrs.shape, tl.int32), sem="acquire", scope="gpu")
    else:
        return tl.load(ptrs, volatile=True)


@triton.jit
def _fence(x, ASM: tl.constexpr):
    """fence.acq_rel.gpu in every thread (x: any int32 tensor, only to give the asm a shape)."""
    if ASM:
        return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        return x


@triton.jit
def _spin(CNT, ERR, ev, need, limit):
    """Thread 0's acquire, broadcast (Triton's scalar atomic), until the count is there."""
    seen = tl.atomic_add(CNT + ev, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < need) & (spins < limit):
        seen = tl.atomic_add(CNT + ev, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= limit:
        tl.atomic_xchg(ERR, 1)


@triton.jit
def ready_waits(W, X, TABLE, CNT, OUT, PUB, ERR, ntasks, limit, MODE: tl.constexpr, R: tl.constexpr,
                K: tl.constexpr, ROWW: tl.constexpr, NEVS: tl.constexpr, NT: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.arange(0, R)
    k = tl.arange(0, K)
    one = tl.arange(0, NT) * 0          # NT >= the program's threads: one element per thread
    first = pid * ntasks
    if MODE == "ahead":
        pre = _load_each(CNT + (first % NEVS) + one, "acquire", ASM)  # task 0's counter
    else:
        pre = _load_each(CNT + (first % NEVS) + one, "relaxed", ASM)  # early: task 0's counter
    j = 0
    while j < ntasks:
        t = first + j
        w = tl.load(W + (t * R + r).to(tl.int64)[:, None] * K + k[None, :], eviction_policy="evict_first")
        if MODE == "table":
            row = TABLE + t.to(tl.int64) * ROWW
            _spin(CNT, ERR, tl.load(row + 2), tl.load(row + 3), limit)
        elif MODE == "reg":
            _spin(CNT, ERR, t % NEVS, 1, limit)
        elif MODE == "each":
            seen = _load_each(CNT + (t % NEVS) + one, "acquire", ASM)
            if tl.min(seen, 0) < 1:
                _spin(CNT, ERR, t % NEVS, 1, limit)
        elif MODE == "early":
            if tl.min(pre, 0) >= 1:
                pre = _fence(pre, ASM)
            else:
                _spin(CNT, ERR, t % NEVS, 1, limit)
            pre = _load_each(CNT + ((t + 1) % NEVS) + one, "relaxed", ASM)     # the next task's, during this one
        elif MODE == "ahead":
            if tl.min(pre, 0) < 1:
                _spin(CNT, ERR, t % NEVS, 1, limit)
        x = tl.load(X + k, cache_modifier=".cg").to(tl.float32)
        if MODE == "ahead":
            pre = _load_each(CNT + ((t + 1) % NEVS) + one, "acquire", ASM)     # the next task's: this one's loads are out
        tl.store(OUT + t * R + r, tl.sum(w.to(tl.float32) * x[None, :], 1))
        tl.debug_barrier()                                      # every thread's stores are done ...
        tl.atomic_add(PUB + pid, 1, sem="release", scope="gpu")  # ... then the publish
        j += 1


def run(mode: str, programs: int, ntasks: int, w: torch.Tensor, x: torch.Tensor, rows: int, limit: int) -> tuple:
    """(seconds of one launch or nan on CPU, outputs equal torch's, stuck)."""
    dev = w.device
    k = x.numel()
    table = torch.zeros(programs * ntasks, ROW, dtype=torch.int32, device=dev)
    t = torch.arange(programs * ntasks, device=dev, dtype=torch.int32)
    table[:, 2], table[:, 3] = t % NEV, 1
    cnt = torch.ones(NEV, dtype=torch.int32, device=dev)        # every wait is already satisfied
    out = torch.full((programs * ntasks * rows,), float("nan"), dtype=torch.float32, device=dev)
    pub = torch.zeros(programs, dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    launch = lambda: ready_waits[(programs,)](w, x, table, cnt, out, pub, err, ntasks, limit, MODE=mode,  # noqa
                                              R=rows, K=k, ROWW=ROW, NEVS=NEV, NT=128, ASM=not INTERPRET)
    secs = time_once(launch, dev.type)
    n = programs * ntasks
    ref = (w[: n * rows].float() @ x.float())
    ok = bool(torch.allclose(out, ref, rtol=1e-3, atol=1e-2)) and bool((pub == ntasks).all())
    return secs, ok, int(err.item())


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default="132,396", help="comma-separated: 1 or 3 per SM on an H200")
    ap.add_argument("--tasks", type=int, default=200, help="tasks per program")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rows", type=int, default=16, help="weight rows per task (x --k fp16: 32 KB by default)")
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=int, default=1 << 20, help="spins before a wait is reported stuck")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
    if device == "cpu" and not INTERPRET:
        raise SystemExit("no GPU: run under TRITON_INTERPRET=1 (correctness only, no timing)")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; known: {', '.join(MODES)}")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for programs in (int(p) for p in args.programs.split(",")):
        w = torch.randn(programs * args.tasks * args.rows, args.k, generator=gen).to(torch.float16).to(device)
        x = torch.randn(args.k, generator=gen).to(torch.float16).to(device)
        for mode in modes:
            run(mode, programs, 2, w, x, args.rows, args.limit)               # compile and warm up
            long_s, short_s, ok, stuck = [], [], True, 0
            for _ in range(args.reps):
                s, o, e = run(mode, programs, args.tasks, w, x, args.rows, args.limit)
                s2, o2, e2 = run(mode, programs, 2, w, x, args.rows, args.limit)
                long_s.append(s), short_s.append(s2)
                ok, stuck = ok and o and o2, stuck or e or e2
            med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
            us = (med(long_s) - med(short_s)) / (args.tasks - 2) * 1e6 if device == "cuda" else float("nan")
            gbs = programs * args.rows * args.k * 2 / (us * 1e-6) / 1e12 if device == "cuda" else float("nan")
            print(f"{mode:6s} {programs:4d} programs: {us:.3f} us per task ({gbs:.2f} TB/s of weights); "
                  f"outputs correct: {ok}" + ("; STUCK" if stuck else ""), flush=True)
            rows.append({"mode": mode, "programs": programs, "tasks": args.tasks, "tile_bytes": args.rows * args.k * 2,
                         "us_per_task": us, "TBps": gbs, "launch_s": long_s, "base_s": short_s, "correct": ok,
                         "stuck": bool(stuck)})
    write_result("probe_wait.json", rows)
    return rows


if __name__ == "__main__":
    main()
