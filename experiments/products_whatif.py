"""CPU what-if on a "detail" profile: how much shorter would the step be if the matvecs' products were faster?
Replays the schedule as it ran (kogc.analysis.longest_path with the measured bodies, start overheads and
notify latency) with each matvec task's products (its detail stamps: operands arrived -> before the publish)
scaled by F. The question for FP8 weights, whose products take 1.9-2.8x fp16's per task (docs/fp8.md):
what would a form with half the instructions per weight buy? An upper bound for one program's faster
products: three programs share an SM's schedulers (docs/design.md: an mma from registers was a third shorter
for one program, no faster for three).

    python experiments/products_whatif.py docs/results/2026-12-03/task-times-2b-fp8-detail.npz
"""
import sys

from kogc.analysis import body_us, load_stamps, longest_path, measured_overheads, schedule_for


def main(path: str) -> None:
    ids, ts, meta = load_stamps(path)
    if ts.shape[1] < 5:
        sys.exit(f"{path}: not a detail profile (kogc bench --profile detail --task-times FILE)")
    s = schedule_for(meta)
    body = body_us(s, ids, ts)
    over, notify = measured_overheads(s, ids, ts)
    base = longest_path(s, body, notify, True, over)[0]
    products = [0.0] * len(s.tasks)
    for j, tid in enumerate(ids):
        if s.tasks[tid].kind == "matvec" and ts[j, 3] > 0 and ts[j, 4] > 0:
            products[tid] = (ts[j, 4] - ts[j, 3]) / 1e3
    timed = sum(p > 0 for p in products)
    print(f"measured step {(ts[:, 2].max() - ts[:, 0].min()) / 1e3:.1f} us, replayed {base:.1f} us; {timed} matvec "
          f"tasks with their products timed, {sum(products) / len(s.queues):.1f} us of products a program")
    for f in (0.75, 0.5, 0.0):
        b = [x - (1 - f) * p for x, p in zip(body, products)]
        r = longest_path(s, b, notify, True, over)[0]
        print(f"products x{f:g}: {r:.1f} us ({(r / base - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1])
