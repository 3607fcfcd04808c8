"""The baseline policies of ``ffdl simulate --compare``: each does what its name promises on a
case small enough to work out by hand, and none breaks the cluster's bounds on any trace."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node
from ffdl.core.baselines import BASELINES, simulate_baseline
from ffdl.core.simulation import SimulationResult, TraceJob, simulate, summarize


def nodes(count: int, gpus: int = 8) -> list[Node]:
    return [Node(f"n{i}", gpus) for i in range(count)]


def starts(result: SimulationResult) -> dict[str, float | None]:
    return {o.job.job_id: o.first_start for o in result.outcomes}


#: One node: a long job holds half of it, a whole-node job waits, a small job arrives behind it.
BLOCKED = [
    TraceJob("long", 0.0, "a", 1, 4, 1000.0),
    TraceJob("whole", 10.0, "b", 1, 8, 100.0),
    TraceJob("small", 20.0, "c", 1, 2, 50.0),
]


def test_fifo_lets_no_job_pass_the_oldest_waiting_one() -> None:
    result = simulate_baseline("fifo", BLOCKED, nodes(1))
    assert starts(result) == {"long": 0.0, "whole": 1000.0, "small": 1100.0}
    assert result.preemptions == 0


def test_backfill_runs_whatever_fits_now_without_keeping_room_for_the_oldest() -> None:
    result = simulate_baseline("backfill", BLOCKED, nodes(1))
    assert starts(result) == {"long": 0.0, "whole": 1000.0, "small": 20.0}


@pytest.mark.parametrize(
    ("policy", "backlogged_s", "busy_gpu_s"),
    [
        # the whole-node job waits from 10 to 1000 beside the long one (4 of 8 GPUs busy), then
        # the small one waits behind it, the node full: a backlog from 10 to 1100
        ("fifo", 1090.0, 4 * 990.0 + 8 * 100.0),
        ("ffdl", 1090.0, 4 * 990.0 + 8 * 100.0),  # the node is kept for the whole-node job
        # the small job runs from 20 to 70 beside the long one: the whole-node job waits to 1000
        ("backfill", 990.0, 4 * 10.0 + 6 * 50.0 + 4 * 930.0),
    ],
)
def test_utilisation_while_a_backlog_waits_counts_only_the_time_the_waiting_jobs_ask_for_the_idle_gpus(
    policy: str, backlogged_s: float, busy_gpu_s: float
) -> None:
    result = simulate(BLOCKED, nodes(1)) if policy == "ffdl" else simulate_baseline(policy, BLOCKED, nodes(1))
    figures = summarize(result)
    assert figures["backlogged_s"] == backlogged_s
    assert figures["utilization_backlogged"] == pytest.approx(busy_gpu_s / (8 * backlogged_s))
    # from the first submission (0) to the last (20) the long job alone holds 4 of the 8 GPUs
    assert figures["utilization_while_arriving"] == pytest.approx(0.5)
    alone = summarize(simulate_baseline(policy if policy != "ffdl" else "fifo", BLOCKED[:1], nodes(1)))
    assert (alone["backlogged_s"], alone["utilization_backlogged"]) == (0.0, None)  # nothing ever waits


def test_las_preempts_a_job_that_has_had_more_service_and_counts_the_checkpoint() -> None:
    trace = [TraceJob("hog", 0.0, "a", 1, 8, 40_000.0), TraceJob("new", 20_000.0, "b", 1, 8, 100.0)]
    result = simulate_baseline("las", trace, nodes(1), halt_s=30.0)
    hog, new = result.outcomes
    # 8 GPUs x 7,200 s = 16 GPU-hours: the hog moves to the lower queue, the new job preempts it
    assert new.first_start == 20_000.0 and new.end == 20_100.0
    assert hog.preemptions == 1 and hog.end == 40_000.0 + 100.0 + 30.0  # the halt costs 30 s of work
    assert result.lost_gpu_seconds == 30.0 * 8


def test_las_preempts_no_job_of_the_waiting_jobs_own_queue_and_a_job_that_does_not_fit_holds_up_none() -> (
    None
):
    # one node of 8; every job stays far below 16 GPU-hours, so all four share the first queue
    trace = [
        TraceJob("J1", 0.0, "a", 1, 4, 100.0),
        TraceJob("J2", 1.0, "b", 1, 8, 50.0),  # waits for the whole node
        TraceJob("J3", 2.0, "a", 1, 2, 10.0),  # fits beside J1 at once, though J2 waits ahead of it
        TraceJob("J4", 3.0, "c", 1, 4, 500.0),  # fits when J3 ends at 12
    ]
    result = simulate_baseline("las", trace, nodes(1), halt_s=30.0)
    runs = {o.job.job_id: (o.first_start, o.end, o.preemptions) for o in result.outcomes}
    # when J1 ends at 100, J2 (first in the queue) finds 4 GPUs free: J4 is of its own queue, so
    # it is no victim, and J2 starts when J4 ends
    assert runs == {
        "J1": (0.0, 100.0, 0),
        "J2": (512.0, 562.0, 0),
        "J3": (2.0, 12.0, 0),
        "J4": (12.0, 512.0, 0),
    }
    assert result.lost_gpu_seconds == 0.0


def test_the_oracle_serves_the_shortest_remaining_time_first() -> None:
    trace = [
        TraceJob("long", 0.0, "a", 1, 8, 1000.0),
        TraceJob("short", 100.0, "b", 1, 8, 10.0),
        TraceJob("longer", 100.0, "c", 1, 8, 5000.0),
    ]
    result = simulate_baseline("oracle", trace, nodes(1), halt_s=0.0)
    ends = {o.job.job_id: o.end for o in result.outcomes}
    assert ends == {"long": 1010.0, "short": 110.0, "longer": 6010.0}


def test_an_unknown_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown baseline"):
        simulate_baseline("sjf", BLOCKED, nodes(1))


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(BASELINES),
    jobs=st.lists(
        st.tuples(
            st.floats(0, 500),
            st.sampled_from("abc"),
            st.integers(1, 3),
            st.sampled_from([1, 2, 4, 8]),
            st.floats(1, 300),
        ),
        min_size=1,
        max_size=30,
    ),
    node_count=st.integers(1, 3),
)
# no job fits the cluster: nothing ever runs, and the figures still come out
@example(name="fifo", jobs=[(0.0, "a", 2, 8, 1.0), (1.0, "a", 2, 8, 1.0)], node_count=1)
def test_a_baseline_never_uses_more_gpus_than_there_are_and_finishes_every_job_that_fits(
    name: str, jobs: list[tuple[float, str, int, int, float]], node_count: int
) -> None:
    trace = [TraceJob(f"j{i}", *job) for i, job in enumerate(jobs)]
    result = simulate_baseline(name, trace, nodes(node_count), halt_s=5.0)
    assert result.max_gpus_in_use <= node_count * 8
    assert all(used <= node_count * 8 for _, used in result.usage)
    report = summarize(result)
    assert 0.0 <= report["utilization"] <= 1.0 + 1e-9
    for outcome in result.outcomes:
        if outcome.never_runs:
            assert outcome.first_start is None
            continue
        assert outcome.end is not None and outcome.first_start is not None
        ran = outcome.end - outcome.first_start
        assert ran >= outcome.job.runtime + 5.0 * outcome.preemptions - 1e-6
