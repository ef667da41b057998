"""CPU what-if on a profiled step: how much shorter would the step be if attention's bodies were shorter?
Replays the schedule as it ran (kogc.analysis.longest_path with the measured bodies, start overheads and
notify latency) with the bodies of the splits that combined (per KV head, the split with the longest body
among those writing the same output: the last to arrive combines) cut by C us, and/or every split cut by
A us. For one-lane models, where attention is on the chain.

    python experiments/attention_whatif.py docs/results/2026-12-02/task-times-llama-3.2-1b-1024-4d7398e.npz
"""
import sys
from collections import defaultdict

from kogc.analysis import body_us, load_stamps, longest_path, measured_overheads, schedule_for


def main(path: str) -> None:
    ids, ts, meta = load_stamps(path)
    s = schedule_for(meta)
    body = body_us(s, ids, ts)
    over, notify = measured_overheads(s, ids, ts)
    base = longest_path(s, body, notify, True, over)[0]
    att = [t.id for t in s.tasks if t.kind == "attention"]
    by_output = defaultdict(list)
    for i in att:
        by_output[repr(s.tasks[i].writes[-1])].append(i)
    combiners = [max(group, key=body.__getitem__) for group in by_output.values()]
    print(f"measured step {(ts[:, 2].max() - ts[:, 0].min()) / 1e3:.1f} us, replayed {base:.1f} us; "
          f"{len(att)} attention tasks, {len(combiners)} combining")
    for cut_combiner, cut_all in ((1.5, 0), (3.0, 0), (0, 1.0), (3.0, 1.0)):
        b = list(body)
        for i in combiners:
            b[i] = max(0.5, b[i] - cut_combiner)
        for i in att:
            b[i] = max(0.5, b[i] - cut_all)
        r = longest_path(s, b, notify, True, over)[0]
        print(f"combining splits -{cut_combiner:g} us, every split -{cut_all:g} us: {r:.1f} us "
              f"({(r / base - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1])
