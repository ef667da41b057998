"""scripts/window_replay.py: the out-of-order what-if replays its in-order case exactly and stays
within the chain and balance bounds for wider windows and a shared list."""
import os
import sys

from conftest import tiny

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import critical_path as cp  # noqa: E402
import window_replay as wr  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.scheduler import build_schedule  # noqa: E402
from kogc.targets import get_target  # noqa: E402


def test_window_one_is_the_in_order_replay_and_wider_windows_stay_in_bounds():
    s = build_schedule(to_ir(tiny(num_lanes=2)), get_target("h200"), "parallel", num_programs=6)
    dur = [0.5 + (t.id * 7 % 5) * 0.3 for t in s.tasks]
    in_order, _ = cp.longest_path(s, None, 1.0, True, dur)
    one, starts = wr.window_replay(s, dur, 1, 1.0, 0.0)
    assert abs(one - in_order) < 1e-9
    chain, _ = cp.longest_path(s, None, 1.0, False, dur)
    balance = sum(dur) / len(s.queues)
    order = sorted(range(len(dur)), key=lambda t: (starts[t], t))
    for window, probe, shared in [(2, 0.0, None), (4, 0.5, None), (1, 0.0, order), (8, 0.0, order)]:
        us, st = wr.window_replay(s, dur, window, 1.0, probe, shared)
        assert max(chain, balance) - 1e-9 <= us
        for t in s.tasks:           # no task starts before its producers end
            assert all(st[t.id] >= st[d] + dur[d] - 1e-9 for d in t.all_deps)
