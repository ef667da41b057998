"""A compiled model: the generated kernel, its buffers, and `step(token, pos)`."""
from __future__ import annotations

import contextlib
import os
import threading
import time

import torch

from ..codegen.loader import interpreter, load_kernel
from ..codegen.render import render
from ..errors import KogcError
from ..ir.graph import Graph, Op
from ..request import as_index, check_request, prompt_ids_of, stop_ids
from ..scheduler import Schedule
from ..scheduler.tasks import MAX_STOP, REMOTE_BIT
from .buffers import Buffers, allocate


class KernelHangError(RuntimeError):
    """A wait in the kernel passed its watchdog bound: names the task and the counter."""


class CompiledKernel:
    """`step(token, pos)` runs one decode step in ONE launch; returns (logits, next token)."""

    def __init__(self, graph: Graph, schedule: Schedule, weights: dict[str, torch.Tensor], device: str,
                 interpret: bool, watchdog_spins: int | None = None, profile: bool | str = False,
                 num_warps: int | None = None, max_registers: int | None = None, cooperative: bool = True,
                 peer_visible=None):
        if profile not in (False, True, "detail"):
            raise KogcError(f"profile must be False, True or 'detail', got {profile!r}")
        if profile and (interpret or not schedule.target.timer_asm):
            where = "under the interpreter" if interpret else f"on {schedule.target.name}"
            raise KogcError(f"profiling needs a GPU timer: not available {where}")
        self.ir, self.schedule, self.device, self.interpret = graph, schedule, torch.device(device), interpret
        # the schedule its profile's stamps are read against: its own, or a mirrored rank's one-GPU reading
        # (kogc.runtime.ranks.mirror_rank)
        self.stamps_schedule = schedule
        self.source = render(schedule, interpret=interpret)
        self.kernel, self.source_path = load_kernel(self.source, interpret)
        self.profile = profile
        self.num_warps = num_warps or schedule.target.num_warps
        self.buffers: Buffers = allocate(schedule, weights, self.device, profile, peer_visible)
        self.epoch = 0
        # a spin is ~1 us on the GPU (an L2 round trip); under the interpreter nothing should ever spin
        self.watchdog_spins = watchdog_spins or (2_000 if interpret else 4_000_000)
        out = graph.output
        self._logits = out.inputs[0]
        self.max_pos = schedule.max_pos or 1 << 30
        self.vocab = graph.by_name()[self._logits].type.shape[0]
        # fixed for every launch: computed once (launch runs once per token in a step loop)
        self._grid = (schedule.num_programs,)
        self._launch_options = dict(MAXLEN=self.buffers.TABLE.shape[1], ROW=self.buffers.TABLE.shape[2],
                                    PROFILE=2 if profile == "detail" else int(profile),
                                    SAMPLE_EV=schedule.sample_event)
        if not interpret:
            # cooperative: the driver refuses a grid whose programs cannot all be resident at once (the
            # spin waits need that). Several ranks on one GPU share it: each grid is sized to its share
            # and launched plainly (kogc.runtime.ranks)
            self._launch_options.update(num_warps=self.num_warps, launch_cooperative_grid=cooperative)
            if max_registers:   # ptxas cap: fewer registers per thread lets more programs share an SM
                self._launch_options["maxnreg"] = max_registers

    @property
    def logits_view(self) -> torch.Tensor:
        _, off, per_lane, _ = self.schedule.layout.slots[self._logits]
        return self.buffers.ACT[off:off + per_lane]

    def check_inputs(self, token: int, pos: int) -> None:
        """token and pos in range (integers: as_index)."""
        if not 0 <= token < self.buffers.EMB.shape[0]:
            raise KogcError(f"token {token} is outside the vocabulary [0, {self.buffers.EMB.shape[0]})")
        if not 0 <= pos < self.max_pos:
            raise KogcError(f"position {pos} is outside the KV cache [0, {self.max_pos})")

    def launch(self, token: int, pos: int, nsteps: int = 1, stop: tuple[int, ...] = (), seed: int = 0,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, out: torch.Tensor | None = None,
               host_poll: bool = False, step0: int = 0, grid=None, view=None, epoch0: int | None = None) -> None:
        """Enqueue `nsteps` decode steps in one launch, from `token` at `pos` (no host synchronisation,
        no checks: see `step` and `generate`). Epochs advance by `nsteps`; after an early stop at one of
        the `stop` ids `generate` sets them to the steps actually run. host_poll: the host reads `out` while
        the kernel runs (each step's count is then published system-wide, which costs the step a MEMBAR.SYS).
        step0: the first step's number for the sampling noise (a generation cut into launches).
        grid, view: a launch of part of the queues (kogc.runtime.ranks: one segment under the
        interpreter) with the tensor arguments `view` gives for it, and `epoch0` the step's epoch (the
        counters do not advance: the caller advances them once per step)."""
        if self.interpret and nsteps > 1 and len(self.schedule.queues) > 1:
            # (program 0 would run all its steps before program 1 ran its first, and wait on it at a step's end)
            raise KogcError(f"under Triton's interpreter a launch's programs run one after another, so a launch of "
                            f"{nsteps} steps needs one queue, and this schedule has {len(self.schedule.queues)} (a "
                            f"mirrored rank's, cut before each wait on its peers): launch one step at a time")
        if epoch0 is None:
            epoch0 = self.epoch + 1
            self.epoch += nsteps
        stops = [int(t) for t in stop] + [-1] * (MAX_STOP - len(stop))
        args = self.buffers.kernel_args(out) if view is None else view
        with interpreter(self.interpret) if self.interpret else contextlib.nullcontext():
            self.compiled = self.kernel[grid or self._grid](
                *args, int(token), int(pos), epoch0, self.watchdog_spins, int(nsteps), *stops, int(seed),
                float(temperature), int(top_k), float(top_p), int(host_poll), int(step0),
                FILTER=int(self.needs_filter(temperature, top_k, top_p)), **self._launch_options)

    def warm_up(self, filtered: bool = False) -> None:
        """Compile the variant with (`filtered`) or without the top-k / top-p code now, without launching it
        (Triton compiles a variant at its first launch, which would then wait for it): ranks compile before
        they start their peers' waits (kogc.runtime.distributed). Nothing to do under the interpreter."""
        if self.interpret:
            return
        stops = [-1] * MAX_STOP    # the scalars' values do not matter: none is specialised on (the template)
        self.kernel.warmup(*self.buffers.kernel_args(), 0, 0, 1, self.watchdog_spins, 1, *stops, 0, 1.0, 0, 1.0, 0, 0,
                           grid=self._grid, FILTER=int(filtered), **self._launch_options)

    def needs_filter(self, temperature: float, top_k: int, top_p: float) -> bool:
        """Whether a launch samples with top-k or top-p (the kernel with that code, compiled on first use:
        greedy and plain-temperature launches run one without it); the kernel's own test is _filters, on the
        fp32 values it receives: a top_p of 0.99999999 is 1.0 there, and the LM head of a kernel with the code
        counts its logits for a draw that would then not come, leaving its counts to the next one."""
        # (rounded to nearest even: fp32 1.0 from 1 - 2^-25 up, 0.0 up to 2^-150)
        return temperature > 2.0 ** -150 and (0 < top_k < self.vocab or top_p < 1.0 - 2.0 ** -25)

    def step(self, token: int, pos: int) -> tuple[torch.Tensor, int]:
        """One decode step in ONE launch: (logits [V] in the model's dtype, argmax token)."""
        token, pos = as_index(token, "token"), as_index(pos, "position")
        self.check_inputs(token, pos)
        if self.buffers.ERR[0].item() != 0:
            raise KernelHangError("an earlier launch stopped on a stuck wait; compile again")
        self.launch(token, pos)
        self.raise_if_stuck()
        return self.logits_view.clone(), int(self.buffers.OUT[0].item())

    def raise_if_stuck(self) -> None:
        """Raise KernelHangError if a wait of the last launch hit its watchdog (syncs with the device)."""
        err = self.buffers.ERR.tolist()
        if err[0] == 0:
            return
        pid, slot, ev, seen, need = err[1:6]
        ev &= REMOTE_BIT - 1    # (a count peers raise is marked in the table)
        if slot < 0:
            raise KernelHangError(f"wait timed out: program {pid} at a step boundary waited on event {ev} "
                                  f"({self.schedule.events[ev].name}, the sampled token): counter {seen}, needed {need}")
        tid = self.schedule.queues[pid][slot]
        t = self.schedule.tasks[tid]
        s = self.schedule
        what = s.events[ev].name
        if s.first_remote is not None and ev >= s.first_remote:    # counted by the peers' sends
            peers = [(s.rank + 1 + p) % s.ranks for p in range(s.ranks - 1)]
            what += f", raised by ranks {peers}: one of them stopped or is behind"
        where = f"rank {s.rank}: " if s.ranks > 1 else ""
        raise KernelHangError(
            f"{where}wait timed out: program {pid}, queue slot {slot}, task {tid} ({t.kind} of {t.op}, lane {t.lane}) "
            f"waited on event {ev} ({what}): counter {seen}, needed {need}")

    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos_token_id: int | list[int] | None = None,
                 on_token=None, on_prefill=None) -> list[int]:
        """Prefill `prompt_ids` (one launch per prompt token but the last), then produce up to
        `max_new_tokens` tokens in ONE launch: LM head, sampling and the EOS test run on the GPU and
        each step starts from the token the previous one sampled. Returns the new ids (ending with
        the EOS token if one was produced: `eos_token_id` one id or up to MAX_STOP, as a model's
        generation_config names them). The sequence starts at position 0 (the KV cache is reused).

        temperature 0 is greedy (ties to the lowest id); otherwise softmax(logits / temperature),
        restricted to the top_k largest logits and then to the top_p nucleus if given. The same
        `seed` gives the same tokens (Philox keyed by seed and step); None draws one (self.last_seed).

        `on_token(token)` is called for every new token as the kernel produces it: on a GPU it writes them
        to pinned host memory, which the host polls; under the interpreter the launch runs in a worker
        thread while this one watches the token record. `on_prefill(done, total)` is called after each
        prefill launch (under the interpreter each takes seconds)."""
        prompt = prompt_ids_of(prompt_ids)
        self.check_generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id)
        self.schedule.check_step_closure()     # proved once per schedule
        for pos, tok in enumerate(prompt[:-1]):
            self.launch(tok, pos)
            if on_prefill is not None:
                on_prefill(pos + 1, len(prompt) - 1)
        streamed = on_token is not None and self.device.type == "cuda"
        watched = on_token is not None and not streamed
        out_buf = self._host_out() if streamed else self.buffers.OUT
        out_buf[:4].zero_()
        epoch0 = self.epoch + 1
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        self.last_seed = seed

        def launch():
            self.launch(prompt[-1], len(prompt) - 1, nsteps=max_new_tokens, stop=stop_ids(eos_token_id), seed=seed,
                        temperature=temperature,
                        top_k=top_k or 0, top_p=1.0 if top_p is None else top_p, out=out_buf, host_poll=streamed)
        if watched:
            _run_watched(launch, out_buf, on_token)
        else:
            launch()
            if streamed:
                done = torch.cuda.Event()
                done.record()
                _hand_on_tokens(out_buf, on_token, lambda: not done.query(), 50e-6)
        self.raise_if_stuck()
        out = out_buf.tolist()
        done = out[1]
        self.epoch = epoch0 + done - 1       # counters advanced only for the steps that ran
        return out[4:4 + done]

    def _host_out(self) -> torch.Tensor:
        """The token record in pinned host memory, written by the kernel through the mapping."""
        if getattr(self, "_pinned_out", None) is None:
            self._pinned_out = torch.zeros(self.buffers.OUT.numel(), dtype=torch.int32, pin_memory=True)
        return self._pinned_out

    def check_generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, eos) -> None:
        """Refuse, before anything launches, what `generate` cannot do (KogcError naming it)."""
        vocab = self.vocab
        check_request(prompt, max_new_tokens, temperature, top_k, top_p, seed, eos)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise KogcError(f"prompt id {bad[0]} is outside the vocabulary [0, {vocab})")
        if len(prompt) + max_new_tokens > self.max_pos:
            raise KogcError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) = "
                            f"{len(prompt) + max_new_tokens} tokens do not fit the KV cache of {self.max_pos}")
        for t in stop_ids(eos):
            if not 0 <= t < vocab:
                raise KogcError(f"eos_token_id {t} is outside the vocabulary [0, {vocab})")

    def reset(self) -> None:
        """Forget the KV cache (a new sequence). Counters stay monotonic."""
        self.buffers.KV.zero_()

    def memory_bytes(self) -> dict[str, int]:
        return self.buffers.nbytes()

    def __repr__(self):
        return (f"CompiledKernel({self.ir.meta.get('model')}, target={self.schedule.target.name}, "
                f"device={self.device}, programs={len(self.schedule.queues)}, tasks={len(self.schedule.tasks)})")


