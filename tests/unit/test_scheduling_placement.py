"""The indexed gang placement (core.cluster) over random clusters: whole gangs, never an over-commit,
GPU types, cordons and reservations respected, and the same feasibility as the reference allocator."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.allocator import Node, NodeCapacity, place_gang
from ffdl.core.cluster import WHEN_EMPTY_KEPT, ClusterRoom, Demand, Gang, milli_cpus
from ffdl.events.model import JobSpec

TYPES = ("a100", "h100")


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 8))
    return [
        Node(
            name=f"n{index}",
            gpus=draw(st.integers(0, 8)),
            gpu_type=draw(st.sampled_from(TYPES)),
            cpus=draw(st.sampled_from([2.0, 8.0, 64.0])),
            memory_mb=draw(st.sampled_from([4096, 65536])),
            schedulable=draw(st.booleans()) or index == 0,
        )
        for index in range(count)
    ]


demands = st.builds(
    Demand,
    learners=st.integers(1, 6),
    gpus=st.integers(0, 8),
    gpu_type=st.sampled_from([None, *TYPES]),
    mcpus=st.sampled_from([500, 1000, 4000]),
    memory_mb=st.sampled_from([1024, 16384]),
    policy=st.sampled_from(["pack", "spread"]),
)


#: some of the nodes a cluster may have (clusters() names them n0 to n7), left out
excluded_nodes = st.sets(st.sampled_from([f"n{i}" for i in range(8)]))


def fill(room: ClusterRoom, earlier: list[Demand]) -> list[tuple[Demand, Gang]]:
    """Place ``earlier`` gangs one by one (those that fit), as a planning cycle would."""
    held = []
    for demand in earlier:
        gang = room.find(demand)
        if gang is not None:
            room.take(demand, gang)
            held.append((demand, gang))
    return held


def spec_of(demand: Demand) -> JobSpec:
    return JobSpec(
        name="j",
        command="c",
        learners=demand.learners,
        gpus=demand.gpus,
        gpu_type=demand.gpu_type,
        cpus=demand.mcpus / 1000,
        memory_mb=demand.memory_mb,
        placement=demand.policy,
    )


def reference_capacity(nodes: list[Node], held: list[tuple[Demand, Gang]]) -> dict[str, NodeCapacity]:
    """The free capacity as the reference allocator sees it, after the same holdings."""
    gpus = {n.name: set(range(n.gpus)) for n in nodes}
    mcpus = {n.name: milli_cpus(n.cpus) for n in nodes}
    memory = {n.name: n.memory_mb for n in nodes}
    for demand, gang in held:
        for node, taken in gang.learners:
            gpus[node] -= set(taken)
            mcpus[node] -= demand.mcpus
            memory[node] -= demand.memory_mb
    return {
        n.name: NodeCapacity(n, frozenset(gpus[n.name]), mcpus[n.name] / 1000, memory[n.name]) for n in nodes
    }


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), earlier=st.lists(demands, max_size=6), demand=demands)
def test_a_gang_is_placed_whole_within_free_room_or_not_at_all(
    nodes: list[Node], earlier: list[Demand], demand: Demand
) -> None:
    room = ClusterRoom(nodes)
    held = fill(room, earlier)
    gang = room.find(demand)
    expected = place_gang(spec_of(demand), reference_capacity(nodes, held)) is not None
    assert (gang is not None) == expected
    if gang is None:
        return
    room.take(demand, gang)
    held.append((demand, gang))
    assert len(gang.learners) == demand.learners
    by_node = {n.name: n for n in nodes}
    for node, gpus in gang.learners:
        assert by_node[node].schedulable
        assert len(gpus) == len(set(gpus)) == demand.gpus
        if demand.gpus and demand.gpu_type is not None:
            assert by_node[node].gpu_type == demand.gpu_type
    slots: Counter[tuple[str, int]] = Counter()
    cpus: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for held_demand, held_gang in held:
        for node, gpus in held_gang.learners:
            slots.update((node, gpu) for gpu in gpus)
            cpus[node] += held_demand.mcpus
            memory[node] += held_demand.memory_mb
    assert all(count == 1 for count in slots.values()), "a GPU was handed out twice"
    for node, gpu in slots:
        assert 0 <= gpu < by_node[node].gpus
    for name, used in cpus.items():
        assert used <= milli_cpus(by_node[name].cpus)
        assert memory[name] <= by_node[name].memory_mb


@settings(max_examples=100, deadline=None)
@given(nodes=clusters(), demand=demands, excluded=excluded_nodes)
def test_excluded_nodes_are_never_used(nodes: list[Node], demand: Demand, excluded: set[str]) -> None:
    gang = ClusterRoom(nodes).find(demand, excluded)
    assert gang is None or not set(gang.nodes) & excluded


@settings(max_examples=100, deadline=None)
@given(nodes=clusters(), earlier=st.lists(demands, max_size=6))
def test_release_gives_back_exactly_what_take_held(nodes: list[Node], earlier: list[Demand]) -> None:
    room = ClusterRoom(nodes)
    before = {
        name: (list(r.free), r.mcpus, r.memory_mb)
        for name in (n.name for n in nodes)
        if (r := room.room(name))
    }
    free_before = room.free_gpus()
    for demand, gang in reversed(fill(room, earlier)):
        room.release(demand, gang)
    after = {
        name: (list(r.free), r.mcpus, r.memory_mb)
        for name in (n.name for n in nodes)
        if (r := room.room(name))
    }
    assert after == before
    assert room.free_gpus() == free_before


@given(nodes=clusters(), earlier=st.lists(demands, max_size=6), asked=demands)
def test_free_gpus_on_cordoned_nodes_are_counted_through_takes_and_releases(
    nodes: list[Node], earlier: list[Demand], asked: Demand
) -> None:
    """Jobs on a cordoned node (placed before its cordon) take and give back GPUs there too: the
    room's running count of free GPUs on cordoned nodes is the count of what is free on them."""
    uncordoned = ClusterRoom(replace(node, schedulable=True) for node in nodes)
    room = ClusterRoom(nodes)
    held = fill(uncordoned, earlier)

    def counted() -> int:
        return sum(
            len(r.free)
            for node in nodes
            if not node.schedulable
            and asked.gpu_type in (None, node.gpu_type)
            and (r := room.room(node.name))
        )

    for demand, gang in held:
        room.take(demand, gang)
        assert room.cordoned_for(asked) == counted()
    for demand, gang in reversed(held):
        room.release(demand, gang)
        assert room.cordoned_for(asked) == counted()


