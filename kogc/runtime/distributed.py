"""Delayed tensor parallelism across GPUs: one process per rank (started by torchrun, or by `kogc run
--gpus G` / `kogc bench --gpus G` through torch.distributed's own launcher).

Each process compiles every rank's schedule (they are proven sound together) and runs its own. The
buffers its peers store into (F32: receive buffers; CNT: event counters) come from PyTorch symmetric
memory (`torch.distributed._symmetric_memory`, its CUDA backend: the driver maps the peers' memory;
no NVSHMEM), and the peers' addresses go to the kernel as data (`Buffers.PEERS`). The process group
(NCCL) serves only the setup and host-side gathers (a step's whole logits): nothing on the token path.
"""
from __future__ import annotations

import os

import torch

from ..errors import KogcError
from ..request import prompt_ids_of
from ..settings import device_target, tile_config_for
from .kernel import CompiledKernel, weights_of


def launched() -> bool:
    """Whether this process is one of several started by torchrun (or torch.distributed.run)."""
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def rank_tag() -> str:
    """' rank R' in a process of several started by torchrun (each prints its own progress lines), else ''."""
    return f" rank {rank()}" if launched() else ""


def overlapping() -> bool:
    """Several ranks may share a GPU (a test of the cross-process path on one GPU): PyTorch's own opt-in
    for symmetric memory, TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1. The kernels of several processes
    on one GPU take turns (time slices) unless MPS runs: slow, for testing only."""
    return os.environ.get("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES") == "1"


def check_gpus(gpus: int) -> None:
    """Refuse more ranks than visible GPUs (KogcError), unless ranks may overlap."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n >= gpus or (overlapping() and n >= 1):
        return
    raise KogcError(f"--gpus {gpus}: only {n} GPU(s) visible; run with as many GPUs, or --one-gpu to run every "
                    f"rank on one GPU")


def relaunch(gpus: int, argv: list[str]) -> int:
    """Run `python -m kogc ARGV` as `gpus` processes through torch.distributed's own launcher (what
    torchrun runs); the exit code, 1 naming the ranks that failed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun
    check_gpus(gpus)
    try:
        torchrun(["--standalone", "--nproc-per-node", str(gpus), "-m", "kogc", *argv])
    except ChildFailedError as e:
        failed = ", ".join(f"rank {r} (exit code {f.exitcode})" for r, f in sorted(e.failures.items()))
        raise KogcError(f"{failed} failed; the other ranks stopped") from None
    return 0


# A rank's kernel waits on its peers, whose launches its host does not order: a peer's host may be seconds late (its
# first launch compiling the kernel, another kernel compiling, eager references), and every wait behind a remote
# one waits that long too. One GPU's watchdog (4M spins, a few seconds) gave up on such skews with two processes
# on one GPU (kogc check --config tiny --gpus 2, H100, 2026-12-06); this one gives a peer about a minute.
RANK_WATCHDOG_SPINS = 64_000_000


