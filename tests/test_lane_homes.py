"""Lane homes: on a one-die GPU, program p prefers the ready tasks of its home's lanes
(kogc.scheduler.schedule.lane_homes, the lane_homes setting)."""
import re

import pytest
from conftest import assert_queues_partition

from kogc.scheduler import SchedulerError, TileConfig, build_schedule
from kogc.targets import H200


def test_lane_homes_where_a_lanes_op_gives_each_program_many_tiles(graphs):
    """On a one-die GPU each lane gets a home (program p prefers lane p % lanes' tasks) only where one lane's
    tiles of some matvec op give every program of its share at least HOME_TILES_PER_PROGRAM: the tiny
    preset's 4 lanes at 512-byte tiles have 32 tiles a lane's op, 16 a program on 8 programs (homes) and 8
    on 16 (none). With homes most lane tasks run at home, and the schedule is sound."""
    from kogc.scheduler.schedule import HOME_TILES_PER_PROGRAM, lane_homes
    assert HOME_TILES_PER_PROGRAM == 16
    cfg = TileConfig(tile_bytes=512)
    homed = build_schedule(graphs(4), H200, "parallel", cfg, num_programs=8)
    flat = build_schedule(graphs(4), H200, "parallel", cfg, num_programs=16)
    assert lane_homes(homed.tasks, 8) == 4 and lane_homes(flat.tasks, 16) == 1
    assert lane_homes(build_schedule(graphs(1), H200, "parallel", cfg, num_programs=1).tasks, 1) == 1
    assert_queues_partition(homed.tasks, homed.queues)

    def at_home(s, homes):
        lane_tasks = {t.id: t.lane for t in s.tasks if t.lane >= 0}
        ran = [p % homes == lane_tasks[tid] % homes for p, q in enumerate(s.queues) for tid in q if tid in lane_tasks]
        return sum(ran) / len(ran)
    assert at_home(homed, 4) > 0.8 > at_home(flat, 4)
    assert "lane homes: 4 (program p takes" in homed.report() and "lane homes: none" in flat.report()
    assert re.search(r"matvec runs \(one wait, one publish a run\): \d+ runs of \d+ tasks", homed.report())
    paired = build_schedule(graphs(4), H200, "parallel", TileConfig(tile_bytes=512, lane_homes=2), num_programs=16)
    assert_queues_partition(paired.tasks, paired.queues)
    assert at_home(paired, 2) > 0.8 > at_home(flat, 2)     # lane_homes=k: program p prefers the lanes l % k == p % k
    none = build_schedule(graphs(4), H200, "parallel", TileConfig(tile_bytes=512, lane_homes=1), num_programs=8)
    assert at_home(none, 4) < 0.8


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_lane_homes_setting_refuses_what_is_not_a_count(bad):
    with pytest.raises(SchedulerError, match="lane_homes"):
        from kogc.scheduler.config import validate
        validate(TileConfig(lane_homes=bad))