@given(
    nodes=clusters(),
    earlier=st.lists(demands, max_size=6),
    demand=demands.filter(lambda demand: demand.gpus > 0),
    freed=st.dictionaries(st.sampled_from([f"n{i}" for i in range(10)]), st.integers(0, 8)),
    excluded=st.sets(st.sampled_from([f"n{i}" for i in range(10)])),
)
def test_slots_with_more_freed_counts_by_gpus_on_the_usable_nodes_left(
    nodes: list[Node], earlier: list[Demand], demand: Demand, freed: dict[str, int], excluded: set[str]
) -> None:
    """The victim search's cheap test: learners of ``demand`` that GPUs alone would let fit outside
    ``excluded`` with ``freed`` more GPUs free per node (names of unknown nodes included)."""
    room = ClusterRoom(nodes)
    fill(room, earlier)
    expected = 0
    for node in nodes:
        usable = demand.gpu_type in (None, node.gpu_type) and node.schedulable and node.name not in excluded
        if usable and (r := room.room(node.name)) is not None:
            expected += (len(r.free) + freed.get(node.name, 0)) // demand.gpus
    assert room.slots_with(demand, freed, excluded) == expected


def test_pack_puts_a_gang_on_the_one_node_that_fits_it_most_tightly() -> None:
    room = ClusterRoom([Node("big", 8), Node("small", 4), Node("tight", 3)])
    gang = room.find(Demand(learners=3, gpus=1))
    assert gang is not None
    assert gang.nodes == ("tight",)


def test_pack_uses_the_fewest_nodes_when_no_single_node_fits() -> None:
    nodes = [Node(f"n{i}", 8) for i in range(4)]
    room = ClusterRoom(nodes)
    for name, busy in (("n0", 6), ("n1", 6), ("n2", 2)):
        room.take(Demand(1, busy), Gang(((name, tuple(range(busy))),)))
    # free: n0 2, n1 2, n2 6, n3 8; ten 1-GPU learners fit on n3 + n0 (2 nodes), not n0 + n1 + n2
    gang = room.find(Demand(learners=10, gpus=1))
    assert gang is not None
    assert len(gang.nodes) == 2
    assert "n3" in gang.nodes


