"""Gang placement and scheduling plans over random inventories: whole gangs, no over-commit, no misses.

The feasibility oracle is a brute-force search over how many learners each node takes. The greedy
allocator must agree with it exactly: learners of one gang are identical, so placing one on any
node that fits lowers that node's count of learners that still fit by exactly one, and the greedy
succeeds precisely when the counts add up to the gang. CPU amounts are drawn from binary fractions
so that float arithmetic is exact here; the float case is pinned by its own example test. The
scheduler's planning step is held to the same oracle and must never promise a GPU twice.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import (
    Node,
    NodeCapacity,
    PlacementPolicy,
    could_ever_fit,
    empty_capacity,
    place_gang,
    subtract,
)
from ffdl.core.cluster import ClusterState, Demand, Gang, HeldJob, milli_cpus
from ffdl.core.scheduling import SchedulerPolicy, WaitingJob, plan
from ffdl.events.model import JobSpec, Placement

GPU_TYPES = ("a100", "h100", "t4")
policies: st.SearchStrategy[PlacementPolicy] = st.sampled_from(("pack", "spread"))
fast = settings(max_examples=100, deadline=None)


@st.composite
def inventories(draw: st.DrawFn) -> list[Node]:
    return [
        Node(
            name=f"node-{index}",
            gpus=draw(st.integers(0, 8)),
            gpu_type=draw(st.sampled_from(GPU_TYPES)),
            cpus=draw(st.sampled_from((1.0, 2.0, 4.0, 8.0, 64.0))),
            memory_mb=draw(st.sampled_from((1024, 4096, 65_536))),
            schedulable=draw(st.sampled_from((True, True, True, False))),
        )
        for index in range(draw(st.integers(1, 8)))
    ]


@st.composite
def capacities(draw: st.DrawFn) -> dict[str, NodeCapacity]:
    """A random inventory with part of it already in use."""
    capacity = {}
    for node in draw(inventories()):
        free_gpus = draw(st.frozensets(st.integers(0, node.gpus - 1))) if node.gpus else frozenset[int]()
        free_cpus = node.cpus * draw(st.sampled_from((1.0, 0.5, 0.25)))
        free_memory_mb = node.memory_mb // draw(st.sampled_from((1, 2, 4)))
        capacity[node.name] = NodeCapacity(node, free_gpus, free_cpus, free_memory_mb)
    return capacity


def job_specs(min_gpus: int = 0, max_learners: int = 4) -> st.SearchStrategy[JobSpec]:
    return st.builds(
        JobSpec,
        name=st.just("gang"),
        command=st.just("python train.py"),
        learners=st.integers(1, max_learners),
        gpus=st.integers(min_gpus, 4),
        gpu_type=st.sampled_from((None, *GPU_TYPES)),
        cpus=st.sampled_from((0.5, 1.0, 2.0)),
        memory_mb=st.sampled_from((512, 1024, 4096)),
        placement=policies,
        priority=st.integers(-2, 2),
    )


def holds(capacity: NodeCapacity, spec: JobSpec, learners: int) -> bool:
    """Whether ``learners`` learners of ``spec`` fit on this node together, stated independently."""
    type_ok = spec.gpus == 0 or spec.gpu_type is None or spec.gpu_type == capacity.node.gpu_type
    return (
        capacity.node.schedulable
        and type_ok
        and len(capacity.free_gpus) >= learners * spec.gpus
        and capacity.free_cpus >= learners * spec.cpus
        and capacity.free_memory_mb >= learners * spec.memory_mb
    )


def feasible(spec: JobSpec, capacity: Mapping[str, NodeCapacity]) -> bool:
    """Brute force: does any split of the gang's learners over the nodes fit?"""
    nodes = list(capacity.values())
    for choice in itertools.combinations_with_replacement(range(len(nodes)), spec.learners):
        if all(holds(nodes[index], spec, count) for index, count in Counter(choice).items()):
            return True
    return False


