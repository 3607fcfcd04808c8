"""Passing over settled jobs decides exactly what weighing every job one by one decides.

A planning step passes over runs of a tenant's jobs whose verdict is already settled and yields
only those whose recorded reason changes (:meth:`ffdl.core.scheduling.Planner.decisions`). Over
random sequences of arrivals, jobs ending, preemptions and requeues, carried from step to step as
the log carries them, it must give the same placements, the same preemptions (with their
positions and wording) and, for every waiting job, the same reason as the step that weighs all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core import scheduling
from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, HeldJob
from ffdl.core.job import WaitRecord
from ffdl.core.scheduling import Alike, Planner, SchedulerPolicy, WaitingJob, WaitingQueue
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events.model import WaitReason

WAITED = WaitRecord(WaitReason.CAPACITY, "needs 1 learner(s) x 1 GPU(s); not enough are free")
TENANTS = ("a", "b", "c", "d")  # d: the default quota (no guarantee, no limit)
POLICY = SchedulerPolicy(
    tenancy=TenancyPolicy(
        {"a": TenantQuota(8, None), "b": TenantQuota(4, 12, weight=2.0), "c": TenantQuota(0, 8)}
    ),
    min_runtime_s=10.0,
)
arrivals = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.integers(1, 3),
        st.sampled_from([0, 1, 2, 4, 8]),
        st.sampled_from([-5, 0, 5]),
        st.sampled_from([1, 12, 40]),  # CPUs per learner (a node has 64): some count more than their GPUs
    ),
    max_size=12,
)
rounds = st.lists(st.tuples(arrivals, st.integers(0, 1000), st.booleans()), min_size=1, max_size=12)


@pytest.mark.parametrize("short_run", [scheduling.SHORT_RUN, 0], ids=["as-configured", "read-job-by-job"])
@settings(max_examples=120, deadline=None)
@given(nodes=st.integers(1, 5), rounds=rounds)
def test_passing_over_settled_jobs_decides_as_weighing_each(
    short_run: int, nodes: int, rounds: list[tuple[list[tuple[str, int, int, int, int]], int, bool]]
) -> None:
    """Both ways of passing over a run (its end looked up by demand, or read job by job, which
    a tenant of many distinct demands gets) decide as weighing each job."""
    configured = scheduling.SHORT_RUN
    scheduling.SHORT_RUN = short_run
    try:
        _pass_and_weigh(nodes, rounds)
    finally:
        scheduling.SHORT_RUN = configured


def full_cluster(nodes: int) -> ClusterState:
    """``nodes`` nodes of 8 GPUs, each held whole by a job of tenant b."""
    state = ClusterState([Node(f"n{index}", 8) for index in range(nodes)])
    for index in range(nodes):
        gang = state.room.find(Demand(1, 8))
        assert gang is not None
        state.hold(HeldJob(f"held-{index}", "b", Demand(1, 8), 0, gang, 0.0))
    return state


MANY = tuple(f"t{index}" for index in range(12))
many_tenants = st.lists(
    st.tuples(
        st.lists(
            st.tuples(
                st.sampled_from(MANY),
                st.integers(1, 2),
                st.sampled_from([1, 2, 8]),
                st.sampled_from([0, 5]),
                st.sampled_from([1, 40]),
            ),
            max_size=16,
        ),
        st.integers(0, 1000),
        st.booleans(),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=240, deadline=None)
@given(nodes=st.integers(1, 4), rounds=many_tenants)
def test_passing_over_every_tenant_a_verdict_settles_decides_as_weighing_each(
    nodes: int, rounds: list[tuple[list[tuple[str, int, int, int, int]], int, bool]]
) -> None:
    """Where no tenant stands apart, a class whose every demand one verdict settles is passed over
    at once, whatever the tenants left (a step over thousands of one-job tenants weighed each), a
    demand that fits nowhere and has no victims settled without weighing a job of it: the same
    decisions and reasons as weighing each job, with bands of service as the classes."""
    _pass_and_weigh(nodes, rounds, SchedulerPolicy(min_runtime_s=10.0))


@pytest.mark.interpreted  # counts the planner's own calls
def test_a_class_settled_for_every_tenant_is_passed_over_without_weighing_each_tenant() -> None:
    """2,000 one-job tenants of one demand on a full cluster: no job is weighed. The demand fits
    nowhere and no running job could make room, so its verdict is given without weighing a job."""
    state = full_cluster(4)
    queue = WaitingQueue(
        WaitingJob(f"j{index:04d}", f"t{index:04d}", Demand(1, 1), 0, (float(index), f"j{index:04d}"))
        for index in range(2000)
    )
    weighed = 0
    decide = Planner._decide

    def counted(planner: Planner, job: WaitingJob, position: int) -> scheduling.Decision:
        nonlocal weighed
        weighed += 1
        return decide(planner, job, position)

    Planner._decide = counted  # type: ignore[method-assign, assignment]
    try:
        plan = Planner(state, queue, 1000.0, SchedulerPolicy()).run()
    finally:
        Planner._decide = decide  # type: ignore[method-assign]
    assert len(plan.waits) == 2000 and len({wait.code for wait in plan.waits.values()}) == 1
    assert weighed == 0, "one verdict settles every job, and none has to be weighed for it"


@pytest.mark.interpreted  # counts the planner's own calls
def test_a_step_reads_each_job_of_a_tenant_with_a_demand_per_job_a_bounded_number_of_times() -> None:
    """Looking the end of each run up by demand cost a pass per job over every demand of the
    tenant: 3,000 jobs of a demand each took 4 s a step. Read job by job, a step reads each job
    a few times."""
    state = full_cluster(16)
    jobs = [
        WaitingJob(f"a{index:05d}", "a", Demand(2, 8, None, 1000 + index), 0, (float(index), f"a{index:05d}"))
        for index in range(2000)
    ]
    queue = WaitingQueue(jobs)
    first = Planner(state, queue, 1000.0, POLICY).run()
    for job_id, wait in first.waits.items():
        job = queue.get(job_id)
        assert job is not None
        queue.put(job.with_wait(wait))
    asked = 0
    alike = Planner._alike

    def counted(planner: Planner, priority: int, tenant: str, demand: Demand) -> Alike:
        nonlocal asked
        asked += 1
        return alike(planner, priority, tenant, demand)

    Planner._alike = counted  # type: ignore[method-assign, assignment]
    try:
        Planner(state, queue, 1001.0, POLICY).run()
    finally:
        Planner._alike = alike  # type: ignore[method-assign]
    assert asked <= 4 * len(jobs)


def _pass_and_weigh(
    nodes: int,
    rounds: list[tuple[list[tuple[str, int, int, int, int]], int, bool]],
    policy: SchedulerPolicy = POLICY,
) -> None:
    inventory = [Node(f"n{index}", 8) for index in range(nodes)]
    passing, weighing = ClusterState(inventory), ClusterState(inventory)
    queue = WaitingQueue()
    waiting: list[str] = []  # the queue's job ids
    stopping: list[str] = []
    now = 0.0
    submitted = 0
    for jobs, pick, ends in rounds:
        now += 15.0
        for job_id in stopping:  # preempted or drained last step: halted now, requeued
            held = passing.release(job_id)
            weighing.release(job_id)
            assert held is not None
            queue.put(WaitingJob(job_id, held.tenant, held.demand, held.priority, (now, job_id)))
            waiting.append(job_id)
        stopping = []
        running = sorted(job_id for job_id, held in passing.held.items() if not held.stopping)
        if ends and running:
            ended = running[pick % len(running)]
            passing.release(ended)
            weighing.release(ended)
        for tenant, learners, gpus, priority, cpus in jobs:
            submitted += 1
            job_id = f"job-{submitted}"
            demand = Demand(learners, gpus, None, cpus * 1000)
            queue.put(WaitingJob(job_id, tenant, demand, priority, (now, job_id)))
            waiting.append(job_id)

        passed = Planner(passing, queue, now, policy).run()
        weighed = Planner(weighing, queue, now, policy, weigh_all=True).run()

        assert passed.allocations == weighed.allocations
        assert passed.evictions == weighed.evictions
        placed = {allocation.job_id for allocation in passed.allocations}
        for job_id in list(waiting):
            job = queue.get(job_id)
            assert job is not None
            if job_id in placed:
                queue.remove(job_id)
                waiting.remove(job_id)
                continue
            expected = weighed.waits[job.job_id]
            got = passed.waits.get(job.job_id)
            if got is None:
                assert expected.same_as(job.wait), f"{job.job_id}'s reason changed unseen"
            else:
                assert got == expected
            if not expected.same_as(job.wait):
                queue.put(
                    WaitingJob(job.job_id, job.tenant, job.demand, job.priority, job.queued_order, expected)
                )
        stopping = [eviction.job_id for eviction in passed.evictions]


def test_a_job_that_reclaims_its_guarantee_is_not_given_the_verdict_of_one_that_does_not() -> None:
    """Settled jobs of one class and demand share a verdict across tenants, except a job that
    reclaims its tenant's guarantee: it may preempt borrowers, which the other could not. Here
    tenant x's job comes first (least GPUs per weight) and waits; tenant y's job of the same kind
    reclaims y's guarantee from borrower z."""
    policy = SchedulerPolicy(
        tenancy=TenancyPolicy({"x": TenantQuota(8, None, weight=10.0), "y": TenantQuota(8, None)})
    )
    demand = Demand(4, 1)
    plans = []
    for weigh_all in (False, True):
        state = ClusterState([Node("n0", 16)])
        for job_id, tenant, learners in (("x-running", "x", 5), ("y-running", "y", 4), ("z-running", "z", 7)):
            holding = Demand(learners, 1)
            gang = state.room.find(holding)
            assert gang is not None
            state.hold(HeldJob(job_id, tenant, holding, 0, gang, started_at=0.0))
        queue = WaitingQueue(
            [
                WaitingJob("x-waiting", "x", demand, 0, (1.0, "x-waiting")),
                WaitingJob("y-waiting", "y", demand, 0, (2.0, "y-waiting")),
            ]
        )
        plans.append(Planner(state, queue, 1000.0, policy, weigh_all=weigh_all).run())
    passed, weighed = plans
    assert [(e.job_id, e.preempted_by) for e in passed.evictions] == [("z-running", "y-waiting")]
    assert passed.waits["x-waiting"].code is WaitReason.CAPACITY
    assert passed.waits["y-waiting"].code is WaitReason.PREEMPTION
    assert (passed.evictions, passed.waits) == (weighed.evictions, weighed.waits)


