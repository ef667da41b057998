"""Probe (one NVIDIA GPU): where a rank's count task's time goes.

A rank's count task (kogc/codegen/templates/tail.j2, `_count_shard`) counts 4,096 of its peers' logits per 16-bit
key into the draw's counts and folds each logit's word (a 32-bit hash of seed, step and id above, its id below) into
its key's word (`_key_range` with COUNT 2): a hash and two relaxed atomics a logit. Profiled on rank 0 of 8 mirrored
(laneformer-2b, `docs/multi-gpu.md`, with Philox's numbers then), a count task's body took about 12 us, 28 of them
at once. Here P programs each count their own chunk of 4,096 ids of one vector of 128,256 fp16 logits (random
normal, as random weights give), R times in one launch (steps 0..R-1), in six forms, the first three the kernel's
own code:

    keys       the pass alone: the loads, the order keys, the range (COUNT 0)
    counts     and the count atomic (COUNT 1)
    words      and the word atomic with its hash (COUNT 2: the count task's form)
    no-random  the count and word atomics, the word the id alone (no hash: not a uniform draw)
    random     the hashed words computed and summed, no atomics
    philox     the count and word atomics, the word's random number from Philox (tl.randint) instead of the hash:
               the kernel's form before the hash

us a pass = a launch's time / R, the median of N launches (CUDA events), each program of 4 warps as the
monokernel's; P = 1 (one task alone) and 28 (a rank's tasks at once, on as many SMs). First, on a small vector,
the counts are checked against torch's and every key's word against naming one of that key's logits.

    PYTHONPATH=. python experiments/count_probe.py --out $OUT/count-probe.json
    TRITON_INTERPRET=1 PYTHONPATH=. python experiments/count_probe.py --check     # the checks alone, on the CPU
"""
import argparse
import json
import os
import statistics

import torch

from kogc.codegen.loader import interpreter, load_kernel
from kogc.codegen.sampler import sampler_source
from kogc.scheduler.tasks import HIST_BINS, HIST_WORDS, TOKEN_KEYS

VOCAB = 128256          # laneformer-2b's
CHUNK = 4096            # a count task's ids (kogc.scheduler.tile.COUNT_CHUNK)
BLOCK = 1024            # its block (min(1024, COUNT_CHUNK))
MODES = {"keys": 0, "counts": 1, "words": 2, "no-random": 3, "random": 4, "philox": 5}

PROBE = '''

@triton.jit
def _philox_word(idx, step, seed):
    """_draw_word with Philox's number for the hash's (tl.randint keyed like _gumbel, counter idx): the kernel's
    word before the hash."""
    r = tl.randint(_philox_key(seed, step), idx).to(tl.int64) & 0xFFFFFFFF
    return (r << 31) | (0x7FFFFFFF - idx).to(tl.int64)


@triton.jit
def _probe_pass(LOGITS, V, HIST, KEYDT: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr, i0, step, seed):
    """no-random (3): the count and word atomics, the word the id alone; random (4): the words summed; philox (5):
    the count and word atomics, the word _philox_word."""
    acc = tl.zeros([BLOCK], tl.int64)
    nxt = _block(LOGITS, V, 0, BLOCK)
    b0 = 0
    while b0 < V:
        i = b0 + tl.arange(0, BLOCK)
        live = i < V
        k = _order_key(nxt, KEYDT)
        nxt = _block(LOGITS, V, b0 + BLOCK, BLOCK)
        if MODE == 3:
            tl.atomic_add(HIST + k + HIST_BINS // 2, 1, mask=live, sem="relaxed")
            tl.atomic_max(_key_draws(HIST) + k + HIST_BINS // 2, (0x7FFFFFFF - (i0 + i)).to(tl.int64), mask=live,
                          sem="relaxed")
        elif MODE == 5:
            tl.atomic_add(HIST + k + HIST_BINS // 2, 1, mask=live, sem="relaxed")
            tl.atomic_max(_key_draws(HIST) + k + HIST_BINS // 2, _philox_word(i0 + i, step, seed), mask=live,
                          sem="relaxed")
        else:
            acc += tl.where(live, _draw_word(i0 + i, step, seed), 0)
        b0 += BLOCK
    return tl.sum(acc, 0)


@triton.jit(do_not_specialize=["V", "reps", "seed"])
def probe_count(LOGITS, HIST, SINK, V, reps, seed, CHUNK: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Program p counts ids p CHUNK .. (p + 1) CHUNK - 1 of LOGITS `reps` times (steps 0..reps-1) in form MODE."""
    first = tl.program_id(0) * CHUNK
    n = tl.minimum(CHUNK, V - first)
    live = tl.zeros((), tl.int64)
    r = 0
    while r < reps:
        if MODE < 3:
            lo, hi = _key_range(LOGITS + first, n, HIST, LOGITS.dtype.element_ty, BLOCK, MODE, first, r, seed)
            live += lo + hi
        else:
            live += _probe_pass(LOGITS + first, n, HIST, LOGITS.dtype.element_ty, BLOCK, MODE, first, r, seed)
        r += 1
    tl.store(SINK + tl.program_id(0), live)
'''