def test_spread_puts_each_learner_on_the_node_with_the_most_free_gpus() -> None:
    room = ClusterRoom([Node(f"n{i}", 8) for i in range(4)])
    gang = room.find(Demand(learners=4, gpus=2, policy="spread"))
    assert gang is not None
    assert len(gang.nodes) == 4


def test_a_cordoned_node_gets_nothing_new_but_keeps_what_it_holds() -> None:
    room = ClusterRoom([Node("cordoned", 8, schedulable=False), Node("open", 2)])
    assert room.free_gpus() == 2
    assert room.find(Demand(1, 4)) is None
    room.take(Demand(1, 4), Gang((("cordoned", (0, 1, 2, 3)),)))
    assert room.free_gpus() == 2


def test_a_reservation_prefers_the_nodes_closest_to_empty() -> None:
    room = ClusterRoom([Node(f"n{i}", 8) for i in range(3)])
    room.take(Demand(1, 6), Gang((("n0", tuple(range(6))),)))
    room.take(Demand(1, 1), Gang((("n2", (0,)),)))
    assert room.reservation(Demand(2, 8), frozenset()) == ("n1", "n2")
    assert room.reservation(Demand(2, 8), frozenset({"n1"})) == ("n0", "n2")
    assert room.reservation(Demand(4, 8), frozenset()) is None


@settings(max_examples=200, deadline=None)
@given(nodes=clusters(), earlier=st.lists(demands, max_size=10), given_back=st.lists(st.integers(0, 9)))
def test_the_free_counts_kept_as_gangs_come_and_go_are_those_of_the_nodes(
    nodes: list[Node], earlier: list[Demand], given_back: list[int]
) -> None:
    """What the room keeps instead of reading every node (the free GPUs of each type and of any
    type, each gang's GPUs and learners per node) is what the nodes and the gangs say."""
    room = ClusterRoom(nodes)
    held = fill(room, earlier)
    for which in given_back:
        if held:
            demand, gang = held.pop(which % len(held))
            room.release(demand, gang)
    rooms = [room.room(node.name) for node in nodes if node.schedulable]
    free_by_type = Counter[str]()
    for node_room in rooms:
        assert node_room is not None
        free_by_type[node_room.node.gpu_type] += len(node_room.free)
    assert room.free_gpus() == sum(free_by_type.values())
    assert all(room.free_gpus(gpu_type) == free for gpu_type, free in free_by_type.items())
    for _, gang in held:
        per_node = Counter[str]()
        for node, gpus in gang.learners:
            per_node[node] += len(gpus)
        assert {node: len(gpus) for node, gpus, _ in gang.on_nodes} == per_node
        assert sum(learners for *_, learners in gang.on_nodes) == len(gang.learners)


def test_reservations_for_more_distinct_demands_than_a_room_keeps_stay_right_and_bounded() -> None:
    # tenants choose their demands' CPUs and memory: a room kept for hours must not grow a memo per
    # demand for ever, and clearing the memo changes no answer
    room = ClusterRoom([Node(f"n{i}", 8, memory_mb=65536) for i in range(3)])
    room.take(Demand(1, 6), Gang((("n0", tuple(range(6))),)))
    for memory_mb in range(1, 3 * WHEN_EMPTY_KEPT):
        assert room.reservation(Demand(2, 8, memory_mb=memory_mb), frozenset()) == ("n1", "n2")
        assert room.reservation(Demand(2, 8, memory_mb=65536 + memory_mb), frozenset()) is None
    assert len(room._when_empty) <= WHEN_EMPTY_KEPT


