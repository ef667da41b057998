"""Any kogc command with matvec runs formed at a lower threshold: every matvec variant whose runs (consecutive
tasks of a queue, those after the first without waits, publishing to the same events) average at least T tasks
runs them as loops, where the kernel's rule (kogc.scheduler.schedule.Schedule.run_variants) asks for 2.

laneformer-7b's placement puts 45% of its W1/W3 and W2 tasks in runs of two, averaging 1.29 tasks a run, so
those variants run one task a body (docs/design.md, Not built: matvec runs for laneformer-7b). Compare, in one
device call on one machine:

    PYTHONPATH=. python -m kogc bench --config laneformer-7b --context 1024 --steps 30 --reps 5 --baselines ''
    PYTHONPATH=. python experiments/run_threshold.py 1.2 bench --config laneformer-7b --context 1024 --steps 30 \
        --reps 5 --baselines ''

(each checks its step against eager). On the CPU, `... run_threshold.py 1.2 compile examples/laneformer.py --config
laneformer-7b --target h200 --out DIR` writes the kernel with four run variants instead of one (report.txt: its
spills).
"""
import sys
from functools import cached_property

from kogc.cli import main
from kogc.scheduler import schedule


def run_variants_at(threshold: float):
    def run_variants(self) -> frozenset:
        tasks_of, runs_of = {}, {}
        for q, starts in zip(self.queues, self._maximal_runs):
            for i, n in starts:
                v = self.tasks[q[i]].variant
                tasks_of[v] = tasks_of.get(v, 0) + n
                runs_of[v] = runs_of.get(v, 0) + 1
        return frozenset(v for v in tasks_of if tasks_of[v] >= threshold * runs_of[v])
    prop = cached_property(run_variants)
    prop.__set_name__(schedule.Schedule, "run_variants")
    return prop


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: run_threshold.py T KOGC_ARGS... (e.g. 1.2 bench --config laneformer-7b)")
    schedule.Schedule.run_variants = run_variants_at(float(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