def weights_of(module: torch.nn.Module, graph: Graph, prequantized: dict | None = None) -> dict:
    """Every PARAM's tensor by its name; a PARAM that is a view of a parameter (attrs "source", "view":
    a transposed, row-sliced or reordered weight from kogc.frontend.aten) derived from it. A parameter
    in `prequantized` (kogc.fp8.Fp8Weight by the module's parameter name) is taken from there: as it is
    where the kernel streams it as a matvec weight, dequantized where it is read in the model's dtype
    (a tied embedding; or as its `keep` values say)."""
    from ..fp8 import matvec_params, named_tensors, same_tensor
    from ..ir.views import derive_step
    params = named_tensors(module)
    prequantized = prequantized or {}
    unknown = sorted(set(prequantized) - set(params))
    if unknown:
        raise KogcError(f"pre-quantized weight {unknown[0]}: the model has no parameter of that name")
    out = {}
    streamed = matvec_params(graph) if prequantized else set()
    # (a tied parameter may reach the IR under its other name)
    prequantized = {a: w for k, w in prequantized.items() for a in same_tensor(params, k)}
    for n in graph.nodes:
        if n.op is Op.PARAM:
            source = n.attrs.get("source", n.attrs["name"])
            if source in prequantized and n.attrs["name"] in streamed:
                out[n.attrs["name"]] = _fp8_view(prequantized[source], n.attrs.get("view", ()), source)
                continue
            t = prequantized[source].read_as(params[source].dtype) if source in prequantized else params[source]
            for step in n.attrs.get("view", ()):
                t = derive_step(t, step)
            out[n.attrs["name"]] = t
    return out