def compile_rank(module, graph, target, tile_config, num_programs, num_warps, max_registers, gpus: int,
                 profile: bool | str = False, weights: str = "model", prequantized=None):
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from ..scheduler.ranks import build_rank_schedules

    world, rank, local = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if world != gpus:
        raise KogcError(f"gpus={gpus} but torchrun started {world} processes: give --nproc-per-node {gpus}")
    check_gpus(gpus)
    local %= torch.cuda.device_count()
    torch.cuda.set_device(local)
    device = f"cuda:{local}"
    if not dist.is_initialized():
        # NCCL refuses two ranks on one GPU: the overlapping test path sets up through gloo
        if overlapping() and torch.cuda.device_count() < world:
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("nccl", device_id=torch.device(device))
    tgt = device_target(target, device, num_warps, max_registers)
    cfg = tile_config_for(module, tgt, tile_config, weights=weights, gpus=gpus)
    schedules = build_rank_schedules(graph, gpus, tgt, "parallel", cfg, num_programs=num_programs)
    shared = []

    def peer_visible(n, dtype):
        t = symm_mem.empty(max(n, 1), dtype=dtype, device=device)
        t.zero_()
        shared.append(t)
        return t

    k = CompiledKernel(schedules[rank].graph, schedules[rank], weights_of(module, graph, prequantized), device, False,
                       num_warps=num_warps or tgt.num_warps, max_registers=max_registers or tgt.max_registers,
                       peer_visible=peer_visible, profile=profile, watchdog_spins=RANK_WATCHDOG_SPINS)
    group = dist.group.WORLD.group_name
    f32, cnt = (symm_mem.rendezvous(t, group) for t in shared)   # F32, then CNT: allocate's order
    ptrs = []
    for p in range(gpus - 1):
        q = (rank + 1 + p) % gpus
        ptrs += [f32.buffer_ptrs[q], cnt.buffer_ptrs[q]]
    k.buffers.PEERS = torch.tensor(ptrs, dtype=torch.int64, device=device)
    k._symmetric = (shared, f32, cnt)      # keep the mappings alive with the kernel
    k.warm_up()     # every rank compiled before any launches: no rank's first waits span a peer's compile
    torch.cuda.synchronize()
    dist.barrier()
    return DistributedKernel(graph, k, rank, gpus)


class DistributedKernel:
    """This process's rank: `step` and `generate` as CompiledKernel's, with the same results on every
    rank (the logits gathered from the ranks' vocabulary shards)."""

    def __init__(self, graph, kernel: CompiledKernel, rank: int, ranks: int):
        self.ir, self.kernel, self.rank, self.ranks = graph, kernel, rank, ranks
        self.vocab = graph.by_name()[graph.output.inputs[0]].type.shape[0]
        self.max_pos = kernel.max_pos

    @property
    def last_seed(self) -> int | None:
        return getattr(self.kernel, "last_seed", None)

    def step(self, token: int, pos: int) -> tuple[torch.Tensor, int]:
        import torch.distributed as dist
        logits, tok = self.kernel.step(token, pos)
        parts = [None] * self.ranks
        dist.all_gather_object(parts, logits.cpu())
        return torch.cat(parts), tok

    def check_generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, eos) -> None:
        CompiledKernel.check_generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, eos)

    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k=None, top_p=None,
                 seed: int | None = None, eos_token_id: int | list[int] | None = None, on_token=None,
                 on_prefill=None) -> list[int]:
        """Every rank generates in one launch, in lockstep (the same seed on every rank: rank 0's);
        tokens stream from rank 0 (`on_token` and `on_prefill` are called there only)."""
        import torch.distributed as dist
        prompt_ids = prompt_ids_of(prompt_ids)
        self.check_generate(prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id)
        if seed is None:
            box = [int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF]
            dist.broadcast_object_list(box, src=0)
            seed = box[0]
        k = self.kernel
        k.vocab = self.vocab       # (the prompt, EOS and filters are over the whole vocabulary)
        if k.needs_filter(temperature, top_k or 0, 1.0 if top_p is None else top_p):
            k.warm_up(filtered=True)    # the top-k / top-p variant's first use: compiled on every rank first
            dist.barrier()
        return k.generate(prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                          eos_token_id=eos_token_id, on_token=on_token if self.rank == 0 else None,
                          on_prefill=on_prefill if self.rank == 0 else None)

    def reset(self) -> None:
        self.kernel.reset()

    def memory_bytes(self) -> dict[str, int]:
        return self.kernel.memory_bytes()


def ranks_on(gpus: int, interpret: bool = False, one_gpu: bool = False) -> str:
    """Where G ranks ran, in words."""
    if interpret:
        return "one process, interpreter"
    if one_gpu:
        return "one process, one GPU"
    if torch.cuda.device_count() < gpus:
        return f"{gpus} processes sharing {torch.cuda.device_count()} GPU(s)"
    return f"{gpus} processes, one GPU each"
