"""Delayed tensor parallelism in one process: G ranks' kernels, each with its own buffers, storing into
each other's receive buffers through a table of peer addresses (`Buffers.PEERS`).

Two ways to run them without G GPUs, for tests and for measuring the protocol:
- under Triton's interpreter (CPU): each rank's one queue is cut before every wait on a peer
  (kogc.scheduler.ranks); the segments run one launch at a time, a rank's next one as soon as the
  sends it waits for have run on every peer;
- on ONE GPU: every rank's persistent kernel on its own stream with its share of the programs, the
  same flag protocol and memory scopes as across GPUs.
(Across GPUs, one process per rank: kogc.runtime.distributed.)
"""
from __future__ import annotations

import os

import torch

from ..errors import KogcError
from ..ir.graph import Graph, Op
from ..request import as_index, prompt_ids_of, stop_ids
from ..scheduler import Schedule
from .kernel import CompiledKernel, KernelHangError


def link_peers(kernels: list[CompiledKernel]) -> None:
    """Give every rank its peers' F32 and CNT addresses (peer p of rank r is rank (r + 1 + p) % G)."""
    G = len(kernels)
    for r, k in enumerate(kernels):
        ptrs = []
        for p in range(G - 1):
            q = kernels[(r + 1 + p) % G].buffers
            ptrs += [q.F32.data_ptr(), q.CNT.data_ptr()]
        k.buffers.PEERS = torch.tensor(ptrs or [0, 0], dtype=torch.int64, device=k.buffers.F32.device)


def copy_lane_groups(graph: Graph, tensors: dict[str, torch.Tensor], ranks: int) -> None:
    """In place: in every laned weight or cache of `graph` found in `tensors` by its source's name, every rank's
    lanes made a copy of rank 0's: the model a mirrored rank 0 computes (mirror_rank). A Laneformer's laned
    tensors hold their lanes first; an ordinary decoder cut into lanes (`to_ir(model, gpus=G)`,
    kogc.ir.lanes) sees its tensors through views, so rank 0's KV heads, query heads and MLP slice are copied
    over the others' places in the model's own tensors (`lane_places`)."""
    L = graph.meta["num_lanes"]
    if L == 1:
        raise KogcError(f"--gpus {ranks} --mirror: the model has one lane; cut it into lanes first "
                        f"(to_ir(model, gpus={ranks}))")
    g = L // ranks
    with torch.no_grad():
        for n in graph.nodes:
            if n.op not in (Op.PARAM, Op.STATE) or n.type is None or n.type.lanes != L:
                continue
            name = n.attrs.get("source", n.attrs["name"])
            if name not in tensors:
                continue
            t = tensors[name]
            view = n.attrs.get("view", [])
            if not view and t.shape[0] == L:       # a Laneformer's, lanes first: slices, no index of every element
                for q in range(1, ranks):
                    t[q * g:(q + 1) * g] = t[:g]
                continue
            places = lane_places(t, view, name)                             # flat indices into t
            if places.shape[0] != L or not t.is_contiguous():
                raise KogcError(f"{name}: its {L} lanes are not its first dimension ({tuple(t.shape)}) nor a view "
                                f"of it: its lane groups cannot be copied for a mirrored rank")
            flat = t.view(-1)
            for q in range(1, ranks):
                flat[places[q * g:(q + 1) * g].reshape(-1)] = flat[places[:g].reshape(-1)]


def lane_places(t: torch.Tensor, view, name: str) -> torch.Tensor:
    """Where each element of a laned view ([L, ...], kogc.ir.views) lies in its source tensor `t`: the view's steps
    applied to t's flat indices, on t's device (its value steps, a scale or an offset, move nothing)."""
    from ..ir.views import derive_step
    places = torch.arange(t.numel(), device=t.device).reshape(t.shape)
    for step in view:
        if step[0] == "lane_first":
            raise KogcError(f"{name}: a bias kept on the first lane (added once to the lanes' sum) would be added "
                            f"by every mirrored peer: --mirror does not take a model with one")
        if step[0] not in ("scale", "offset"):
            places = derive_step(places, step)
    return places