def assert_valid(spec: JobSpec, capacity: Mapping[str, NodeCapacity], placement: Placement) -> None:
    """The whole gang, each learner on one free, typed, schedulable node, nothing over-committed."""
    assert [learner.rank for learner in placement.learners] == list(range(spec.learners))
    learners_per_node: Counter[str] = Counter()
    for learner in placement.learners:
        node = capacity[learner.node]
        assert node.node.schedulable
        assert len(learner.gpus) == spec.gpus
        assert set(learner.gpus) <= node.free_gpus, "a GPU that was not free"
        assert learner.gpu_type == node.node.gpu_type
        if spec.gpus and spec.gpu_type is not None:
            assert node.node.gpu_type == spec.gpu_type
        learners_per_node[learner.node] += 1
    slots = [(learner.node, gpu) for learner in placement.learners for gpu in learner.gpus]
    assert len(slots) == len(set(slots)), "one GPU handed out twice"
    for name, count in learners_per_node.items():
        assert capacity[name].free_cpus >= count * spec.cpus
        assert capacity[name].free_memory_mb >= count * spec.memory_mb
    left = subtract(capacity, spec, placement)
    for name, node in left.items():
        assert node.free_cpus >= 0
        assert node.free_memory_mb >= 0
        assert node.free_gpus == capacity[name].free_gpus - {gpu for slot, gpu in slots if slot == name}


@fast
@given(spec=job_specs(), capacity=capacities(), policy=policies)
def test_a_gang_is_placed_whole_on_free_gpus_or_not_at_all(
    spec: JobSpec, capacity: dict[str, NodeCapacity], policy: PlacementPolicy
) -> None:
    placement = place_gang(spec, capacity, policy)

    assert (placement is not None) == feasible(spec, capacity), "greedy disagrees with the brute-force search"
    if placement is not None:
        assert_valid(spec, capacity, placement)


@fast
@given(spec=job_specs(min_gpus=1, max_learners=1), capacity=capacities())
def test_pack_fills_the_fullest_node_that_fits_and_spread_the_emptiest(
    spec: JobSpec, capacity: dict[str, NodeCapacity]
) -> None:
    fitting = [len(node.free_gpus) for node in capacity.values() if holds(node, spec, 1)]

    packed = place_gang(spec, capacity, "pack")
    spread = place_gang(spec, capacity, "spread")

    if not fitting:
        assert packed is None
        assert spread is None
        return
    assert packed is not None
    assert spread is not None
    assert len(capacity[packed.learners[0].node].free_gpus) == min(fitting)
    assert len(capacity[spread.learners[0].node].free_gpus) == max(fitting)


@fast
@given(spec=job_specs(), nodes=inventories(), data=st.data())
def test_could_ever_fit_is_feasibility_on_the_empty_inventory(
    spec: JobSpec, nodes: list[Node], data: st.DataObject
) -> None:
    empty = empty_capacity(nodes)
    ever = could_ever_fit(spec, nodes)

    assert ever == feasible(spec, empty)
    assert ever == (place_gang(spec, empty, "spread") is not None)
    partly_used = {
        name: NodeCapacity(
            node.node,
            data.draw(st.frozensets(st.sampled_from(sorted(node.free_gpus))))
            if node.free_gpus
            else frozenset(),
            node.free_cpus / 2,
            node.free_memory_mb // 2,
        )
        for name, node in empty.items()
    }
    if place_gang(spec, partly_used) is not None:
        assert ever, "fits a partly used inventory but never the empty one"


@dataclass(frozen=True, slots=True)
class Scenario:
    """An inventory, the gangs already holding GPUs on it, and the capacity they leave."""

    nodes: list[Node]
    held: list[tuple[str, JobSpec, Placement]]
    left: dict[str, NodeCapacity]

    def state(self) -> ClusterState:
        state = ClusterState(self.nodes)
        for job_id, spec, placement in self.held:
            state.hold(
                HeldJob(
                    job_id, "tenant-c", Demand.of(spec), spec.priority, Gang.of(placement), started_at=0.0
                )
            )
        return state


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    nodes = draw(inventories())
    left = empty_capacity(nodes)
    held = []
    for index, spec in enumerate(draw(st.lists(job_specs(max_learners=3), max_size=3))):
        placement = place_gang(spec, left)
        if placement is not None:
            left = subtract(left, spec, placement)
            held.append((f"held-{index}", spec, placement))
    return Scenario(nodes, held, left)