@pytest.mark.interpreted  # counts the planner's own calls
def test_the_heads_walk_ends_once_every_demand_of_the_class_fits() -> None:
    """A GPU free and 2,000 waiting jobs of one demand that fits: no job can head, and the walk read
    the whole class to find none, every step a GPU was free."""
    state = ClusterState([Node(f"n{index}", 8) for index in range(4)])
    queue = WaitingQueue(
        WaitingJob(f"j{index:04d}", "t", Demand(1, 1), 0, (float(index), f"j{index:04d}"), WAITED)
        for index in range(2000)
    )
    read = 0
    in_order = WaitingQueue.in_order

    def counted(waiting: WaitingQueue, priority: int) -> Iterator[WaitingJob]:
        nonlocal read
        for job in in_order(waiting, priority):
            read += 1
            yield job

    WaitingQueue.in_order = counted  # type: ignore[method-assign, assignment]
    try:
        plan = Planner(state, queue, 1000.0, SchedulerPolicy()).run()
    finally:
        WaitingQueue.in_order = in_order  # type: ignore[method-assign]
    assert len(plan.allocations) == 32
    assert read == 1


@pytest.mark.interpreted  # counts the planner's own calls
def test_asking_whether_a_class_is_settled_reads_each_demand_once_a_version() -> None:
    """2,000 one-job tenants of a demand each: whether the class was settled was asked after every
    verdict, and each time read every demand again (2 s a step, 8 s at 4,000)."""
    state = full_cluster(4)
    queue = WaitingQueue(
        WaitingJob(f"j{i:04d}", f"t{i:04d}", Demand(1, 1, None, 1000 + i), 0, (float(i), f"j{i:04d}"))
        for i in range(2000)
    )
    asked = 0
    verdict = Planner._verdict

    def counted(planner: Planner, priority: int, tenant: str, demand: Demand, alike: Alike) -> object:
        nonlocal asked
        asked += 1
        return verdict(planner, priority, tenant, demand, alike)

    Planner._verdict = counted  # type: ignore[method-assign, assignment]
    try:
        Planner(state, queue, 1000.0, SchedulerPolicy()).run()
    finally:
        Planner._verdict = verdict  # type: ignore[method-assign]
    assert asked < 5 * 2000, asked
