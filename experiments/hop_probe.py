"""Probe (one NVIDIA GPU): what one dependency hop between two SMs costs as the kernel makes it, and
as a hop whose flags travel inside the data would ("LL", NCCL's low-latency protocol), for vectors of
the sizes a layer's phases pass on (256 B to 8 KB of fp16).

Two programs of one cooperative launch (the first and the last: other SMs) pass a vector back and
forth for R rounds; each hop the receiver reads the whole vector, adds 1 to it and sends it back.

- counter: the kernel's hop (kogc/codegen/templates/waits.j2 and the publish in monokernel.py.j2):
  the sender stores the vector, then a barrier and a release add on its counter; the receiver polls
  the counter with acquire loads, then loads the vector (a second round trip to L2).
- ll: the sender stores each 4 bytes of payload with the round number beside them as one 8-byte
  relaxed store, with no fence and no counter; the receiver polls the vector itself (relaxed 8-byte
  loads) until every word carries the round, then has its data: one round trip, twice the bytes.

Each side stamps %globaltimer every round: the median and 99th percentile of a hop (half a round
trip) and the mean over all rounds. Every wait is bounded (LIMIT spins): a side that gives up
records it, and the result says so instead of hanging.

    PYTHONPATH=. python experiments/hop_probe.py --out $OUT/hop.json
"""
import argparse
import statistics

import torch
import triton
import triton.language as tl

from probe_rows import save, show

LIMIT = 1 << 22          # spins before a wait gives up


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _acquire_at_least(cnt, target, limit, SCOPE: tl.constexpr):
    """Spin on acquire reads of a counter until it reaches target (at most `limit` reads): whether it did.
    SCOPE "sys" for a counter another GPU raises."""
    seen = tl.atomic_add(cnt, 0, sem="acquire", scope=SCOPE)
    n = 0
    while (seen < target) & (n < limit):
        seen = tl.atomic_add(cnt, 0, sem="acquire", scope=SCOPE)
        n += 1
    return seen >= target


@triton.jit
def _st_relaxed(ptrs, vals):
    tl.inline_asm_elementwise("st.relaxed.gpu.global.b64 [$1], $2; mov.u32 $0, 0;", "=r,l,l", [ptrs, vals],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _ld_relaxed(ptrs):
    return tl.inline_asm_elementwise("ld.relaxed.gpu.global.b64 $0, [$1];", "=l,l", [ptrs], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _receive(cnt, vec, other, r, limit, n: tl.constexpr, LL: tl.constexpr):
    """The other side's vector of round r as int64 payloads, and 1 (0: the wait gave up)."""
    i = tl.arange(0, n)
    if LL:      # poll the data itself until every word carries the round
        words = _ld_relaxed(vec + other * n + i)
        k = 0
        while (tl.min(words >> 32, 0) < r + 1) & (k < limit):
            words = _ld_relaxed(vec + other * n + i)
            k += 1
        return words & 0xFFFFFFFF, (k < limit).to(tl.int32)
    else:       # the counter (acquire), then the data: the kernel's hop
        ok = _acquire_at_least(cnt + 32 * other, r + 1, limit, "gpu").to(tl.int32)
        return tl.load(vec + other * n + i).to(tl.int64), ok


@triton.jit
def _send(cnt, vec, me, r, x, n: tl.constexpr, LL: tl.constexpr):
    """x + 1 as this side's vector of round r."""
    i = tl.arange(0, n)
    if LL:      # payload and round in one 8-byte relaxed store: no fence, no counter
        _st_relaxed(vec + me * n + i, ((r + 1).to(tl.int64) << 32) | ((x + 1) & 0xFFFFFFFF))
    else:       # the data, then a barrier and a release add (the kernel's publish)
        tl.store(vec + me * n + i, ((x + 1) & 0x7FFF).to(tl.int16))
        tl.debug_barrier()
        tl.atomic_add(cnt + 32 * me, 1, sem="release", scope="gpu")


@triton.jit
def hop(cnt, vec, stamps, bad, rounds, limit, N: tl.constexpr, LL: tl.constexpr):
    """vec: [2, N] (side 0's vector, then side 1's): 16-bit values (counter hops), or int64 words of
    (round << 32) | 4 bytes of payload (LL hops); cnt: two counters 32 words apart."""
    pid = tl.program_id(0)
    last = tl.num_programs(0) - 1
    if (pid == 0) | (pid == last):
        me = (pid == last).to(tl.int32)
        x = tl.zeros([N], tl.int64)
        ok = 1
        r = 0
        while (r < rounds) & (ok != 0):
            if me == 1:      # side 1 receives first
                x, ok = _receive(cnt, vec, 1 - me, r, limit, N, LL)
            _send(cnt, vec, me, r, x, N, LL)
            if me == 0:
                x, ok = _receive(cnt, vec, 1 - me, r, limit, N, LL)
            tl.store(stamps + me * rounds + r, _now())
            r += 1
        if ok == 0:
            tl.store(bad + me, r)


def summarize(stamps: torch.Tensor, rounds: int) -> dict:
    """Hops from side 0's stamps: a round is two hops (there and back)."""
    t = stamps[0].tolist()
    hops = [(b - a) / 2e3 for a, b in zip(t[:-1], t[1:])][rounds // 10:]       # us; the first tenth warms up
    hops.sort()
    return {"hop_us_median": statistics.median(hops), "hop_us_p99": hops[int(len(hops) * 0.99)],
            "hop_us_mean": (t[-1] - t[rounds // 10]) / 2e3 / (rounds - 1 - rounds // 10)}


def run(kind: str, n_fp16: int, rounds: int, grid: int) -> dict:
    dev = "cuda"
    stamps = torch.zeros((2, rounds), dtype=torch.int64, device=dev)
    bad = torch.zeros(2, dtype=torch.int32, device=dev)
    for attempt in range(2):            # the first launch compiles and warms up
        stamps.zero_()
        bad.zero_()
        ll = kind == "ll"
        cnt = torch.zeros(64, dtype=torch.int32, device=dev)
        vec = torch.zeros((2, n_fp16 // 2), dtype=torch.int64, device=dev) if ll else \
            torch.zeros((2, n_fp16), dtype=torch.int16, device=dev)
        hop[(grid,)](cnt, vec, stamps, bad, rounds, LIMIT, N=vec.shape[1], LL=ll, num_warps=4,
                     launch_cooperative_grid=True)
        torch.cuda.synchronize()
    res = {"kind": kind, "bytes": 2 * n_fp16, "rounds": rounds, "gave_up_at_round": bad.tolist()}
    if bad.tolist() == [0, 0]:
        res.update(summarize(stamps.cpu(), rounds))
        # every hop added 1 to what it received: side 0's last vector holds 2 * rounds - 1 everywhere
        if ll:
            res["value_ok"] = bool(((vec[0] & 0xFFFFFFFF) == 2 * rounds - 1).all())
        else:
            res["value_ok"] = bool((vec[0] == (2 * rounds - 1) & 0x7FFF).all())
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--sizes", default="128,1024,4096", help="fp16 values per vector")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        for kind in ("counter", "ll"):
            rows.append(show(run(kind, n, a.rounds, grid)))
    save(a.out, grid, rows)


if __name__ == "__main__":
    main()