def _kernel(interpret):
    return load_kernel(sampler_source() + PROBE, interpret, name="probe_count")[0]


def _order_keys(x):
    b = x.view(torch.int16).to(torch.int32)
    return torch.where(b >= 0, b, b ^ 0x7FFF)


def check(interpret, device):
    """The kernel's counts and words on a small vector against torch's; raises if they differ."""
    kernel = _kernel(interpret)
    torch.manual_seed(0)
    V, chunk, seed = 3000, 1024, 7
    logits = (torch.randn(V) * 2).half().to(device)
    logits[5:9] = logits[4]                         # a key of several logits
    P = -(-V // chunk)
    for name in ("counts", "words", "no-random", "philox"):
        hist = torch.zeros(HIST_WORDS, dtype=torch.int32, device=device)
        sink = torch.zeros(P, dtype=torch.int64, device=device)
        with interpreter(interpret):
            kernel[(P,)](logits, hist, sink, V, 2, seed, CHUNK=chunk, MODE=MODES[name], BLOCK=256, num_warps=4)
        keys = _order_keys(logits.cpu()) + HIST_BINS // 2
        want = torch.bincount(keys, minlength=HIST_BINS) * 2
        got = hist[:HIST_BINS].cpu().to(torch.int64)
        if not torch.equal(got, want):
            raise SystemExit(f"count_probe: {name}'s counts differ from torch's")
        if name == "counts":
            continue
        words = hist[HIST_BINS + 2 * TOKEN_KEYS:].cpu().view(torch.int64)[:HIST_BINS]
        used = want.nonzero().flatten()
        ids = 0x7FFFFFFF - (words[used] & 0x7FFFFFFF)
        if not torch.equal(keys[ids], used):
            raise SystemExit(f"count_probe: {name}'s words name ids of other keys")
    print("count_probe: counts equal torch's, every word names a logit of its key")


def timed(kernel, logits, programs, mode, reps, launches):
    hist = torch.zeros(HIST_WORDS, dtype=torch.int32, device="cuda")
    sink = torch.zeros(programs, dtype=torch.int64, device="cuda")
    times = []
    for _ in range(launches + 1):
        hist.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        kernel[(programs,)](logits, hist, sink, VOCAB, reps, 7, CHUNK=CHUNK, MODE=mode, BLOCK=BLOCK, num_warps=4)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times[1:])         # (the first launch compiles)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="JSON file of the results")
    ap.add_argument("--reps", type=int, default=200, help="passes a launch")
    ap.add_argument("--launches", type=int, default=9)
    ap.add_argument("--check", action="store_true", help="only the checks (under the interpreter without a GPU)")
    a = ap.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    check(interpret, "cpu" if interpret else "cuda")
    if a.check:
        return
    kernel = _kernel(False)
    torch.manual_seed(1)
    logits = (torch.randn(VOCAB, device="cuda") * 2).half()
    rows = []
    for programs in (1, 28):         # one task alone; a rank of 8's count tasks
        for name, mode in MODES.items():
            us = timed(kernel, logits, programs, mode, a.reps, a.launches)
            rows.append({"programs": programs, "form": name, "us_per_pass": us})
            print(f"{programs:3d} programs, {name:10s}: {us:6.2f} us a pass of {CHUNK} logits", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "chunk": CHUNK, "reps": a.reps, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
