"""Any kogc command with matvec runs formed at a lower threshold: every matvec variant whose runs (consecutive
tasks of a queue, those after the first without waits, publishing to the same events) average at least T tasks
runs them as loops, where the kernel's rule asks for 2 (kogc.scheduler.schedule.RUN_MEAN_TASKS).

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

from kogc.cli import main
from kogc.scheduler import schedule

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: run_threshold.py T KOGC_ARGS... (e.g. 1.2 bench --config laneformer-7b)")
    schedule.RUN_MEAN_TASKS = float(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
