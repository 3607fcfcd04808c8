"""The fair-share walk works a tenant's key out again only when the planner did something since it
last did (``Planner._fair_share``): over random workloads in time, with priorities, bands, a
guarantee and preemptions across tenants, it decides as the walk that works every key out again
after each job."""

from __future__ import annotations

import random
from collections.abc import Iterator, Set
from heapq import heappop, heappush
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl import native
from ffdl.core import simulation
from ffdl.core.allocator import Node
from ffdl.core.cluster import Demand
from ffdl.core.scheduling import Decision, Planner, SchedulerPolicy, WaitingJob, WaitingQueue
from ffdl.core.simulation import TraceJob, simulate
from ffdl.core.tenancy import TenancyPolicy, TenantQuota


class Rekeying(Planner):
    """The walk as first written: each tenant's key worked out afresh after each of its jobs."""

    def _fair_share(self, priority: int, first: Set[str]) -> Iterator[Decision]:
        fifos = self._queue.fifos(priority)
        cursors = dict.fromkeys(fifos, 0)

        def next_of(tenant: str) -> bool:
            fifo = fifos[tenant]
            while cursors[tenant] < len(fifo) and fifo[cursors[tenant]][1] in first:
                cursors[tenant] += 1
            return cursors[tenant] < len(fifo)

        heap = [(self._ledger.order_key(tenant), tenant) for tenant in fifos if next_of(tenant)]
        heap.sort()
        while heap:
            _, tenant = heappop(heap)
            job = self._queue.get(fifos[tenant][cursors[tenant]][1])
            assert job is not None
            cursors[tenant] += 1
            yield self._weigh(job)
            if not next_of(tenant):
                continue
            entry = (self._ledger.order_key(tenant), tenant)
            if not heap or entry < heap[0]:
                cursors[tenant] = yield from self._settled_run(priority, tenant, cursors[tenant], first)
                if not next_of(tenant):
                    continue
            heappush(heap, entry)


POLICY = SchedulerPolicy(
    tenancy=TenancyPolicy({"a": TenantQuota(4, None), "b": TenantQuota(0, None, weight=2.0)}),
    min_runtime_s=20.0,
    service_queues=(200.0, 2000.0),
)
jobs = st.lists(
    st.tuples(
        st.floats(0.0, 600.0, allow_nan=False),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 2),
        st.sampled_from([1, 2, 4, 8]),
        st.floats(10.0, 400.0, allow_nan=False),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=40,
)


def outcomes(trace: list[TraceJob], nodes: int, planner: type[Planner]) -> list[object]:
    assert not native.active(), "compiled, the simulator builds its planner directly"
    with patch.object(simulation, "Planner", planner):
        result = simulate(trace, [Node(f"n{index}", 8) for index in range(nodes)], POLICY)
    return [
        (o.job.job_id, o.first_start, o.end, o.preemptions, o.last_wait and o.last_wait.detail)
        for o in result.outcomes
    ]


@pytest.mark.interpreted  # the simulator runs a planner patched in
@settings(max_examples=150, deadline=None)
@given(nodes=st.integers(1, 3), drawn=jobs)
def test_keys_worked_out_only_when_something_moved_them_decide_as_keys_worked_out_each_time(
    nodes: int, drawn: list[tuple[float, str, int, int, float, int]]
) -> None:
    trace = [
        TraceJob(f"j{index}", submit, tenant, learners, gpus, runtime, priority)
        for index, (submit, tenant, learners, gpus, runtime, priority) in enumerate(drawn)
    ]
    assert outcomes(trace, nodes, Planner) == outcomes(trace, nodes, Rekeying)


@pytest.mark.interpreted  # the simulator runs a planner patched in
@pytest.mark.parametrize("seed", [1, 2])
def test_the_walks_agree_on_a_longer_busy_workload(seed: int) -> None:
    """Hundreds of jobs of three tenants, arriving faster than they run: many preemptions."""
    rng = random.Random(seed)
    trace = []
    now = 0.0
    for index in range(300):
        now += rng.uniform(0.0, 20.0)
        trace.append(
            TraceJob(
                f"j{index}",
                now,
                rng.choice("abc"),
                rng.choice([1, 1, 2]),
                rng.choice([1, 2, 4, 8]),
                rng.uniform(10.0, 2000.0),
                rng.choice([0, 0, 1, 2]),
            )
        )
    assert outcomes(trace, 4, Planner) == outcomes(trace, 4, Rekeying)


@given(
    st.lists(
        st.tuples(
            st.booleans(), st.integers(0, 11), st.sampled_from("abc"), st.integers(-1, 1), st.integers(0, 5)
        ),
        max_size=60,
    )
)
def test_a_class_in_queue_order_is_every_tenants_queue_merged_as_jobs_come_go_and_move(
    steps: list[tuple[bool, int, str, int, int]],
) -> None:
    """The heads' walk reads each class's jobs from one list kept in queue order as jobs are queued,
    removed, or move class (a band changed); it must be every tenant's queue of the class merged."""
    queue = WaitingQueue()
    for add, number, tenant, priority, queued in steps:
        job_id = f"job-{number}"
        if add:
            queue.put(WaitingJob(job_id, tenant, Demand(1, 1), priority, (float(queued), job_id)))
        else:
            queue.remove(job_id)
        for level in (-1, 0, 1):
            merged = sorted(key for fifo in queue.fifos(level).values() for key in fifo)
            assert [(job.queued_order, job.job_id) for job in queue.in_order(level)] == merged
