"""CPU replay of a profiled step with an explicit wait model, for schedules whose waits differ (run it
with this tree on PYTHONPATH and with its parent's, on the same stamps): a task starts h0 us after its
program's previous task, acquires its waits in table order, each r us after the previous acquire or n us
after its event's last producer ends, then runs its measured body; a task that publishes twice holds its
program `second publish` us longer.

    PYTHONPATH=. python experiments/wait_model_replay.py docs/results/2026-12-02/task-times-05b-1024.npz
"""
import sys

from kogc.analysis.stamps import load_stamps, schedule_for, check_fits, body_us
from kogc.scheduler.check import run_order

path = sys.argv[1]
ids, ts, meta = load_stamps(path)
s = schedule_for(meta)
check_fits(s, ids, path)
body = body_us(s, ids, ts)
tasks, events = s.tasks, s.events
prog = {tid: p for p, q in enumerate(s.queues) for tid in q}
order = run_order(tasks, events, s.queues)
pubs = lambda t: (t.group,) + ((t.publish_too,) if getattr(t, "publish_too", -1) >= 0 else ())
nw = sum(len(t.waits) for t in tasks)
print(path.split('/')[-1], "waits", nw, "measured span %.1f" % ((ts[:, 2].max() - ts[:, 0].min()) / 1e3))
for h0, r, n, pub2 in [(0.2, 0.7, 0.5, 0.0), (0.2, 0.75, 0.5, 0.0), (0.25, 0.6, 0.5, 0.0), (0.2, 0.7, 0.5, 0.7)]:
    done = [0.0] * len(events)
    last = {}
    end = [0.0] * len(tasks)
    for tid in order:
        t = tasks[tid]
        x = last.get(prog[tid], 0.0) + h0
        for g, _ in t.waits:
            x = max(x + r, done[g] + n)
        e = x + body[tid]
        end[tid] = e
        last[prog[tid]] = e + (pub2 if getattr(t, "publish_too", -1) >= 0 else 0.0)
        for g in pubs(t):
            done[g] = max(done[g], e)
    print(f"  h0 {h0} r {r} n {n} second publish {pub2}: {max(end):.1f} us")
