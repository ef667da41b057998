"""How long does one dependency hop take between two programs on different SMs? Two protocols:

- counter (what the monokernel does today): the producer stores its vector, `debug_barrier`, then a
  release add on a counter (sm_90: MEMBAR.ALL.GPU + RED); the consumer spins on an acquire load of
  the counter, then loads the vector: two L2 round trips in a row plus the producer's fence.
- ll (NCCL's low-latency protocol): every 8-byte word holds 4 bytes of data and a 4-byte flag (the
  turn number), stored as one volatile 8-byte store; the consumer polls the vector itself with
  volatile loads until every flag has reached its turn. No counter, no fence, one round trip.

Two programs play ping-pong: turn i belongs to program i % 2, which waits for turn i - 1's vector,
adds one to each element and writes it; `--pollers` more programs read the same counter (or vector)
throughout, as the many consumers of one event do in the kernel; `--streamers` more programs read
a 1 GB buffer from HBM until the last turn, as the kernel's weight stream does (an idle machine
measured LL 0.3 us per hop faster, where the kernel lost with it: the probe under load). The time per hop is (t(hops) - t(2)) / (hops - 2), so the
launch cost cancels. Every wait has a spin bound (a hang is reported, not waited out), and the final
vector must equal the number of turns.

    python scripts/probe_hop.py [--hops 20000] [--sizes 64,1024,2048] [--pollers 0,128] [--streamers 0,384]
                                                                            # GPU; $OUT/probe_hop.json
    TRITON_INTERPRET=1 python scripts/probe_hop.py --programs 1 --hops 6 --pollers 0      # CPU: arithmetic only
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from kogc.bench.measure import time_once, write_result

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _stream(SRC, SINK, DONE, i, first, streamers, limit, NSRC: tl.constexpr):
    """Streamer i - first: read 8 KB chunks of SRC (streamers interleaved) until a player sets DONE,
    or `limit` chunks."""
    CH: tl.constexpr = 4096
    k = ((i - first) * CH) % NSRC
    acc = tl.zeros([CH], tl.float32)
    n = 0
    while (tl.load(DONE, volatile=True) == 0) & (n < limit):
        acc += tl.load(SRC + k + tl.arange(0, CH)).to(tl.float32)
        k = (k + streamers * CH) % NSRC           # wraps before int32 would (NSRC: a power of two)
        n += 1
    tl.store(SINK + i, tl.sum(acc, 0))      # keeps the reads


@triton.jit
def hop_counter(DATA, CNT, ERR, SRC, SINK, DONE, hops, limit, Q, streamers, P: tl.constexpr, N: tl.constexpr,
                NSRC: tl.constexpr):
    i = tl.program_id(0)
    offs = tl.arange(0, N)
    if i >= Q:      # a streamer: HBM reads beside the hops, until the last turn
        _stream(SRC, SINK, DONE, i, Q, streamers, limit, NSRC)
        i = hops
    elif i >= P:      # a poller: reads the counter like the many consumers of one event in the kernel
        spins = 0
        while (tl.atomic_add(CNT, 0, sem="acquire", scope="gpu") < hops) & (spins < limit):
            spins += 1
        i = hops
    while i < hops:
        spins = 0
        while (tl.atomic_add(CNT, 0, sem="acquire", scope="gpu") < i) & (spins < limit):
            spins += 1
        if spins >= limit:
            tl.atomic_xchg(ERR, i + 1)
            i = hops
        else:
            x = tl.load(DATA + offs)
            tl.store(DATA + offs, x + 1)
            tl.debug_barrier()                                   # every thread's stores are done ...
            tl.atomic_add(CNT, 1, sem="release", scope="gpu")    # ... then the count goes out
            i += P
    if tl.program_id(0) < P:
        tl.store(DONE, 1)                                        # the streamers stop


@triton.jit
def _store_ll(ptrs, words, live, ASM: tl.constexpr):
    """One 8-byte store per live word (single-copy atomic: data and flag land together)."""
    if ASM:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.volatile.global.b64 [$1], $2; "
                                  "mov.u32 $0, 0; }", "=r,l,l,r", [ptrs, words, live.to(tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(ptrs, words, mask=live)


@triton.jit
def hop_ll(BUF, ERR, SRC, SINK, DONE, hops, limit, Q, streamers, P: tl.constexpr, N: tl.constexpr,
           ASM: tl.constexpr, NSRC: tl.constexpr, NP: tl.constexpr):
    i = tl.program_id(0)
    # NP >= the program's threads: a tensor smaller than the program is replicated across warps, and a
    # reduction then reads one copy, so a thread whose own (stale) copy of a word was not the one
    # reduced would leave the poll with it (seen as a wrong final vector under load at 64 words)
    offs = tl.arange(0, NP)
    live = offs < N
    done = hops.to(tl.int64) << 32           # masked-off words read as stamped
    if i >= Q:      # a streamer: HBM reads beside the hops, until the last turn
        _stream(SRC, SINK, DONE, i, Q, streamers, limit, NSRC)
        i = hops
    elif i >= P:      # a poller: reads the vector like the many consumers of one value in the kernel
        spins = 0
        while (tl.min((tl.load(BUF + offs, mask=live, other=done, volatile=True) >> 32).to(tl.int32), 0) < hops) \
                & (spins < limit):
            spins += 1
        i = hops
    while i < hops:
        w = tl.load(BUF + offs, mask=live, other=done, volatile=True)
        spins = 0
        while (tl.min((w >> 32).to(tl.int32), 0) < i) & (spins < limit):   # flags are monotonic
            w = tl.load(BUF + offs, mask=live, other=done, volatile=True)
            spins += 1
        if spins >= limit:
            tl.atomic_xchg(ERR, i + 1)
            i = hops
        else:
            data = (w & 0xFFFFFFFF) + 1
            _store_ll(BUF + offs, ((i + 1).to(tl.int64) << 32) | data, live, ASM)
            i += P
    if tl.program_id(0) < P:
        tl.store(DONE, 1)                                        # the streamers stop


_SOURCES: dict = {}


def stream_source(device: str) -> torch.Tensor:
    """What streamers read: 1 GB of fp16 on a GPU (far beyond L2), a little under the interpreter."""
    if device not in _SOURCES:
        n = 1 << (29 if device == "cuda" else 14)
        _SOURCES[device] = torch.rand(n, device=device).to(torch.float16)
    return _SOURCES[device]


def run(protocol: str, n: int, hops: int, programs: int, device: str, limit: int, pollers: int = 0,
        streamers: int = 0):
    """(seconds of one launch, the final vector is correct, error turn or 0). `programs` play the
    turns; `pollers` more programs only read what the players write, until the last turn;
    `streamers` more read HBM (a weight stream's load) until then."""
    err = torch.zeros(1, dtype=torch.int32, device=device)
    done = torch.zeros(1, dtype=torch.int32, device=device)
    grid = (programs + pollers + streamers,)
    src = stream_source(device) if streamers else torch.zeros(4096, dtype=torch.float16, device=device)
    sink = torch.zeros(grid[0], dtype=torch.float32, device=device)
    common = dict(P=programs, N=n, NSRC=src.numel())
    threads = 4 * 32      # Triton's default num_warps
    if protocol == "counter":
        data = torch.zeros(n, dtype=torch.int32, device=device)
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        launch = lambda: hop_counter[grid](data, cnt, err, src, sink, done, hops, limit,  # noqa: E731
                                           programs + pollers, max(streamers, 1), **common)
        final = lambda: data  # noqa: E731
    else:
        buf = torch.zeros(n, dtype=torch.int64, device=device)
        launch = lambda: hop_ll[grid](buf, err, src, sink, done, hops, limit, programs + pollers,  # noqa: E731
                                      max(streamers, 1), ASM=not INTERPRET,
                                      NP=max(n, threads), **common)
        final = lambda: buf & 0xFFFFFFFF  # noqa: E731
    secs = time_once(launch, device)
    ok = bool((final() == hops).all())
    return secs, ok, int(err.item())


def measure(protocol: str, n: int, pollers: int, args, device: str, streamers: int = 0) -> dict:
    run(protocol, n, 2, args.programs, device, args.limit, pollers, streamers)      # compile and warm up
    long_s, short_s, ok, err = [], [], True, 0
    for _ in range(args.reps):
        s, o, e = run(protocol, n, args.hops, args.programs, device, args.limit, pollers, streamers)
        s2, o2, e2 = run(protocol, n, 2, args.programs, device, args.limit, pollers, streamers)
        long_s.append(s), short_s.append(s2)
        ok, err = ok and o and o2, err or e or e2
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    hop_us = (med(long_s) - med(short_s)) / (args.hops - 2) * 1e6
    print(f"{protocol:8s} {4 * n:6d} data bytes, {pollers:3d} pollers, {streamers:3d} streamers: {hop_us:.3f} us "
          f"per hop; final vector correct: {ok}" + (f"; STUCK at turn {err - 1}" if err else ""), flush=True)
    return {"protocol": protocol, "words": n, "bytes_of_data": 4 * n, "pollers": pollers, "streamers": streamers,
            "hops": args.hops,
            "hop_us": hop_us, "launch_s": long_s, "base_s": short_s, "correct": ok, "stuck_at_turn": err}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hops", type=int, default=20000)
    ap.add_argument("--sizes", default="64,1024,2048", help="words per vector (4 data bytes each), powers of two")
    ap.add_argument("--programs", type=int, default=2, help="2 on a GPU; 1 under the interpreter (no concurrency)")
    ap.add_argument("--pollers", default="0,128", help="comma-separated: extra programs reading the same counter "
                                                         "or vector (the kernel's fan-out: many consumers per event)")
    ap.add_argument("--streamers", default="0", help="comma-separated: extra programs reading 1 GB from HBM "
                                                         "meanwhile (the kernel's weight stream; e.g. 0,384)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=int, default=1 << 22, help="spins before a wait is reported stuck")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
    if device == "cpu" and not INTERPRET:
        raise SystemExit("no GPU: run under TRITON_INTERPRET=1 (arithmetic only, no timing)")
    rows = []
    for streamers in (int(x) for x in args.streamers.split(",")):
        for pollers in (int(x) for x in args.pollers.split(",")):
            for n in (int(x) for x in args.sizes.split(",")):
                for protocol in ("counter", "ll"):
                    rows.append(measure(protocol, n, pollers, args, device, streamers))
    write_result("probe_hop.json", rows)
    return rows


if __name__ == "__main__":
    main()
