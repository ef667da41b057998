"""Probe (one NVIDIA GPU): what top-k / top-p sampling costs rank 0 of G, its peers mirrored (one GPU's share of a
G-GPU generation with free exchanges, as `kogc bench --gpus G --mirror` times a step).

A rank gathers the whole vocabulary's logits for a filtered draw, its peers' shards into its receive buffer, and
counts them per 16-bit key before the draw. A mirrored rank's peers are itself, so their shards would never be
written: here that part of the buffer (both step parities) is filled once with random fp16 values of the logits'
spread, which each step's counting reads as it would read its peers'. Each setting generates N tokens in one launch,
R times; the figure is the median ms a token. Tokens are printed so two trees can be compared (the same counts and
draws give the same tokens).

With --profile the kernel records every task's stamps (start, after its waits, end; slower than unprofiled), and each
setting reports its last step: the span, the step's end (final norm, LM head, keysend, count tasks, the draw: us from
the step's first start) and the mean per task kind, and writes that step's stamps to OUT's folder (`kogc analyze`).

    PYTHONPATH=. python experiments/mirror_sampling.py --config laneformer-2b --gpus 8 --out $OUT/mirror-sampling.json

--gpus 1 runs the one-GPU kernel the same ways.
"""
import argparse
import json
import statistics
import time

import torch

import kogc
from kogc.analysis.stamps import save_stamps
from kogc.frontend.model_file import build_model
from kogc.runtime.profile import summarize, timestamps
from kogc.scheduler.tasks import A_TERM, A_TERM_STRIDE

SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=50, top_p=0.9), dict(temperature=0.8, top_p=0.9)]
TAIL_KINDS = ("final_norm", "matvec/plain/store_argmax", "keysend", "count", "argmax")     # the step's end, in order


def step_end(ck) -> dict:
    """The last step's end from a profiled kernel's stamps: per tail kind, the first start, the last end of its
    waits and the last end (us from the step's first start), and the mean wait and body."""
    ids, ts = timestamps(ck)
    tasks = getattr(ck, "stamps_schedule", ck.schedule).tasks
    out = {}
    for k in TAIL_KINDS:
        js = [j for j, t in enumerate(ids) if tasks[t].kind_key == k]
        if js:
            r = ts[js] / 1e3
            out[k] = {"tasks": len(js), "first_start": float(r[:, 0].min()), "last_waited": float(r[:, 1].max()),
                      "last_end": float(r[:, 2].max()), "wait_mean": float((r[:, 1] - r[:, 0]).mean()),
                      "body_mean": float((r[:, 2] - r[:, 1]).mean())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="laneformer-2b")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true", help="stamp every task; report each setting's last step")
    a = ap.parse_args()
    model = build_model("examples/laneformer.py", a.config, device="cuda", dtype=torch.float16)
    if a.gpus == 1:     # the one-GPU kernel, for comparison
        ck = kogc.compile(model, profile=a.profile)
    else:
        ck = kogc.compile(model, gpus=a.gpus, one_gpu="mirror", profile=a.profile)
        argmax = next(t for t in ck.schedule.tasks if t.kind == "argmax")
        whole, vocab = argmax.args[A_TERM], argmax.args[A_TERM_STRIDE]
        g = torch.Generator(device="cuda").manual_seed(0)
        fill = (torch.randn(2 * vocab, device="cuda", generator=g) * 2.0).half()     # (the logits as stored)
        ck.buffers.F32[whole:whole + vocab].view(torch.float16)[:] = fill
    out = {"config": a.config, "gpus": a.gpus, "tokens": a.tokens, "device": torch.cuda.get_device_name(),
           "counts_tasks": sum(t.kind == "count" for t in ck.schedule.tasks), "runs": []}
    for kw in SETTINGS:
        times, toks = [], None
        for r in range(a.reps + 1):             # the first: compiles the kernel (with the filter code if needed)
            ck.reset()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = ck.generate([1, 2, 3], a.tokens, seed=1, **kw)
            torch.cuda.synchronize()
            if r:
                times.append((time.perf_counter() - t0) * 1e3 / len(got))
            toks = got
        row = {**kw, "ms_per_token": statistics.median(times), "all_ms": times, "tokens": toks[:32]}
        if a.profile:
            row["step_span_us"] = summarize(ck)["span_us"]
            row["step_end"] = step_end(ck)
            name = "greedy" if not kw["temperature"] else "-".join(f"{k}{v}" for k, v in kw.items())
            row["task_times"] = save_stamps(ck, f"{a.out.rsplit('.', 1)[0]}-{name}.npz", model_file="examples/laneformer.py",
                                            preset=a.config)
            for k, v in row["step_end"].items():
                print(f"  {k:26} x{v['tasks']:<5} start {v['first_start']:7.1f}  waited {v['last_waited']:7.1f}  end "
                      f"{v['last_end']:7.1f} us  (mean wait {v['wait_mean']:.2f}, body {v['body_mean']:.2f})", flush=True)
        out["runs"].append(row)
        print(f"{kw}: {row['ms_per_token']:.4f} ms/token ({1e3 / row['ms_per_token']:.0f} tok/s), first tokens "
              f"{toks[:8]}", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
