"""Passing over settled jobs decides exactly what weighing every job one by one decides.

A planning step passes over runs of a tenant's jobs whose verdict is already settled and yields
only those whose recorded reason changes (:meth:`ffdl.core.scheduling.Planner.decisions`). Over
random sequences of arrivals, jobs ending, preemptions and requeues, carried from step to step as
the log carries them, it must give the same placements, the same preemptions (with their
positions and wording) and, for every waiting job, the same reason as the step that weighs all.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, HeldJob
from ffdl.core.scheduling import Planner, SchedulerPolicy, WaitingJob, WaitingQueue
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events.model import WaitReason

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


@settings(max_examples=120, deadline=None)
@given(nodes=st.integers(1, 5), rounds=rounds)
def test_passing_over_settled_jobs_decides_as_weighing_each(
    nodes: int, rounds: list[tuple[list[tuple[str, int, int, int, int]], int, bool]]
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

        passed = Planner(passing, queue, now, POLICY).run()
        weighed = Planner(weighing, queue, now, POLICY, weigh_all=True).run()

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
