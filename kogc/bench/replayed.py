"""A model's decode step replayed from one CUDA graph: the references of `kogc check` without a launch per op.

The model as written launches a few hundred small kernels per step (laneformer-2b's example: about 31 ms a step
eager, 15 ms as one graph), which is most of a long check's time. The graph runs the same kernels on the same
buffers, so it is the same reference: it is captured once, then checked bit-equal to eager on two steps, and
eager stays the reference wherever capture fails or that check does not hold."""
from __future__ import annotations

import torch

from .stacks import capture_with_output


class ReplayedStep:
    """step(token, pos) -> (logits, token) of `model`, replayed from one CUDA graph where that gives eager's
    results bit for bit on its first two steps (`how` says which: "CUDA graph", or "eager" and why not)."""

    def __init__(self, model, device: str, reset):
        self.model, self.device, self.graph = model, device, None
        self.how = "eager (no GPU)" if device != "cuda" else "eager"
        if device == "cuda":
            self._try_capture(reset)

    def _try_capture(self, reset) -> None:
        self.tok = torch.zeros((), dtype=torch.long, device="cuda")
        self.pos = torch.zeros((), dtype=torch.long, device="cuda")
        try:
            self.graph, self.out = capture_with_output(self.model, self.tok, self.pos)
        except Exception as e:              # any model whose step cannot be captured keeps eager
            self.how = f"eager (capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]})"
            self.graph = None
            torch.cuda.synchronize()
            reset(self.model)               # the warm-ups before the failed capture wrote position 0
            return
        # the warm-ups and the capture wrote position 0 of the cache; from zeros, two steps both ways (the
        # second at another position than the captured one: a value the capture froze would differ there)
        steps = ((1, 0), (2, 1))
        reset(self.model)
        with torch.no_grad():
            want = [t.clone() for tok, pos in steps for t in self.model(torch.tensor(tok, device="cuda"),
                                                                         torch.tensor(pos, device="cuda"))]
        reset(self.model)
        got = [t for tok, pos in steps for t in self._replay(tok, pos)]
        reset(self.model)
        if len(got) != len(want) or not all(torch.equal(a, b) for a, b in zip(got, want)):
            self.how = "eager (the graph's first two steps differed from eager's)"
            self.graph = None
            return
        self.how = "CUDA graph"

    def _replay(self, token: int, pos: int) -> tuple[torch.Tensor, ...]:
        self.tok.fill_(token)
        self.pos.fill_(pos)
        self.graph.replay()
        return tuple(t.clone() for t in self.out)

    def __call__(self, token: int, pos: int):
        if self.graph is None:
            with torch.no_grad():
                return self.model(torch.tensor(token, device=self.device), torch.tensor(pos, device=self.device))
        return self._replay(token, pos)
