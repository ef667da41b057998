"""Probe (two NVIDIA GPUs): what one hop between two GPUs' persistent programs costs, made the way the
multi-GPU kernel makes it: a vector of fp32 stored into the peer's memory (symmetric memory: the
driver maps the peer's buffer), a barrier, a system-scope release add on the peer's counter; the
peer polls its own counter with system-scope acquires, then reads the vector from its own memory.

Two ranks (one process and one GPU each, started by torchrun), one program each, play ping-pong for
R rounds: each hop the receiver adds 1 to the whole vector and sends it back. Rank 0 stamps
%globaltimer every round (the GPUs' timers are not compared): a round is two hops, so the median and
99th percentile of a hop are half a round's. Sizes: 256 B, 2 KB and 8 KB (laneformer-2b's sums are 2,048
fp32 = 8 KB). Every wait is bounded (LIMIT spins); a side that gives up records the round, and the
result says so instead of hanging. Rank 0 prints one JSON row per size and writes them with --out.

    torchrun --standalone --nproc-per-node 2 experiments/hop_probe_gpus.py --out $OUT/hop-gpus.json
    python experiments/hop_probe_gpus.py --compile-only      # no GPU: compile the kernel for sm_90
    TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 torchrun --standalone --nproc-per-node 2 \
        experiments/hop_probe_gpus.py --rounds 20        # one GPU: the script's path only (time slices, no speed)
"""
import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

LIMIT = 1 << 24          # spins before a wait gives up

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hop_probe import _acquire_at_least, _now  # noqa: E402   (the one-GPU probe's timer and wait)


@triton.jit
def hop_gpus(vec, cnt, peer_vec_addr, peer_cnt_addr, stamps, bad, me, rounds, limit, N: tl.constexpr):
    """vec / cnt: this rank's receive buffer (fp32 [N]) and counter; the peer's as addresses (int64)."""
    i = tl.arange(0, N)
    peer_vec = peer_vec_addr.to(tl.pointer_type(tl.float32))
    peer_cnt = peer_cnt_addr.to(tl.pointer_type(tl.int32))
    x = tl.zeros([N], tl.float32)
    ok = 1
    r = 0
    while (r < rounds) & (ok != 0):
        if me == 1:          # rank 1 receives first
            ok = _acquire_at_least(cnt, r + 1, limit, "sys").to(tl.int32)
            x = tl.load(vec + i)
        tl.store(peer_vec + i, x + 1.0)
        tl.debug_barrier()   # every thread's stores before the release
        tl.atomic_add(peer_cnt, 1, sem="release", scope="sys")
        if me == 0:
            ok = _acquire_at_least(cnt, r + 1, limit, "sys").to(tl.int32)
            x = tl.load(vec + i)
        tl.store(stamps + r, _now())
        r += 1
    if ok == 0:
        tl.store(bad, r)


def run(n: int, rounds: int, rank: int, group: str) -> dict | None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    dev = f"cuda:{torch.cuda.current_device()}"
    vec = symm_mem.empty(n, dtype=torch.float32, device=dev)
    cnt = symm_mem.empty(32, dtype=torch.int32, device=dev)
    hv, hc = symm_mem.rendezvous(vec, group), symm_mem.rendezvous(cnt, group)
    peer = 1 - rank
    stamps = torch.zeros(rounds, dtype=torch.int64, device=dev)
    bad = torch.zeros(1, dtype=torch.int32, device=dev)
    for attempt in range(2):            # the first launch compiles and warms up
        vec.zero_()
        cnt.zero_()
        stamps.zero_()
        bad.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        hop_gpus[(1,)](vec, cnt, hv.buffer_ptrs[peer], hc.buffer_ptrs[peer], stamps, bad, rank, rounds, LIMIT, N=n,
                       num_warps=4)
        torch.cuda.synchronize()
        dist.barrier()
    gave_up = [None, None]
    dist.all_gather_object(gave_up, int(bad.item()))
    if rank != 0:
        return None
    res = {"bytes": 4 * n, "rounds": rounds, "gave_up_at_round": gave_up}
    if gave_up == [0, 0]:
        t = stamps.cpu().tolist()
        hops = sorted((b - a) / 2e3 for a, b in zip(t[rounds // 10:-1], t[rounds // 10 + 1:]))   # us; a tenth warms up
        res.update(hop_us_median=statistics.median(hops), hop_us_p99=hops[int(len(hops) * 0.99)],
                   hop_us_mean=(t[-1] - t[rounds // 10]) / 2e3 / (rounds - 1 - rounds // 10),
                   # every hop added 1: rank 0 last received 2 * rounds everywhere
                   value_ok=bool((vec == 2 * rounds).all()))
    return res


def compile_only() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"vec": "*fp32", "cnt": "*i32", "peer_vec_addr": "i64", "peer_cnt_addr": "i64", "stamps": "*i64",
           "bad": "*i32", "me": "i32", "rounds": "i32", "limit": "i32", "N": "constexpr"}
    for n in (64, 512, 2048):
        k = triton.compile(ASTSource(hop_gpus, sig, constexprs={"N": n}), target=GPUTarget("cuda", 90, 32))
        print(f"N={n}: compiled for sm_90, {len(k.asm['cubin'])} B of cubin, "
              f"{k.asm['ptx'].count('.sys')} system-scope operations in the PTX")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--sizes", default="64,512,2048", help="fp32 values per vector")
    ap.add_argument("--out", help="write the results as JSON here (rank 0)")
    ap.add_argument("--compile-only", action="store_true", help="compile the kernel for sm_90, no GPU")
    a = ap.parse_args()
    if a.compile_only:
        return compile_only()
    import torch.distributed as dist
    if int(os.environ.get("WORLD_SIZE", "1")) != 2:
        raise SystemExit("run with two processes: torchrun --standalone --nproc-per-node 2 " + __file__)
    rank = int(os.environ["RANK"])
    if torch.cuda.device_count() < 2:
        # both processes on one GPU (TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1, a gloo group: NCCL refuses two
        # ranks on one GPU) try the script's path; their kernels take turns on the GPU, so the hops it
        # reports are time slices, not a hop's cost
        if os.environ.get("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES") != "1":
            raise SystemExit("one GPU: two GPUs are wanted, or TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 to try "
                             "the script's path with both processes on this one")
        torch.cuda.set_device(0)
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device(f"cuda:{rank}"))
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        row = run(n, a.rounds, rank, dist.group.WORLD.group_name)
        if row is not None:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "gpus": 2, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
