"""The victim search's bookkeeping: each class's running jobs kept youngest first through holds,
stops and releases, the shortcut that counts the victims below a class from the state's totals
(no guarantee, no GPU type) finding what listing them one by one finds, and the key its memo of
the nodes a preemptor keeps off rests on."""

from __future__ import annotations

from collections.abc import Hashable, Set

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, Gang, HeldJob
from ffdl.core.preemption import Preemptor, VictimPool
from ffdl.core.scheduling import SchedulerPolicy
from ffdl.core.simulation import simulate
from ffdl.core.tenancy import TenancyPolicy, TenantLedger
from ffdl.tools.traces import generate_trace

NODES = [Node(f"n{index}", 8, cpus=16.0, memory_mb=65536) for index in range(4)]

#: (learners, GPUs per learner, priority, started at, whether it is being stopped); a job without
#: GPUs holds CPUs only
jobs = st.lists(
    st.tuples(
        st.integers(1, 2),
        st.sampled_from([0, 1, 2, 4]),
        st.integers(0, 3),
        st.sampled_from([0.0, 10.0, 10.0, 55.5, 100.0, 140.0, 200.0]),
        st.booleans(),
    ),
    max_size=14,
)


def cluster(held: list[tuple[int, int, int, float, bool]], releases: list[int]) -> ClusterState:
    """The jobs of ``held`` that fit, placed in turn; then those at ``releases`` let go again."""
    state = ClusterState(NODES)
    ids = []
    for index, (learners, gpus, priority, started_at, stopping) in enumerate(held):
        demand = Demand(learners, gpus)
        gang = state.room.find(demand)
        if gang is None:
            continue
        job_id = f"j{index}"
        state.hold(HeldJob(job_id, f"t{index % 3}", demand, priority, gang, started_at))
        if stopping:
            state.stop(job_id)
        ids.append(job_id)
    for at in releases:
        if ids:
            state.release(ids[at % len(ids)])
    return state


@settings(max_examples=300, deadline=None)
@given(held=jobs, releases=st.lists(st.integers(0, 20), max_size=4))
def test_each_class_keeps_its_running_jobs_youngest_first(
    held: list[tuple[int, int, int, float, bool]], releases: list[int]
) -> None:
    state = cluster(held, releases)
    for priority, running in state.running.items():
        expected = sorted((-job.started_at, job.job_id) for job in running.values())
        assert [(when, job_id) for when, job_id, _ in state.by_start.get(priority, [])] == expected
        assert all(job is running[job_id] for _, job_id, job in state.by_start.get(priority, []))
    assert all(priority in state.running or not entries for priority, entries in state.by_start.items())


@settings(max_examples=300, deadline=None)
@given(
    held=jobs,
    releases=st.lists(st.integers(0, 20), max_size=4),
    min_runtime_s=st.sampled_from([0.0, 44.5, 60.0, 150.0, 500.0]),
    priority=st.integers(0, 4),
)
def test_the_victims_below_a_class_counted_from_totals_are_those_listed_one_by_one(
    held: list[tuple[int, int, int, float, bool]], releases: list[int], min_runtime_s: float, priority: int
) -> None:
    state = cluster(held, releases)
    ledger = TenantLedger(TenancyPolicy(), state.usage, state.releasing, {})
    pool = VictimPool.of(state, ledger, 200.0, min_runtime_s)
    listed = pool._eligible(Preemptor("p", "t0", Demand(1, 1), priority, reclaims=False))
    counted = pool._below(priority)
    past_minimum = [
        job
        for running in state.running.values()
        for job in running.values()
        if job.priority < priority and job.started_at + min_runtime_s <= 200.0
    ]
    # lowest class first, the youngest first within it
    assert listed == sorted(past_minimum, key=lambda job: (job.priority, -job.started_at, job.job_id))
    assert counted.jobs() == listed
    assert counted.gpus == sum(job.gang.gpus for job in listed)
    per_node: dict[str, int] = {}
    for job in listed:
        for node, gpus in job.gang.learners:
            per_node[node] = per_node.get(node, 0) + len(gpus)
    assert {node: gpus for node, gpus in counted.per_node.items() if gpus} == {
        node: gpus for node, gpus in per_node.items() if gpus
    }


def test_what_the_planner_gives_for_the_nodes_a_preemptor_keeps_off_stands_for_the_same_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The victim search memoises what the nodes a preemptor keeps off take away by the key the
    planner gives for them: within a step, one key must always mean one set of nodes."""
    seen: dict[tuple[int, Hashable], frozenset[str]] = {}
    pools: list[VictimPool] = []  # kept alive, so no two steps' pools share an id
    repeated = 0
    search = VictimPool.search

    def recording(
        pool: VictimPool, preemptor: Preemptor, excluded: Set[str], excluded_as: Hashable
    ) -> tuple[list[HeldJob], Gang] | None:
        nonlocal repeated
        pools.append(pool)
        nodes = frozenset(excluded)
        known = seen.setdefault((id(pool), excluded_as), nodes)
        assert known == nodes, f"{excluded_as} stood for {sorted(known)}, now for {sorted(nodes)}"
        repeated += known is not nodes
        return search(pool, preemptor, excluded, excluded_as)

    monkeypatch.setattr(VictimPool, "search", recording)
    trace = generate_trace(600, nodes=8, gpus_per_node=8, load=1.4, seed=3)
    policy = SchedulerPolicy(service_queues=(3600.0, 16 * 3600.0))
    result = simulate(trace, [Node(f"n{index}", 8) for index in range(8)], policy)
    assert result.preemptions > 0
    assert repeated > 0  # keys were given again, so the check above was reached
    assert any(nodes for nodes in seen.values())  # and some stood for reserved nodes
