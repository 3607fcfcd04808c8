"""Gang placement and scheduling plans over random inventories: whole gangs, no over-commit, no misses.

The feasibility oracle is a brute-force search over how many learners each node takes. The greedy
allocator must agree with it exactly: learners of one gang are identical, so placing one on any
node that fits lowers that node's count of learners that still fit by exactly one, and the greedy
succeeds precisely when the counts add up to the gang. CPU amounts are drawn from binary fractions
so that float arithmetic is exact here; the float case is pinned by its own example test.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping

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
from ffdl.core.scheduling import QueuedJob, plan, queue_order
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


@fast
@given(
    specs=st.lists(job_specs(max_learners=3), min_size=1, max_size=5),
    capacity=capacities(),
)
def test_a_plan_never_promises_a_gpu_twice_nor_over_commits_a_node(
    specs: list[JobSpec], capacity: dict[str, NodeCapacity]
) -> None:
    queue = [QueuedJob(f"job-{i}", "tenant", spec, queued_order=i) for i, spec in enumerate(specs)]
    by_id = {job.job_id: job for job in queue}

    planned = plan(queue, capacity)

    assert len({allocation.job_id for allocation in planned}) == len(planned)
    slots = [slot for allocation in planned for slot in allocation.placement.gpu_slots()]
    assert len(slots) == len(set(slots)), "one GPU promised to two jobs"
    cpus: defaultdict[str, float] = defaultdict(float)
    memory: Counter[str] = Counter()
    for allocation in planned:
        spec = by_id[allocation.job_id].spec
        assert_valid(spec, capacity, allocation.placement)
        for learner in allocation.placement.learners:
            cpus[learner.node] += spec.cpus
            memory[learner.node] += spec.memory_mb
    for name in cpus:
        assert cpus[name] <= capacity[name].free_cpus
        assert memory[name] <= capacity[name].free_memory_mb

    # No head-of-line blocking, and nothing left out that would have fitted in its turn.
    remaining: Mapping[str, NodeCapacity] = capacity
    placements = {allocation.job_id: allocation.placement for allocation in planned}
    for job in queue_order(queue):
        if job.job_id in placements:
            remaining = subtract(remaining, job.spec, placements[job.job_id])
        else:
            assert not feasible(job.spec, remaining), f"{job.job_id} fitted in its turn but was not planned"
    assert [allocation.job_id for allocation in planned] == [
        j.job_id for j in queue_order(queue) if j.job_id in placements
    ]


def test_learners_that_exactly_use_up_a_nodes_cpus_all_fit() -> None:
    spec = JobSpec(name="small", command="python train.py", learners=20, gpus=0, cpus=0.2, memory_mb=16)
    node = Node(name="cpu-node", gpus=0, cpus=4.0)

    assert place_gang(spec, empty_capacity([node])) is not None, "20 x 0.2 CPUs do not fit 4 CPUs"
    assert could_ever_fit(spec, [node])