def waiting_job(index: int, spec: JobSpec, tenant: str) -> WaitingJob:
    return WaitingJob(f"job-{index}", tenant, Demand.of(spec), spec.priority, (float(index), f"job-{index}"))


@fast
@given(
    scenario=scenarios(),
    specs=st.lists(job_specs(max_learners=3), min_size=1, max_size=5),
    tenants=st.lists(st.sampled_from(("tenant-a", "tenant-b")), min_size=5, max_size=5),
    preemption=st.booleans(),
)
def test_a_plan_never_promises_a_gpu_twice_nor_over_commits_a_node(
    scenario: Scenario, specs: list[JobSpec], tenants: list[str], preemption: bool
) -> None:
    waiting = [waiting_job(i, spec, tenants[i]) for i, spec in enumerate(specs)]
    spec_of = {job.job_id: spec for job, spec in zip(waiting, specs, strict=True)}
    nodes = {node.name: node for node in scenario.nodes}

    result = plan(scenario.state(), waiting, now=1000.0, policy=SchedulerPolicy(preemption=preemption))

    assert len({allocation.job_id for allocation in result.allocations}) == len(result.allocations)
    assert {eviction.job_id for eviction in result.evictions} <= {job_id for job_id, _, _ in scenario.held}
    holdings = [(spec, Gang.of(placement).learners) for _, spec, placement in scenario.held]
    for allocation in result.allocations:
        spec = spec_of[allocation.job_id]
        learners = allocation.gang.learners
        assert len(learners) == spec.learners, "not the whole gang"
        for node_name, gpus in learners:
            node = nodes[node_name]
            assert node.schedulable
            assert len(gpus) == spec.gpus
            assert set(gpus) <= set(range(node.gpus))
            if spec.gpus and spec.gpu_type is not None:
                assert node.gpu_type == spec.gpu_type
        holdings.append((spec, learners))
    slots = [(node, gpu) for _, learners in holdings for node, gpus in learners for gpu in gpus]
    assert len(slots) == len(set(slots)), "one GPU promised twice (or promised while still held)"
    mcpus: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for spec, learners in holdings:
        for node_name, _ in learners:
            mcpus[node_name] += milli_cpus(spec.cpus)
            memory[node_name] += spec.memory_mb
    for name, used in mcpus.items():
        assert used <= milli_cpus(nodes[name].cpus), f"{name}'s CPUs over-committed"
        assert memory[name] <= nodes[name].memory_mb, f"{name}'s memory over-committed"


@fast
@given(scenario=scenarios(), spec=job_specs(), preemption=st.booleans())
def test_a_plan_places_a_lone_waiting_gang_exactly_when_it_fits(
    scenario: Scenario, spec: JobSpec, preemption: bool
) -> None:
    result = plan(
        scenario.state(), [waiting_job(0, spec, "tenant-a")], 1000.0, SchedulerPolicy(preemption=preemption)
    )

    assert bool(result.allocations) == feasible(spec, scenario.left)
    if not result.allocations:
        assert "job-0" in result.waits, "a job that waits must say why"


def test_learners_that_exactly_use_up_a_nodes_cpus_all_fit() -> None:
    spec = JobSpec(name="small", command="python train.py", learners=20, gpus=0, cpus=0.2, memory_mb=16)
    node = Node(name="cpu-node", gpus=0, cpus=4.0)

    assert place_gang(spec, empty_capacity([node])) is not None, "20 x 0.2 CPUs do not fit 4 CPUs"
    assert could_ever_fit(spec, [node])