@settings(max_examples=300, deadline=None)
@given(
    nodes=clusters(),
    earlier=st.lists(demands, max_size=6),
    demand=demands,
    excluded=excluded_nodes,
)
def test_a_reservation_is_the_fewest_nodes_closest_to_empty_that_could_hold_the_gang(
    nodes: list[Node], earlier: list[Demand], demand: Demand, excluded: set[str]
) -> None:
    """The reservation read off the free-count buckets is the definition's: the schedulable nodes of
    a usable type outside ``excluded`` that could hold a learner once empty, the most free GPUs
    first, then by name, up to the first prefix that holds the gang (sorted), or None."""
    room = ClusterRoom(nodes)
    fill(room, earlier)
    usable = [
        node
        for node in nodes
        if node.schedulable
        and node.name not in excluded
        and (not demand.gpus or demand.gpu_type in (None, node.gpu_type))
    ]
    holding = []
    for node in usable:
        node_room = room.room(node.name)
        assert node_room is not None
        if slots := node_room.slots_when_empty(demand):
            holding.append((-len(node_room.free), node.name, slots))
    expected = None
    total = 0
    chosen: list[str] = []
    for _, name, slots in sorted(holding):
        chosen.append(name)
        total += slots
        if total >= demand.learners:
            expected = tuple(sorted(chosen))
            break
    assert room.reservation(demand, frozenset(excluded)) == expected


@settings(max_examples=300, deadline=None)
@given(
    nodes=clusters(),
    earlier=st.lists(demands, max_size=10),
    demand=demands,
    excluded=excluded_nodes,
    moves=st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=12),
)
def test_counting_holdings_given_back_says_whether_the_gang_fits_as_placing_it_would(
    nodes: list[Node],
    earlier: list[Demand],
    demand: Demand,
    excluded: set[str],
    moves: list[tuple[int, bool]],
) -> None:
    """What a victim search asks without touching the room (ClusterRoom.freeing) against the room
    with the same holdings given back: the same answer after every move."""
    held = fill(ClusterRoom([replace(node, schedulable=True) for node in nodes]), earlier)
    room = ClusterRoom(nodes)  # jobs hold GPUs on cordoned nodes too: they were placed before the cordon
    for held_demand, gang in held:
        room.take(held_demand, gang)
    freeing = room.freeing(demand, excluded)
    assert freeing.fits() == (room.find(demand, excluded) is not None)
    if not held:
        return
    given_back: set[int] = set()
    for pick, give in moves:
        index = pick % len(held)
        if give == (index in given_back):
            continue  # give back only what is held, take again only what was given back
        held_demand, gang = held[index]
        if give:
            freeing.release(held_demand, gang)
            given_back.add(index)
        else:
            freeing.take(held_demand, gang)
            given_back.discard(index)
        counted = freeing.fits()
        for number, (held_demand, gang) in enumerate(held):  # the room as it would be
            if number in given_back:
                room.release(held_demand, gang)
        assert counted == (room.find(demand, excluded) is not None)
        for number, (held_demand, gang) in enumerate(held):
            if number in given_back:
                room.take(held_demand, gang)


def test_counting_holdings_given_back_reads_memory_cordons_and_what_a_node_has() -> None:
    """The cases a random cluster seldom draws: a gang held back by memory alone, a job holding
    GPUs on a node cordoned since (giving them back opens nothing), a holding that names GPUs the
    node no longer has (given back, they are not free), and a node whose CPUs its jobs over-commit
    (it shrank under them: given back, it holds the gang, which the count missed)."""
    small = Node("small", 8, cpus=64.0, memory_mb=4096)
    cordoned = Node("cordoned", 8, schedulable=False)
    shrunk = Node("shrunk", 2)
    few_cpus = Node("few-cpus", 8, cpus=4.0)
    room = ClusterRoom([small, cordoned, shrunk, few_cpus])
    light = Demand(1, 8, mcpus=1000, memory_mb=1024)
    on_small, on_cordoned = Gang((("small", tuple(range(8))),)), Gang((("cordoned", tuple(range(8))),))
    on_shrunk = Gang((("shrunk", (0, 1, 2, 3)),))
    on_few_cpus = Gang((("few-cpus", tuple(range(8))),))
    for gang in (on_small, on_cordoned, on_shrunk):
        room.take(light, gang)
    heavy = Demand(1, 8, mcpus=8000, memory_mb=1024)
    room.take(heavy, on_few_cpus)
    for demand, held, gang, fits in (
        (Demand(1, 1, mcpus=1000, memory_mb=16384), light, on_small, False),
        (Demand(1, 8), light, on_cordoned, False),
        (Demand(1, 4), light, on_shrunk, False),
        (Demand(1, 4), heavy, on_few_cpus, True),
    ):
        freeing = room.freeing(demand)
        freeing.release(held, gang)
        room.release(held, gang)
        assert (room.find(demand) is not None) == fits
        assert freeing.fits() == fits
        room.take(held, gang)
