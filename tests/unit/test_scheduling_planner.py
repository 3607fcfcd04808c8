"""The planning step (core.scheduling): quotas, fair share, priorities, preemption, backfill, determinism."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node
from ffdl.core.cluster import MILLI_GPUS, ClusterState, Demand, Gang, HeldJob
from ffdl.core.job import WaitRecord
from ffdl.core.scheduling import Plan, SchedulerPolicy, WaitingJob, WaitingQueue, plan
from ffdl.core.simulation import TraceJob, simulate
from ffdl.core.tenancy import TenancyPolicy, TenantQuota
from ffdl.events.model import WaitReason

W = WaitReason
NOW = 10_000.0


def cluster(nodes: int = 2, gpus: int = 8) -> ClusterState:
    return ClusterState([Node(f"n{i}", gpus) for i in range(nodes)])


def waiting(
    job_id: str,
    gpus: int,
    *,
    learners: int = 1,
    tenant: str = "a",
    priority: int = 0,
    order: float = 0.0,
    wait: object = None,
) -> WaitingJob:
    return WaitingJob(job_id, tenant, Demand(learners, gpus), priority, (order, job_id), wait)  # type: ignore[arg-type]


def running(
    state: ClusterState,
    job_id: str,
    node: str,
    gpus: range,
    *,
    tenant: str = "b",
    priority: int = 0,
    started_at: float = 0.0,
) -> HeldJob:
    job = HeldJob(job_id, tenant, Demand(1, len(gpus)), priority, Gang(((node, tuple(gpus)),)), started_at)
    state.hold(job)
    return job


def carried(jobs: list[WaitingJob], decided: Plan) -> list[WaitingJob]:
    """The jobs still waiting after ``decided``, each with the reason it recorded (as the log carries it)."""
    placed = {a.job_id for a in decided.allocations}
    return [
        WaitingJob(j.job_id, j.tenant, j.demand, j.priority, j.queued_order, decided.waits.get(j.job_id))
        for j in jobs
        if j.job_id not in placed
    ]


def reason_after(decided: Plan, jobs: list[WaitingJob], job_id: str) -> WaitRecord:
    """The job's reason after ``decided``: the one it gave, or else the one recorded (a plan names
    only the jobs it weighed on their own and those whose reason changed)."""
    wait = decided.waits.get(job_id) or next(job.wait for job in jobs if job.job_id == job_id)
    assert wait is not None
    return wait


def carry_over(queue: WaitingQueue, decided: Plan) -> None:
    """The plan's placed jobs leave the queue and its reasons are recorded, as the log carries them."""
    for allocation in decided.allocations:
        queue.remove(allocation.job_id)
    for job_id, wait in decided.waits.items():
        job = queue.get(job_id)
        assert job is not None
        queue.put(job.with_wait(wait))


def requeue(state: ClusterState, queue: WaitingQueue, job_id: str, now: float) -> None:
    """A halted job's GPUs are free and it queues again, at ``now``."""
    held = state.release(job_id)
    assert held is not None
    queue.put(WaitingJob(job_id, held.tenant, held.demand, held.priority, (now, job_id)))


# -- tenancy --------------------------------------------------------------------------------------

