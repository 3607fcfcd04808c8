"""A torchrun learner's workers, each reporting its own step: kept apart, the learner as far as its
slowest worker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ffdl.handlers.heartbeat_keys import LearnerBeat
from ffdl.learner.workers import WorkerSteps


def test_each_worker_is_kept_under_its_global_rank_and_the_learner_is_as_far_as_the_slowest() -> None:
    steps = WorkerSteps.from_environment({"LOCAL_WORLD_SIZE": "2"}, node_rank=1)
    assert steps.report(0, 10) == 10
    assert steps.report(1, 8) == 8
    assert steps.report(0, 12) == 8  # worker 0 ran ahead; the learner has not
    assert steps.by_rank == {2: 12, 3: 8}


def test_a_learner_of_one_worker_takes_its_reports_as_they_come() -> None:
    steps = WorkerSteps.from_environment({}, node_rank=0)
    assert [steps.report(None, step) for step in (1, 5, 3)] == [1, 5, 3]
    assert steps.by_rank == {}


@given(reports=st.lists(st.tuples(st.integers(-3, 6), st.integers(0, 1000)), min_size=1, max_size=40))
def test_a_local_rank_out_of_range_counts_as_the_first_worker(reports: list[tuple[int, int]]) -> None:
    steps = WorkerSteps(node_rank=0, workers=4)
    latest: dict[int, int] = {}
    for local, step in reports:
        learner = steps.report(local, step)
        latest[local if 0 <= local < 4 else 0] = step
        assert learner == min(latest.values())
    assert steps.by_rank == dict(sorted(latest.items()))


def test_the_beat_carries_the_workers_through_json() -> None:
    beat = LearnerBeat(attempt=1, step=8, workers={2: 12, 3: 8})
    assert LearnerBeat.from_json(beat.to_json()) == beat
