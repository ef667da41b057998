"""Probe (one NVIDIA GPU): does a counter with many producers reach its spinning consumers later than one
with few? The kernel's W2 tasks wait on W1/W3's event of 256 producers (laneformer-2b, one lane a GPU) and
leave that wait 1.2-1.8 us after the last producer ends, where the phases whose events have 16-128 producers
leave theirs 0.5-0.6 us after (`docs/multi-gpu.md`, the G = 8 mirror).

One cooperative launch of 3 programs an SM. Program 0 starts each round: it stamps the time and raises a
`go` flag (a release store). N producer programs spin on `go` (acquire, like the kernel's waits), then each
stamps the time and publishes as the kernel does (a barrier, then a release add of 1 on one counter).
S consumer programs spin on the counter (acquire) until it reaches N per round, then stamp the time and
add 1 to a `done` counter, which program 0 waits for before the next round. Per round: the time from the
last producer's stamp to each consumer's, its median over the consumers and the slowest consumer; then the
median and 99th percentile over the rounds. Every wait is bounded (LIMIT spins): a side that gives up records
it and the result says so.

    PYTHONPATH=. python experiments/fanin_probe.py --out $OUT/fanin.json
    python experiments/fanin_probe.py --compile-only      # no GPU: compile the kernel for sm_90
"""
import argparse
import statistics

import triton
import triton.language as tl

from probe_rows import save, show

LIMIT = 1 << 22          # spins before a wait gives up
# (producers N, consumers S): the kernel's W2 wait (256 producers, 128 spinners), its other phases
# (16-128 producers), and each factor alone
CASES = [(1, 1), (1, 128), (16, 16), (32, 64), (64, 128), (128, 128), (256, 1), (256, 128), (384, 8)]


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _spin(cnt, target, limit):
    """Acquire reads of a counter until it reaches target (at most `limit` reads): whether it did."""
    seen = tl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
    n = 0
    while (seen < target) & (n < limit):
        seen = tl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        n += 1
    return seen >= target


@triton.jit
def fanin(flags, stamps, bad, rounds, limit, N: tl.constexpr, S: tl.constexpr):
    """flags: go, counter and done, 32 words apart; stamps [1 + N + S, rounds]."""
    pid = tl.program_id(0)
    go = flags
    cnt = flags + 32
    done = flags + 64
    ok = 1
    r = 0
    if pid == 0:
        while (r < rounds) & (ok != 0):
            tl.store(stamps + r, _now())
            tl.atomic_xchg(go, r + 1, sem="release", scope="gpu")
            ok = _spin(done, S * (r + 1), limit).to(tl.int32)
            r += 1
    elif pid <= N:
        while (r < rounds) & (ok != 0):
            ok = _spin(go, r + 1, limit).to(tl.int32)
            tl.store(stamps + pid * rounds + r, _now())
            tl.debug_barrier()
            tl.atomic_add(cnt, 1, sem="release", scope="gpu")
            r += 1
    elif pid <= N + S:
        while (r < rounds) & (ok != 0):
            ok = _spin(cnt, N * (r + 1), limit).to(tl.int32)
            tl.store(stamps + pid * rounds + r, _now())
            tl.atomic_add(done, 1, sem="relaxed", scope="gpu")
            r += 1
    if ok == 0:
        tl.store(bad + pid, r)


def summarize(stamps, n: int, s: int, rounds: int) -> dict:
    """us from the last producer's stamp to the consumers' (the first tenth of the rounds warms up)."""
    t = stamps.tolist()
    med, slow = [], []
    for r in range(rounds // 10, rounds):
        last = max(t[p][r] for p in range(1, n + 1))
        seen = sorted((t[p][r] - last) / 1e3 for p in range(n + 1, n + s + 1))
        med.append(statistics.median(seen))
        slow.append(seen[-1])
    med.sort()
    slow.sort()
    q = lambda xs, f: xs[min(len(xs) - 1, int(len(xs) * f))]     # noqa: E731
    return {"median_consumer_us": statistics.median(med), "median_consumer_us_p99": q(med, 0.99),
            "slowest_consumer_us": statistics.median(slow), "slowest_consumer_us_p99": q(slow, 0.99)}


def run(n: int, s: int, rounds: int, grid: int) -> dict:
    import torch
    stamps = torch.zeros((1 + n + s, rounds), dtype=torch.int64, device="cuda")
    bad = torch.zeros(grid, dtype=torch.int32, device="cuda")
    for attempt in range(2):            # the first launch compiles and warms up
        flags = torch.zeros(96, dtype=torch.int32, device="cuda")
        stamps.zero_()
        bad.zero_()
        fanin[(grid,)](flags, stamps, bad, rounds, LIMIT, N=n, S=s, num_warps=4, launch_cooperative_grid=True)
        torch.cuda.synchronize()
    res = {"producers": n, "consumers": s, "rounds": rounds, "gave_up": int((bad != 0).sum())}
    if res["gave_up"] == 0:
        res.update(summarize(stamps.cpu(), n, s, rounds))
    return res


def compile_only() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"flags": "*i32", "stamps": "*i64", "bad": "*i32", "rounds": "i32", "limit": "i32",
           "N": "constexpr", "S": "constexpr"}
    k = triton.compile(ASTSource(fanin, sig, constexprs={"N": 256, "S": 128}), target=GPUTarget("cuda", 90, 32))
    print(f"compiled for sm_90: {len(k.asm['cubin'])} B of cubin, {k.asm['ptx'].count('release')} release "
          f"operations in the PTX")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--compile-only", action="store_true", help="compile the kernel for sm_90, no GPU")
    a = ap.parse_args()
    if a.compile_only:
        return compile_only()
    import torch
    grid = 3 * torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n, s in CASES:
        if 1 + n + s > grid:
            continue
        rows.append(show(run(n, s, a.rounds, grid)))
    save(a.out, grid, rows)


if __name__ == "__main__":
    main()