quotas = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.builds(
        TenantQuota, st.integers(0, 16), st.one_of(st.none(), st.integers(0, 16)), st.sampled_from([1.0, 2.0])
    ),
)
workloads = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 3),
        st.sampled_from([0, 1, 2, 4, 8]),
        st.integers(0, 2),
        st.sampled_from([1, 8, 24]),  # CPUs per learner: a node has 8 per GPU
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(quota=quotas, workload=workloads, cycles=st.integers(1, 4), seed=st.integers(0, 1000))
def test_a_tenant_never_holds_more_than_guaranteed_plus_borrowing(
    quota: dict[str, TenantQuota], workload: list[tuple[str, int, int, int, int]], cycles: int, seed: int
) -> None:
    """Counted in GPU-equivalents: GPUs, or what a learner's CPUs are worth where that is more
    (jobs without GPUs too)."""
    policy = SchedulerPolicy(TenancyPolicy(quota), min_runtime_s=0.0)
    state = cluster(nodes=4)
    jobs = [
        WaitingJob(f"j{i}", tenant, Demand(learners, gpus, None, cpus * 1000), priority, (float(i), f"j{i}"))
        for i, (tenant, learners, gpus, priority, cpus) in enumerate(workload)
    ]
    rng = random.Random(seed)
    for cycle in range(cycles):
        decided = plan(state, jobs, NOW + cycle, policy)
        for tenant in state.usage:
            limit = policy.tenancy.quota(tenant).limit
            held = sum(state.charge(job.demand) for job in state.held.values() if job.tenant == tenant)
            assert state.usage[tenant] == held
            assert state.gpus_held[tenant] <= held / MILLI_GPUS
            assert limit is None or held <= limit * MILLI_GPUS, f"{tenant} holds {held} > {limit}"
        jobs = carried(jobs, decided)
        for eviction in decided.evictions:  # preempted jobs stop between cycles
            state.release(eviction.job_id)
        for job_id in rng.sample(sorted(state.held), len(state.held) // 2):
            if not state.held[job_id].stopping:
                state.release(job_id)


def test_weighted_fair_share_gives_each_tenant_gpus_in_proportion_to_its_weight() -> None:
    policy = SchedulerPolicy(
        TenancyPolicy({"heavy": TenantQuota(weight=2.0), "light": TenantQuota(weight=1.0)})
    )
    state = cluster(nodes=3, gpus=4)
    jobs = [waiting(f"{t}{i}", 1, tenant=t, order=float(i)) for i in range(12) for t in ("light", "heavy")]
    plan(state, jobs, NOW, policy)
    assert state.gpus_held == {"heavy": 8, "light": 4}


def test_tenants_inside_their_guarantee_go_before_borrowers() -> None:
    policy = SchedulerPolicy(TenancyPolicy({"owner": TenantQuota(guaranteed_gpus=8)}))
    state = cluster(nodes=1, gpus=8)
    running(state, "borrowed", "n0", range(4), tenant="other")
    jobs = [
        waiting("other-next", 4, tenant="other", order=0.0),
        waiting("owner-job", 4, tenant="owner", order=1.0),
    ]
    decided = plan(state, jobs, NOW, policy)
    assert [a.job_id for a in decided.allocations] == ["owner-job"]


# -- priorities and preemption --------------------------------------------------------------------


def test_a_higher_priority_job_preempts_the_lowest_priority_youngest_jobs_it_needs() -> None:
    state = cluster(nodes=1, gpus=8)
    running(state, "old-low", "n0", range(0, 4), priority=0, started_at=0.0)
    running(state, "young-low", "n0", range(4, 8), priority=0, started_at=500.0)
    decided = plan(state, [waiting("urgent", 4, priority=10)], NOW, SchedulerPolicy())
    assert [(e.job_id, e.preempted_by) for e in decided.evictions] == [("young-low", "urgent")]
    wait = decided.waits["urgent"]
    assert wait.code is W.PREEMPTION and wait.waiting_for == ("young-low",) and wait.reserved_nodes == ("n0",)
    assert state.held["young-low"].stopping


def test_equal_priority_never_preempts_and_jobs_inside_min_runtime_are_protected() -> None:
    state = cluster(nodes=1, gpus=8)
    running(state, "peer", "n0", range(0, 4), priority=5, started_at=0.0)
    running(state, "fresh", "n0", range(4, 8), priority=0, started_at=NOW - 10)
    decided = plan(state, [waiting("urgent", 8, priority=5)], NOW, SchedulerPolicy(min_runtime_s=60.0))
    assert decided.evictions == []
    decided = plan(state, [waiting("urgent", 4, priority=4)], NOW, SchedulerPolicy(min_runtime_s=60.0))
    assert decided.evictions == []
    assert decided.waits["urgent"].code is W.CAPACITY


def test_while_its_victims_stop_a_preemptor_preempts_nobody_else_and_their_gpus_stay_its() -> None:
    state = cluster(nodes=2, gpus=8)
    running(state, "victim", "n0", range(8), priority=0, started_at=100.0)  # the younger: preempted first
    running(state, "bystander", "n1", range(8), priority=0, started_at=0.0)
    first = plan(state, [waiting("urgent", 8, priority=10)], NOW, SchedulerPolicy())
    assert [e.job_id for e in first.evictions] == ["victim"]
    urgent = carried([waiting("urgent", 8, priority=10)], first)
    second = plan(state, urgent, NOW + 1, SchedulerPolicy())
    assert second.evictions == [] and second.waits["urgent"].same_as(first.waits["urgent"])
    state.release("victim")  # it halted; it is queued again, behind the preemptor
    requeued = waiting("victim", 8, priority=0, order=NOW + 2)
    third = plan(state, [*urgent, requeued], NOW + 2, SchedulerPolicy())
    assert [a.job_id for a in third.allocations] == ["urgent"]
    assert third.waits["victim"].code is not W.PREEMPTION and third.evictions == []


def test_a_tenant_inside_its_guarantee_reclaims_gpus_from_a_borrower_only() -> None:
    policy = SchedulerPolicy(
        TenancyPolicy({"owner": TenantQuota(guaranteed_gpus=8), "steady": TenantQuota(8)})
    )
    state = cluster(nodes=2, gpus=8)
    running(state, "steady-job", "n0", range(8), tenant="steady", priority=5)
    running(state, "borrower-job", "n1", range(8), tenant="borrower", priority=5)
    decided = plan(state, [waiting("owner-job", 8, tenant="owner", priority=0)], NOW, policy)
    assert [e.job_id for e in decided.evictions] == ["borrower-job"]
    assert "reclaim" in decided.evictions[0].reason
    beyond = plan(cluster(nodes=2), [waiting("greedy", 8, tenant="owner", priority=0)], NOW, policy)
    assert beyond.evictions == []


def test_a_borrower_is_reclaimed_from_when_it_borrows_less_than_its_job_holds() -> None:
    """The borrower holds one 8-GPU job and borrows 1 GPU of it: halting that job is the reclaim,
    though the borrowed GPU alone would not make room (the search's bound once counted only that)."""
    policy = SchedulerPolicy(
        TenancyPolicy({"owner": TenantQuota(8), "borrower": TenantQuota(7), "steady": TenantQuota(8)})
    )
    state = cluster(nodes=2, gpus=8)
    running(state, "borrower-job", "n0", range(8), tenant="borrower", priority=5)
    running(state, "steady-job", "n1", range(8), tenant="steady", priority=5)
    decided = plan(state, [waiting("owner-job", 8, tenant="owner")], NOW, policy)
    assert [e.job_id for e in decided.evictions] == ["borrower-job"]


@pytest.mark.parametrize("borrower_gpus", [8, 0], ids=["gpu-borrower", "cpu-only-borrower"])
def test_a_reclaimed_borrower_cannot_take_its_room_back_from_the_job_that_reclaimed_it(
    borrower_gpus: int,
) -> None:
    """The borrower's job is of a higher class than the owner's: requeued once halted, it was
    weighed first and took the freed node back, and once its minimum runtime had passed the owner
    reclaimed again: a checkpointed halt every other cycle, and the owner's job never ran."""
    policy = SchedulerPolicy(TenancyPolicy({"owner": TenantQuota(8)}), min_runtime_s=60.0)
    state = cluster(nodes=1, gpus=8)
    borrower = Demand(1, borrower_gpus, None, 60_000)
    gang = state.room.find(borrower)
    assert gang is not None
    state.hold(HeldJob("borrower-job", "borrower", borrower, 5, gang, 0.0))
    queue = WaitingQueue([WaitingJob("owner-job", "owner", Demand(1, 8, None, 8000), 0, (0.0, "owner-job"))])
    now, halts = 0.0, 0
    for _ in range(6):
        now += 61.0
        decided = plan(state, queue, now, policy)
        carry_over(queue, decided)
        for eviction in decided.evictions:  # halted and requeued before the next cycle
            halts += 1
            requeue(state, queue, eviction.job_id, now)
        if "owner-job" in state.held:
            break
    assert halts == 1 and "owner-job" in state.held
    requeued = queue.get("borrower-job")
    assert requeued is not None and requeued.wait is not None
    assert (requeued.wait.code, requeued.wait.waiting_for) == (W.RESERVATION, ("owner-job",))


def test_a_guarantee_is_a_floor_against_other_tenants_priorities_not_against_its_own() -> None:
    """Reclaiming a guarantee from a borrower's job of a higher class, and that job, requeued,
    preempting back by priority, once made a halt every other cycle for ever."""
    policy = SchedulerPolicy(TenancyPolicy({"owner": TenantQuota(8)}), min_runtime_s=0.0)
    state = cluster(nodes=1, gpus=8)
    running(state, "owned", "n0", range(8), tenant="owner", priority=0)
    other = plan(state, [waiting("urgent", 8, tenant="other", priority=5)], NOW, policy)
    assert other.evictions == [] and other.waits["urgent"].code is W.CAPACITY
    own = plan(state, [waiting("own-urgent", 8, tenant="owner", priority=5)], NOW, policy)
    assert [(e.job_id, e.preempted_by) for e in own.evictions] == [("owned", "own-urgent")]
    state = cluster(nodes=1, gpus=8)
    running(state, "borrowing", "n0", range(8), tenant="borrower", priority=0)
    borrower = plan(state, [waiting("urgent", 8, tenant="other", priority=5)], NOW, policy)
    assert [(e.job_id, e.preempted_by) for e in borrower.evictions] == [("borrowing", "urgent")]


loop_nodes = st.lists(st.tuples(st.sampled_from([4, 8]), st.sampled_from([32, 64])), min_size=1, max_size=4)
loop_jobs = st.lists(
    st.tuples(
        st.sampled_from("abcde"),
        st.integers(1, 2),
        st.sampled_from([0, 0, 1, 2, 4, 8]),
        st.sampled_from([1, 8, 24, 40]),
        st.sampled_from([-5, 0, 5]),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(nodes=loop_nodes, jobs=loop_jobs)
def test_preemption_settles_once_nothing_arrives_or_ends(
    nodes: list[tuple[int, int]], jobs: list[tuple[str, int, int, int, int, int]]
) -> None:
    """No preemption loop: once arrivals stop and no job ends, halts stop too, with guarantees,
    borrowing, priorities and jobs whose CPUs count more than their GPUs. (Before guarantees were
    a floor and reclaimed nodes were kept from the step's start, 59 of 400 such random worlds
    halted jobs for ever.)"""
    assert halts_after_arrivals_stop(nodes, jobs) == []


def test_a_gang_preempting_by_priority_leaves_another_tenant_its_guarantee() -> None:
    """A gang of 16 GPUs (tenant a) took by priority both jobs, of 1 and 8 GPUs, of tenant b, which
    is guaranteed 4 and held 9: b was left with none, its 1-GPU job reclaimed the gang's GPUs, and the
    gang took them back, every other step for ever (found by the test above)."""
    jobs = [
        ("a", 1, 0, 1, -5, 0),
        ("a", 1, 0, 1, -5, 0),
        ("a", 2, 8, 1, 0, 0),  # j2: the gang
        ("b", 1, 1, 1, -5, 0),
        ("b", 1, 8, 1, -5, 0),
    ]
    assert halts_after_arrivals_stop([(8, 32), (8, 32)], jobs) == []


def halts_after_arrivals_stop(
    nodes: list[tuple[int, int]], jobs: list[tuple[str, int, int, int, int, int]]
) -> list[str]:
    """The jobs halted in the last ten of 40 steps, 15 s apart, the jobs (tenant, learners, GPUs,
    CPUs, priority, the step it arrives at) never ending, under guarantees and borrowing limits."""
    policy = SchedulerPolicy(
        TenancyPolicy(
            {
                "a": TenantQuota(8),
                "b": TenantQuota(4, 12, weight=2.0),
                "c": TenantQuota(0, 8),
                "e": TenantQuota(6, 4),
            }
        ),
        min_runtime_s=10.0,
    )
    state = ClusterState([Node(f"n{i}", gpus, cpus=cpus) for i, (gpus, cpus) in enumerate(nodes)])
    queue = WaitingQueue()
    now = 0.0
    stopping: list[str] = []
    late_halts = []
    for cycle in range(40):
        now += 15.0
        for job_id in stopping:  # halted since the last cycle, and requeued
            requeue(state, queue, job_id, now)
        for index, (tenant, learners, gpus, cpus, priority, arrives) in enumerate(jobs):
            if arrives == cycle:
                demand = Demand(learners, gpus, None, cpus * 1000)
                queue.put(WaitingJob(f"j{index}", tenant, demand, priority, (now, f"j{index}")))
        decided = plan(state, queue, now, policy)
        carry_over(queue, decided)
        stopping = [eviction.job_id for eviction in decided.evictions]
        if cycle >= 30:
            late_halts.extend(stopping)
    return late_halts


def cpu_only(state: ClusterState, job_id: str, node: str, *, tenant: str, cpus: int) -> None:
    """A running job of one learner without GPUs, with ``cpus`` CPUs, in the lowest class."""
    state.hold(HeldJob(job_id, tenant, Demand(1, 0, None, cpus * 1000), 0, Gang(((node, ()),)), 0.0))


def test_a_job_without_gpus_is_preempted_when_its_cpus_keep_a_higher_priority_gang_out() -> None:
    state = cluster(nodes=1, gpus=8)  # 64 CPUs
    cpu_only(state, "cpu-hog", "n0", tenant="b", cpus=60)
    urgent = WaitingJob("urgent", "a", Demand(1, 8, None, 16_000), 5, (0.0, "urgent"))
    decided = plan(state, [urgent], NOW, SchedulerPolicy())
    assert [(e.job_id, e.preempted_by) for e in decided.evictions] == [("cpu-hog", "urgent")]
    assert decided.waits["urgent"].code is W.PREEMPTION


def test_jobs_without_gpus_count_against_the_quota_by_the_share_of_cpus_they_take() -> None:
    """A node has 8 CPUs per GPU, so 16 CPUs count as 2 GPUs: a tenant allowed 8 GPUs runs four
    such jobs, and its fifth waits for its quota, in words that say what it counts as."""
    policy = SchedulerPolicy(TenancyPolicy({"a": TenantQuota(0, 8)}))
    state = cluster(nodes=2, gpus=8)
    jobs = [WaitingJob(f"c{i}", "a", Demand(1, 0, None, 16_000), 0, (float(i), f"c{i}")) for i in range(5)]
    decided = plan(state, jobs, NOW, policy)
    assert [a.job_id for a in decided.allocations] == ["c0", "c1", "c2", "c3"]
    assert state.usage == {"a": 8 * MILLI_GPUS} and state.gpus_held == {"a": 0}
    wait = decided.waits["c4"]
    assert wait.code is W.QUOTA and "the worth of 2 GPUs" in wait.detail


def test_a_tenant_whose_jobs_take_cpus_without_gpus_borrows_and_is_reclaimed_from() -> None:
    """Before GPU-equivalents, such jobs borrowed nothing: a guarantee could not be reclaimed from
    them though they left no node room for a gang."""
    policy = SchedulerPolicy(TenancyPolicy({"owner": TenantQuota(8)}))
    state = cluster(nodes=1, gpus=8)
    for i in range(4):
        cpu_only(state, f"hog-{i}", "n0", tenant="hog", cpus=16)
    owner = WaitingJob("owner-job", "owner", Demand(1, 8, None, 8000), 0, (0.0, "owner-job"))
    decided = plan(state, [owner], NOW, policy)
    assert len(decided.evictions) == 1 and "reclaim" in decided.evictions[0].reason


def test_fair_share_counts_what_jobs_without_gpus_take() -> None:
    """One tenant's CPU-heavy jobs (24 CPUs: 3 GPUs' worth each) and another's 1-GPU jobs: the
    next job goes to whoever holds less, counted alike, so the CPU jobs take turns with three GPU
    jobs each and leave CPUs for every GPU. (Counted in GPUs alone, the CPU tenant held nothing and
    went first each time: five of its jobs took 120 of the 128 CPUs, and 8 GPUs stayed idle.)"""
    state = cluster(nodes=2, gpus=8)  # 128 CPUs, 16 GPUs
    jobs = []
    for i in range(20):
        jobs.append(WaitingJob(f"cpu{i}", "cpu", Demand(1, 0, None, 24_000), 0, (float(i), f"cpu{i}")))
        jobs.append(WaitingJob(f"gpu{i}", "gpu", Demand(1, 1, None, 1000), 0, (float(i), f"gpu{i}")))
    plan(state, jobs, NOW, SchedulerPolicy())
    assert state.gpus_held["gpu"] == 16
    assert state.usage == {"cpu": 4 * 3 * MILLI_GPUS, "gpu": 16 * MILLI_GPUS}


def test_jobs_on_a_node_that_left_the_inventory_are_halted_to_resume_elsewhere() -> None:
    state = ClusterState([Node("n0", 8)])
    state.hold(HeldJob("stranded", "a", Demand(1, 4), 0, Gang((("gone", (0, 1, 2, 3)),)), 0.0))
    decided = plan(state, [], NOW, SchedulerPolicy())
    assert [e.job_id for e in decided.evictions] == ["stranded"]
    assert "gone" in decided.evictions[0].reason
    assert plan(state, [], NOW + 1, SchedulerPolicy()).evictions == []


def test_jobs_on_a_draining_node_are_halted_and_nothing_new_goes_there() -> None:
    state = ClusterState([Node("draining", 8, schedulable=False, draining=True), Node("open", 4)])
    running(state, "on-it", "draining", range(4), tenant="a")
    decided = plan(state, [waiting("new", 8)], NOW, SchedulerPolicy())
    assert [(e.job_id, e.reason) for e in decided.evictions] == [
        ("on-it", "node draining is being drained: halted to resume elsewhere from its checkpoint")
    ]
    assert decided.allocations == []
    assert decided.waits["new"].code is W.CAPACITY
    assert decided.waits["new"].detail.endswith("; 4 more are free on cordoned nodes"), "says where GPUs are"


def test_a_cordoned_node_keeps_its_jobs_but_takes_no_new_ones() -> None:
    state = ClusterState([Node("cordoned", 8, schedulable=False), Node("open", 2)])
    running(state, "stays", "cordoned", range(2), tenant="a")
    decided = plan(state, [waiting("small", 2), waiting("big", 4, order=1.0)], NOW, SchedulerPolicy())
    assert decided.evictions == []
    assert [(a.job_id, a.gang.nodes) for a in decided.allocations] == [("small", ("open",))]
    assert "6 more are free on cordoned nodes" in decided.waits["big"].detail


def test_a_job_too_big_for_the_open_nodes_does_not_hold_up_reservations_behind_it() -> None:
    """Two of three nodes are open: a 24-GPU gang cannot be reserved for until the cordon lifts,
    and the 8-GPU job behind it gets the reservation (before, none did while the cordon held)."""
    state = ClusterState([Node("n0", 8), Node("n1", 8), Node("cordoned", 8, schedulable=False)])
    running(state, "r0", "n0", range(8), tenant="a")
    running(state, "r1", "n1", range(4), tenant="a")
    blocked = WaitRecord(W.CAPACITY, "waited before")
    jobs = [
        waiting("whole-cluster", 8, learners=3, order=0.0, wait=blocked),
        waiting("one-node", 8, order=1.0, wait=blocked),
    ]
    decided = plan(state, jobs, NOW, SchedulerPolicy())
    assert decided.waits["one-node"].reserved_nodes == ("n1",)
    assert reason_after(decided, jobs, "whole-cluster").reserved_nodes == ()


# -- backfill and reservations --------------------------------------------------------------------


def test_small_jobs_backfill_around_a_reserved_big_job_but_never_on_its_nodes() -> None:
    state = cluster(nodes=3, gpus=8)
    running(state, "long", "n0", range(4), tenant="a")
    running(state, "other", "n2", range(6), tenant="a")
    big = [waiting("big", 8, learners=2, order=0.0)]
    draining = SchedulerPolicy(max_reservations=1, preempt_drains=False)
    first = plan(state, big, NOW, draining)
    assert first.waits["big"].code is W.CAPACITY and first.waits["big"].reserved_nodes == ()
    jobs = [*carried(big, first), waiting("small", 2, order=1.0), waiting("more", 2, order=2.0)]
    decided = plan(state, jobs, NOW + 1, draining)
    assert decided.waits["big"].code is W.CAPACITY and decided.waits["big"].reserved_nodes == ("n0", "n1")
    assert {a.job_id: a.gang.nodes for a in decided.allocations} == {"small": ("n2",)}
    more = decided.waits["more"]
    assert more.code is W.RESERVATION and more.waiting_for == ("big",)


def test_a_head_preempts_the_jobs_on_its_nodes_when_their_drain_would_idle_more_than_the_halts_cost() -> None:
    state = cluster(nodes=2, gpus=8)
    running(state, "long", "n0", range(4), tenant="a", started_at=NOW - 3600)  # likely to run on
    big = [waiting("big", 8, learners=2, order=0.0)]
    policy = SchedulerPolicy(preempt_drains=True)
    first = plan(state, big, NOW, policy)
    decided = plan(state, carried(big, first), NOW + 1, policy)
    assert [(e.job_id, e.preempted_by) for e in decided.evictions] == [("long", "big")]
    assert "need not wait for its nodes to drain" in decided.evictions[0].reason
    wait = decided.waits["big"]
    assert wait.code is W.PREEMPTION and wait.waiting_for == ("long",) and wait.reserved_nodes == ("n0", "n1")
    assert "idle about" in wait.detail and decided.allocations == []


def test_a_head_waits_for_the_drain_when_it_is_cheaper_or_a_job_on_its_nodes_may_not_be_halted() -> None:
    for started_at, priority, policy in (
        (NOW - 30, 0, SchedulerPolicy(min_runtime_s=10.0, checkpoint_cost_s=3600.0, preempt_drains=True)),
        (NOW - 30, 0, SchedulerPolicy(min_runtime_s=60.0, preempt_drains=True)),  # inside its minimum runtime
        (NOW - 3600, 5, SchedulerPolicy(preempt_drains=True)),  # a higher class than the head's
        (NOW - 3600, 0, SchedulerPolicy()),  # not asked for: off by default
        # another tenant's job inside its guarantee
        (NOW - 3600, 0, SchedulerPolicy(TenancyPolicy({"b": TenantQuota(8)}), preempt_drains=True)),
    ):
        state = cluster(nodes=2, gpus=8)
        running(state, "long", "n0", range(4), tenant="b", priority=priority, started_at=started_at)
        big = [waiting("big", 8, learners=2, order=0.0)]
        first = plan(state, big, NOW, policy)
        decided = plan(state, carried(big, first), NOW + 1, policy)
        assert decided.evictions == [], (started_at, priority)
        assert decided.waits["big"].code is W.CAPACITY and decided.waits["big"].reserved_nodes == ("n0", "n1")


def test_a_reservation_stays_with_its_job_across_cycles() -> None:
    state = cluster(nodes=2, gpus=8)
    running(state, "a0", "n0", range(4))
    running(state, "a1", "n1", range(2))
    jobs = [waiting("big", 8, learners=2, order=0.0)]
    first = plan(state, jobs, NOW, SchedulerPolicy())
    second = plan(state, carried(jobs, first), NOW + 1, SchedulerPolicy())
    third = plan(state, carried(jobs, second), NOW + 2, SchedulerPolicy())
    assert third.waits["big"].reserved_nodes == second.waits["big"].reserved_nodes == ("n0", "n1")


def test_the_oldest_blocked_job_gets_the_reservation_not_a_younger_one() -> None:
    state = cluster(nodes=2, gpus=8)
    running(state, "a0", "n0", range(2), tenant="x")
    running(state, "a1", "n1", range(2), tenant="x")
    jobs = [
        waiting("old-big", 8, learners=2, tenant="x", order=0.0),
        waiting("young", 8, tenant="y", order=1.0),
    ]
    first = plan(state, jobs, NOW, SchedulerPolicy(max_reservations=2))
    second = plan(state, carried(jobs, first), NOW + 1, SchedulerPolicy(max_reservations=2))
    assert second.waits["old-big"].reserved_nodes == ("n0", "n1")
    young = reason_after(second, carried(jobs, first), "young")
    assert young.reserved_nodes == () and young.code is W.FRAGMENTATION


@pytest.mark.parametrize("head_tenant", ["b", "0b"])
def test_a_head_whose_nodes_have_drained_starts_before_younger_jobs_of_any_tenant(head_tenant: str) -> None:
    """The head's node is empty at last, and every tenant holds nothing: fair share alone would
    serve tenant "a" before "b" by name, and its younger 2-GPU job (then "c"'s 4-GPU one) took the
    node the 8-GPU head had waited for, which then waited as long again."""
    state = cluster(nodes=1, gpus=8)
    kept = WaitRecord(W.CAPACITY, "needs 8; kept for it", (), ("n0",))
    behind = WaitRecord(W.RESERVATION, "kept for big", ("big",))
    jobs = [
        waiting("big", 8, tenant=head_tenant, order=1.0, wait=kept),
        waiting("small", 2, tenant="a", order=2.0, wait=behind),
        waiting("medium", 4, tenant="c", order=3.0, wait=behind),
    ]
    decided = plan(state, jobs, NOW, SchedulerPolicy())
    assert [a.job_id for a in decided.allocations] == ["big"]
    assert {job_id: wait.code for job_id, wait in decided.waits.items()} == {
        "small": W.CAPACITY,
        "medium": W.CAPACITY,
    }


def test_a_drained_head_is_placed_first_though_an_older_head_took_the_last_reservation() -> None:
    """One reservation, taken again by the older head still waiting for two nodes: the walk goes on
    to the younger head whose node has drained, and places it before tenant "a"'s younger job."""
    state = cluster(nodes=3, gpus=8)
    running(state, "r0", "n0", range(4), tenant="z")
    running(state, "r1", "n1", range(4), tenant="z")
    jobs = [
        waiting(
            "wide", 8, learners=2, tenant="x", order=0.0, wait=WaitRecord(W.CAPACITY, "", (), ("n0", "n1"))
        ),
        waiting("big", 8, tenant="b", order=1.0, wait=WaitRecord(W.CAPACITY, "", (), ("n2",))),
        waiting("small", 4, tenant="a", order=2.0, wait=WaitRecord(W.RESERVATION, "", ("big",))),
    ]
    decided = plan(state, jobs, NOW, SchedulerPolicy(max_reservations=1))
    assert [a.job_id for a in decided.allocations] == ["big"]
    assert decided.waits["wide"].reserved_nodes == ("n0", "n1")


def test_a_head_placed_as_its_nodes_drain_does_not_wait_for_the_younger_jobs_it_let_pass() -> None:
    """The reviewer's trace: the 8-GPU job waits for the 4-GPU job on the only node, with the node
    kept for it; when that ends at 100 s it starts, not at 600 s after the younger jobs."""
    trace = [
        TraceJob("J1", 0.0, "a", 1, 4, 100.0),
        TraceJob("J2", 1.0, "b", 1, 8, 50.0),
        TraceJob("J3", 2.0, "a", 1, 2, 10.0),
        TraceJob("J4", 3.0, "c", 1, 4, 500.0),
    ]
    result = simulate(trace, [Node("n0", 8)])
    starts = {o.job.job_id: o.first_start for o in result.outcomes}
    assert starts == {"J1": 0.0, "J2": 100.0, "J3": 150.0, "J4": 150.0}


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), small_gpus=st.sampled_from([1, 2, 4]), nodes=st.integers(2, 4))
def test_the_reserved_big_job_starts_while_small_jobs_keep_coming(
    seed: int, small_gpus: int, nodes: int
) -> None:
    """Once the jobs queued before it have started, the big job heads its class and its nodes
    drain: it starts within the longest small job's runtime (100 s) of the last of them starting,
    and one gap between arrivals (5 s: the step that reserves for it), however many younger small
    jobs keep coming. (Bounded by the last small job's submission instead, it failed for 25 of
    6,930 draws, seed 183 among them: there the last job queued before it started at 261 s, the big job at
    358 s, and the last small job came at 353 s.)"""
    rng = random.Random(seed)
    trace = [TraceJob("big", 50.0, "big-tenant", nodes, 8, 100.0)]
    now = 0.0
    for index in range(120):  # more small work than the nodes can do: they never run out of it
        now += rng.uniform(1.0, 5.0)
        trace.append(TraceJob(f"small-{index}", now, "busy", 1, small_gpus, rng.uniform(20.0, 100.0)))
    result = simulate(trace, [Node(f"n{i}", 8) for i in range(nodes)])
    big = next(o for o in result.outcomes if o.job.job_id == "big")
    ahead = [o.first_start for o in result.outcomes if o.job.submit_time < big.job.submit_time]
    started = [start for start in ahead if start is not None]
    assert big.first_start is not None and len(started) == len(ahead)
    assert big.first_start <= max(started) + 100.0 + 5.0
    younger = [o.first_start for o in result.outcomes if o.job.submit_time > big.job.submit_time]
    assert any(start is not None and start > big.first_start for start in younger)  # they kept coming
    assert result.max_gpus_in_use <= nodes * 8


def test_without_reservations_the_big_job_starves_until_the_small_load_stops() -> None:
    rng = random.Random(3)
    trace = [TraceJob("big", 50.0, "big-tenant", 2, 8, 100.0)]
    now = 0.0
    for index in range(150):
        now += rng.uniform(1.0, 4.0)
        trace.append(TraceJob(f"small-{index}", now, "busy", 1, 2, rng.uniform(20.0, 100.0)))
    starved = simulate(trace, [Node(f"n{i}", 8) for i in range(2)], SchedulerPolicy(max_reservations=0))
    reserved = simulate(trace, [Node(f"n{i}", 8) for i in range(2)], SchedulerPolicy(max_reservations=1))
    start = {
        r: next(o.first_start for o in x.outcomes if o.job.job_id == "big")
        for r, x in (("starved", starved), ("reserved", reserved))
    }
    assert start["reserved"] is not None and start["starved"] is not None
    assert start["reserved"] < now < start["starved"]


# -- determinism ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(workload=workloads, quota=quotas, seed=st.integers(0, 1000))
def test_the_same_inputs_in_any_order_yield_the_same_decisions(
    workload: list[tuple[str, int, int, int, int]], quota: dict[str, TenantQuota], seed: int
) -> None:
    policy = SchedulerPolicy(TenancyPolicy(quota))
    jobs = [
        WaitingJob(f"j{i}", tenant, Demand(learners, gpus, None, cpus * 1000), priority, (i % 5, f"j{i}"))
        for i, (tenant, learners, gpus, priority, cpus) in enumerate(workload)
    ]

    def decide(order: list[WaitingJob]) -> Plan:
        state = cluster(nodes=3)
        running(state, "h0", "n0", range(0, 3), tenant="t0", priority=-1, started_at=0.0)
        running(state, "h1", "n1", range(0, 5), tenant="t1", priority=0, started_at=10.0)
        running(state, "h2", "n0", range(3, 6), tenant="t2", priority=1, started_at=20.0)
        return plan(state, order, NOW, policy)

    shuffled = list(jobs)
    random.Random(seed).shuffle(shuffled)
    assert decide(jobs) == decide(shuffled)