def _fp8_view(w, steps, name: str):
    """A pre-quantized weight seen through the IR's view of it: the values and each value's scale take
    the same steps; the scales must still be one per row of the view (a transposed use is refused)."""
    from ..fp8 import Fp8Weight
    from ..ir.views import derive_step
    q = w.q.view(torch.uint8)
    s = w.scale.float()[..., None].expand(w.q.shape)
    keep = w.keep
    for step in steps:
        if step[0] == "scale":      # a constant folded into the weight: into its scales, exactly as given
            s = s * step[1]
            keep = None if keep is None else derive_step(keep, step)
            continue
        q, s = derive_step(q, step), derive_step(s, step)
        keep = None if keep is None else derive_step(keep, step)
    if q.dim() < 2 or not torch.equal(s.amax(-1), s.amin(-1)):
        raise KogcError(f"pre-quantized weight {name}: the model uses it with its rows' scales across its "
                        f"inputs (view {list(steps)}); kogc needs one scale per output row")
    return Fp8Weight(q.contiguous().view(w.q.dtype), s[..., 0].contiguous(), keep)


def kv_cache_buffers(graph, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's KV-cache buffers by name ([..., positions, head_dim]): those its IR reads as state. The
    one definition of a cache: buffer names vary (the Laneformer's `k_cache`, a cache module's `k`,
    transformers' `k_cache_0`)."""
    names = {n.attrs["name"] for n in graph.nodes if n.op is Op.STATE}
    return {name: buf for name, buf in module.named_buffers() if name in names}


def random_kv_rows(caches: dict[str, torch.Tensor], context: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random keys and values (standard normal, drawn from `gen`, in the caches' order) for positions
    0..context-1 of these caches (kv_cache_buffers), by name: the realistic cache every benchmark times
    its stacks on."""
    return {name: torch.randn(buf.narrow(-2, 0, context).shape, generator=gen).to(buf.dtype)
            for name, buf in caches.items()}


def randomize_kv(caches: dict[str, torch.Tensor], context: int, gen: torch.Generator) -> None:
    """random_kv_rows written into positions 0..context-1 of the caches."""
    for name, rows in random_kv_rows(caches, context, gen).items():
        caches[name].narrow(-2, 0, context).copy_(rows)


def fill_kv_from(ck: CompiledKernel, module: torch.nn.Module) -> None:
    """Copy the module's KV-cache buffers into the kernel's cache (same [L, kv, S, hd] layout)."""
    from ..ir.views import derive_step
    buffers = dict(module.named_buffers())
    for n in ck.ir.nodes:
        if n.op is Op.STATE:
            _, off, per_lane, lanes = ck.schedule.layout.slots[n.name]
            src = buffers[n.attrs["name"]].detach()
            for step in n.attrs.get("view", ()):     # the kernel's order of a head's dims (kogc.frontend.aten)
                src = derive_step(src, step)
            if lanes:       # one rank's lanes (kogc.ir.shard)
                src = src[n.attrs.get("lane0", 0):n.attrs.get("lane0", 0) + lanes]
            src = src.reshape(-1)
            ck.buffers.KV[off:off + per_lane * max(lanes, 1)].copy_(src.to(ck.buffers.KV.device, ck.buffers.KV.dtype))


def _hand_on_tokens(out_buf: torch.Tensor, on_token, running, every: float) -> None:
    """Call on_token for each token as the kernel records it in `out_buf` (its count at [1], the tokens from
    [4]; host memory the kernel writes while it runs), polling every `every` seconds while running(), then
    the rest once it has stopped."""
    view = out_buf.numpy()
    seen = 0
    while True:
        finished = not running()
        n = int(view[1])
        while seen < n:
            on_token(int(view[4 + seen]))
            seen += 1
        if finished:
            return
        time.sleep(every)


def _run_watched(launch, out_buf: torch.Tensor, on_token) -> None:
    """launch() (a whole generation under the interpreter: minutes for a real model) in a worker thread,
    while this thread hands on each token as the interpreted kernel records it. A launch that raises raises
    here; so does on_token, once the launch has ended (it writes the buffers until then)."""
    failed = []

    def work():
        try:
            launch()
        except BaseException as e:     # handed to the caller's thread
            failed.append(e)
    worker = threading.Thread(target=work, name="kogc-interpreted-launch", daemon=True)
    worker.start()
    try:
        _hand_on_tokens(out_buf, on_token, worker.is_alive, 0.05)
    except Exception:
        worker.join()
        raise
    if failed:
        raise failed[0]


def stored_schedule(ck):
    """The schedule whose weight format a compiled kernel streams: one GPU's kernel's, or rank 0's of the ranks
    on one GPU or of this process's rank (every rank stores its weights alike)."""
    if hasattr(ck, "schedule"):
        return ck.schedule
    if hasattr(ck, "schedules"):
        return ck.schedules[0]
    return ck.kernel.schedule       # (kogc.runtime.distributed.DistributedKernel)