def mirror_rank(schedules: list[Schedule], weights: dict[str, torch.Tensor], device: str, interpret: bool,
                **kernel_options) -> CompiledKernel:
    """Rank 0 of G alone on this device, every peer mirrored by the rank itself: its peer table names its
    own receive buffers and counters G - 1 times, so each send fills every slot of its own receive buffer
    and counts as all G - 1 peers' (kogc.scheduler.ranks.mirrored, which proves the rank runs so). It
    computes the model whose G lane groups are copies of rank 0's (its vocabulary shard's logits; its token
    that shard's best), and times one GPU's share of a G-GPU step with free exchanges and peers in
    perfect step: the fastest G GPUs can run this schedule. For `kogc bench --gpus G --mirror`."""
    from ..scheduler.ranks import mirrored
    s = schedules[0]
    as_one_gpu = mirrored(s)                 # (proves the mirror before anything is built)
    k = CompiledKernel(s.graph, s, weights, device, interpret, **kernel_options)
    k.stamps_schedule = as_one_gpu
    own = [k.buffers.F32.data_ptr(), k.buffers.CNT.data_ptr()]
    k.buffers.PEERS = torch.tensor(own * (s.ranks - 1), dtype=torch.int64, device=k.buffers.F32.device)
    return k


class RankedKernel:
    """`step(token, pos)` and `generate(...)` over G ranks (the lanes spread over them, the LM head cut
    into vocabulary shards); the same results as the one-GPU kernel."""

    def __init__(self, graph: Graph, schedules: list[Schedule], weights: dict[str, torch.Tensor], device: str,
                 interpret: bool, watchdog_spins: int | None = None, num_warps: int | None = None,
                 max_registers: int | None = None, profile: bool | str = False):
        self.ir, self.schedules, self.interpret = graph, schedules, interpret
        self.device = torch.device(device)
        self.kernels = [CompiledKernel(s.graph, s, weights, device, interpret, watchdog_spins=watchdog_spins,
                                       num_warps=num_warps, max_registers=max_registers, cooperative=False,
                                       profile=profile)
                        for s in schedules]
        link_peers(self.kernels)
        self.ranks = len(schedules)
        self.vocab = graph.by_name()[graph.output.inputs[0]].type.shape[0]
        for k in self.kernels:      # (a rank's kernel holds a shard: the checks and filters are over all ids)
            k.vocab = self.vocab
        self.max_pos = self.kernels[0].max_pos
        self.epoch = 0
        self.streams = None
        if not interpret:
            self.streams = [torch.cuda.Stream(self.device) for _ in self.kernels]
            self._warm()

    # ------------------------------------------------------------------ one GPU
    def _warm(self) -> None:
        """Load every rank's kernel on its stream before a launch that needs them all at once (a first
        launch on a stream is slow, and one that loads its module while another spins can wait for it)."""
        for k, s in zip(self.kernels, self.streams):
            with torch.cuda.stream(s):
                k.launch(0, 0, nsteps=0, epoch0=1)
        torch.cuda.synchronize(self.device)

    def _launch_all(self, token: int, pos: int, nsteps: int = 1, **kw) -> None:
        epoch0 = self.epoch + 1
        self.epoch += nsteps
        caller = torch.cuda.current_stream(self.device)
        for k, s in zip(self.kernels, self.streams):
            k.epoch = self.epoch
            # after the caller's work: a kernel still running there (an eager reference's graph replay) holds
            # SMs, and a rank's programs that cannot all be resident beside it wait for peers that cannot start
            s.wait_stream(caller)
            with torch.cuda.stream(s):
                k.launch(token, pos, nsteps=nsteps, epoch0=epoch0, **kw)
        for s in self.streams:
            torch.cuda.current_stream(self.device).wait_stream(s)

    # ------------------------------------------------------------------ interpreter
    def _run_segments(self, token: int, pos: int, **kw) -> None:
        """One step: every rank's segments, each as soon as the peers' sends it waits for have run."""
        self.epoch += 1
        done = [0] * self.ranks
        sent: list[set[int]] = [set() for _ in range(self.ranks)]   # per rank: its tasks run this step
        while any(d < len(s.queues) for d, s in zip(done, self.schedules)):
            moved = False
            for r, (k, s) in enumerate(zip(self.kernels, self.schedules)):
                while done[r] < len(s.queues) and self._ready(r, s.queues[done[r]][0], sent):
                    seg = done[r]
                    b = k.buffers
                    view = b.kernel_args()
                    view[1], view[2], view[3] = b.WOFF[seg:], b.TABLE[seg:], b.QLEN[seg:]
                    k.epoch = self.epoch
                    k.launch(token, pos, nsteps=1, grid=(1,), view=view, epoch0=self.epoch, **kw)
                    k.raise_if_stuck()
                    sent[r].update(s.queues[seg])
                    done[r] += 1
                    moved = True
            if not moved:
                raise KernelHangError("the ranks' segments cannot go on: a rank waits for a send no peer makes")

    def _ready(self, r: int, tid: int, sent: list[set[int]]) -> bool:
        s = self.schedules[r]
        for g, _ in s.tasks[tid].waits:
            if g >= s.first_remote:
                x = next(x for x in s.exchanges if x.event == g)
                if any(i not in sent[q] for q in range(self.ranks) if q != r for i in x.sends):
                    return False
        return True

    # ------------------------------------------------------------------ the user's calls
    def _token(self) -> int:
        toks = [int(k.buffers.OUT[0].item()) for k in self.kernels]
        if len(set(toks)) != 1:
            raise KogcError(f"the ranks chose different tokens {toks}: the exchange of keys is broken")
        return toks[0]

    def _run(self, token: int, pos: int, **kw) -> None:
        if self.interpret:
            self._run_segments(token, pos, **kw)
        else:
            self._launch_all(token, pos, **kw)
            torch.cuda.synchronize(self.device)
            for k in self.kernels:
                k.raise_if_stuck()

    def step(self, token: int, pos: int) -> tuple[torch.Tensor, int]:
        """One decode step on every rank: (the whole logits [V], gathered from the ranks' shards; the token)."""
        token, pos = as_index(token, "token"), as_index(pos, "position")
        self.kernels[0].check_inputs(token, pos)
        self._run(token, pos)
        logits = torch.cat([k.logits_view for k in self.kernels]).clone()
        return logits, self._token()

    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos_token_id: int | list[int] | None = None,
                 on_token=None, on_prefill=None) -> list[int]:
        """As CompiledKernel.generate: on a GPU the new tokens in ONE launch per rank, every rank in
        lockstep choosing the same token; under the interpreter one step at a time (the same tokens:
        the noise is keyed by step). With top-k / top-p every rank gathers the whole logits (each
        rank's keysend copies its shard to all) and filters them as one GPU does."""
        prompt = prompt_ids_of(prompt_ids)
        self.check_generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id)
        filters = dict(top_k=top_k or 0, top_p=1.0 if top_p is None else top_p)
        for s in self.schedules:
            s.check_step_closure()
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        self.last_seed = seed
        stop = stop_ids(eos_token_id)
        for pos, tok in enumerate(prompt[:-1]):
            self._run(tok, pos)
            if on_prefill is not None:
                on_prefill(pos + 1, len(prompt) - 1)
        if self.interpret:
            out, tok = [], prompt[-1]
            for i in range(max_new_tokens):
                self._run_segments(tok, len(prompt) - 1 + i, step0=i, seed=seed, temperature=temperature, stop=stop,
                                   **filters)
                tok = self._token()
                out.append(tok)
                if on_token is not None:
                    on_token(tok)
                if tok in stop:
                    break
            return out
        for k in self.kernels:
            k.buffers.OUT[:4].zero_()
        epoch0 = self.epoch + 1
        self._launch_all(prompt[-1], len(prompt) - 1, nsteps=max_new_tokens, stop=stop, seed=seed,
                         temperature=temperature, **filters)
        torch.cuda.synchronize(self.device)
        for k in self.kernels:
            k.raise_if_stuck()
        outs = [k.buffers.OUT.tolist() for k in self.kernels]
        done = outs[0][1]
        if any(o[1] != done or o[4:4 + done] != outs[0][4:4 + done] for o in outs):
            raise KogcError("the ranks generated different tokens: the exchange of keys is broken")
        self.epoch = epoch0 + done - 1
        tokens = outs[0][4:4 + done]
        if on_token is not None:
            for t in tokens:
                on_token(t)
        return tokens

    def check_generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, eos) -> None:
        """CompiledKernel.check_generate over the whole vocabulary (a rank's kernel knows its shard)."""
        CompiledKernel.check_generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, eos)

    def reset(self) -> None:
        for k in self.kernels:
            k.reset()

    def memory_bytes(self) -> dict[str, int]:
        """Every rank's buffers, summed by kind."""
        out: dict[str, int] = {}
        for k in self.kernels:
            for name, n in k.memory_bytes().items():
                out[name] = out.get(name, 0) + n
        return out

    def __repr__(self):
        s = self.schedules[0]
        return (f"RankedKernel({self.ir.meta.get('model')}, ranks={self.ranks}, target={s.target.name}, "
                f"device={self.device}, programs per rank={len(s.queues)}, tasks per rank={len(s.tasks)})")
