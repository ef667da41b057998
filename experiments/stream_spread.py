"""Does the stream model (kogc.analysis.stream) fit laneformer-2b's mirrored steps with a plain profile's
bodies once each task draws its body from its kind's measured spread (the slowest task of a phase sets when
its consumers start) instead of taking the kind's median?

    PYTHONPATH=. python experiments/stream_spread.py docs/results/2026-12-03/mirror-g8-2b-4e7fc79.npz median,sampled,program

median: every body its kind's median; sampled: drawn from its kind's bodies; program: the median times the
mean ratio of its program's bodies to their kinds' medians in the profile.

The measured steps are the mirror's one-launch figures at 4e7fc79 (docs/multi-gpu.md, the speed model).
Draws are seeded; CPU only, about a minute."""
import sys, time
from collections import defaultdict
import numpy as np
from kogc.analysis import stream
from kogc.analysis.stamps import body_us, load_profiled
from kogc.analysis.ranks import replay_ranks, schedules_for
from kogc.runtime.profile import kind_key
from kogc.scheduler.schedule import context_scale
from kogc.settings import tile_config_for
from kogc.frontend import to_ir
from kogc.frontend.model_file import build_for_tracing
from kogc.targets import get_target

sched, ids, ts, _ = load_profiled(sys.argv[1])
per = {k: np.array(v) for k, v in stream.bodies_by_kind(sched, ids, ts).items()}
med = {k: float(np.median(v)) for k, v in per.items()}
measured_body = body_us(sched, ids, ts)
ratios = defaultdict(list)
for p, q in enumerate(sched.queues):
    for tid in q:
        ratios[p].append(measured_body[tid] / med[kind_key(sched.tasks[tid])])
factor = {p: float(np.mean(r)) for p, r in ratios.items()}
for k, v in sorted(per.items()):
    print(f"{k:32} n={len(v):5} median {np.median(v):.2f} p90 {np.percentile(v, 90):.2f} max {v.max():.2f}")
target = get_target("h200")
model = build_for_tracing("examples/laneformer.py", preset="laneformer-2b")
graph = to_ir(model)
measured = {1: 1.363, 2: 0.898, 4: 0.699, 8: 0.572}
orig = stream._body
for form in sys.argv[2].split(","):
    for G in (1, 2, 4, 8):
        sch = schedules_for(graph, G, target, tile_config_for(model, target, None, gpus=G))
        params = stream.StreamParams(hbm_gbs=target.hbm_read_bw / 1e9)
        params.body_us.update(med)
        if form == "sampled":
            rng = np.random.default_rng(0)
            draw = {}
            def body(t, p, draw=draw, rng=rng):
                key = id(t)
                if key not in draw:
                    v = per.get(kind_key(t))
                    draw[key] = (float(rng.choice(v)) if v is not None else p.default_body_us) * context_scale(t)
                return draw[key]
            stream._body = body
        elif form == "program":
            progof = {id(s.tasks[tid]): p for s in sch for p, q in enumerate(s.queues) for tid in q}
            stream._body = lambda t, p, progof=progof: (p.body_us.get(kind_key(t), p.default_body_us) * context_scale(t)
                                                        * factor.get(progof.get(id(t), 0), 1.0))
        else:
            stream._body = orig
        t0 = time.time()
        us = replay_ranks(sch, params, 0.5)
        print(f"{form:8} G={G}: {us/1e3:.3f} ms vs measured {measured[G]:.3f} ({(us/1e3/measured[G]-1)*100:+.1f}%)  [{time.time()-t0:.0f}s]", flush=True)
