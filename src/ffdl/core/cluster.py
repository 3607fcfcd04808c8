"""Free room on every node, indexed by free GPU count, for fast gang placement.

The scheduler weighs thousands of waiting gangs per cycle against a thousand nodes. Scanning every
node for every learner (what :func:`ffdl.core.allocator.place_gang` does; it stays the reference
that the tests hold this index to) costs about a millisecond per gang there. Here each GPU type
keeps its schedulable nodes in buckets by free GPU count, so every placement is a walk over at
most "GPUs per node" buckets that usually stops at the first node it looks at. A bucket lists its
nodes by name, whatever order they came into it: a placement depends only on what is free now,
not on the takes and releases that led there, so a room kept up to date across cycles decides
exactly as one built afresh from the same holdings.

The learners of a gang are identical, so what a node can take of a gang is a number of *slots*:
the least of its free GPUs, milli-CPUs and memory over one learner's need. A placement chooses a
slot count per node; GPU indices are handed out lowest first.

* ``pack`` (the default, FfDL's "dense") is topology-aware: the whole gang on the one node that
  fits it most tightly if any node can take it; else the fewest nodes, largest first, the last one
  chosen by best fit for what remains (the minimum node count when GPUs are the limit).
* ``spread`` gives each learner in turn to the node with the most free GPUs.

A :class:`ClusterRoom` is the mutable working state of one planning thread (a scheduling cycle, a
simulation). It is never shared; its decisions depend only on the nodes it was built from and the
operations applied to it since, so the same inputs always give the same placements.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from heapq import heapify, heappop, heappush
from typing import NamedTuple

from ffdl.core.allocator import Node, PlacementPolicy
from ffdl.events.model import JobSpec, LearnerPlacement, Placement

_UNLIMITED = 1 << 62


def milli_cpus(cpus: float) -> int:
    """CPUs as an integer count of thousandths, so slot arithmetic is exact (and never zero)."""
    return max(1, round(cpus * 1000))


class Demand(NamedTuple):
    """What one gang needs: ``learners`` identical learners, each with these GPUs, CPUs and memory.
    (A named tuple: the planner hashes demands for its per-cycle memos, and tuples hash fastest.)"""

    learners: int
    gpus: int
    gpu_type: str | None = None
    mcpus: int = 1000
    memory_mb: int = 1024
    policy: PlacementPolicy = "pack"

    @classmethod
    def of(cls, spec: JobSpec) -> Demand:
        return cls(
            spec.learners, spec.gpus, spec.gpu_type, milli_cpus(spec.cpus), spec.memory_mb, spec.placement
        )

    @property
    def total_gpus(self) -> int:
        return self.learners * self.gpus

    @property
    def gpu_kind(self) -> str | None:
        """The GPU type that matters for this demand: its own where it asks for GPUs, else None
        (a gang without GPUs competes for no type)."""
        return self.gpu_type if self.gpus else None

    def describe(self) -> str:
        kind = f" of type {self.gpu_type}" if self.gpu_type and self.gpus else ""
        return f"{self.learners} learner(s) x {self.gpus} GPU(s){kind}"


@dataclass(frozen=True, slots=True)
class Gang:
    """Where each learner of a gang runs, by rank: its node and the GPU indices it holds there."""

    learners: tuple[tuple[str, tuple[int, ...]], ...]
    nodes: tuple[str, ...] = field(init=False, compare=False)  # the distinct nodes it uses, sorted
    gpus: int = field(init=False, compare=False)  # how many GPUs it holds in all
    #: per node it uses (first use first): the node, the GPUs it holds there and how many of its
    #: learners run there; what the room takes and gives back (a victim search, many times a step)
    on_nodes: tuple[tuple[str, tuple[int, ...], int], ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(sorted({node for node, _ in self.learners})))
        object.__setattr__(self, "gpus", sum(len(gpus) for _, gpus in self.learners))
        by_node: dict[str, tuple[tuple[int, ...], int]] = {}
        for node, gpus in self.learners:
            held, learners = by_node.get(node, ((), 0))
            by_node[node] = ((*held, *gpus), learners + 1)
        object.__setattr__(
            self, "on_nodes", tuple((node, gpus, learners) for node, (gpus, learners) in by_node.items())
        )

    @classmethod
    def of(cls, placement: Placement) -> Gang:
        return cls(tuple((learner.node, learner.gpus) for learner in placement.learners))

    def placement(self, room: ClusterRoom) -> Placement:
        return Placement(
            learners=tuple(
                LearnerPlacement(rank=rank, node=node, gpus=gpus, gpu_type=room.gpu_type(node))
                for rank, (node, gpus) in enumerate(self.learners)
            )
        )


def slots_of(free_gpus: int, mcpus: int, memory_mb: int, demand: Demand) -> int:
    """How many learners of ``demand`` fit where this much is free: none, not fewer, where the
    CPUs or memory are over-committed (a node that shrank under its jobs), so that a node never
    takes away from what the others hold (a gang placed over nodes adds their slots up)."""
    by_gpus = free_gpus // demand.gpus if demand.gpus else _UNLIMITED
    return max(0, _least(by_gpus, mcpus // demand.mcpus, memory_mb // demand.memory_mb))


def _least(first: int, second: int, third: int) -> int:
    """``min`` of three, two at a time: compiled, two ints compare inline, while three go through
    a call to the builtin (1.6% of a planning step's time, in the slot counts)."""
    least = min(first, second)
    return min(least, third)


class NodeRoom:
    """What is free on one node now."""

    __slots__ = ("free", "index", "mcpus", "mcpus_when_empty", "memory_mb", "node")

    def __init__(self, node: Node, index: int) -> None:
        self.node = node
        self.index = index  # its place among the room's nodes by name: the order within a bucket
        self.free = list(range(node.gpus))
        self.mcpus_when_empty = milli_cpus(node.cpus)
        self.mcpus = self.mcpus_when_empty
        self.memory_mb = node.memory_mb

    def slots(self, demand: Demand) -> int:
        """How many learners of ``demand`` fit here now."""
        return slots_of(len(self.free), self.mcpus, self.memory_mb, demand)

    def slots_when_empty(self, demand: Demand) -> int:
        """How many learners of ``demand`` fit here once every job on the node has gone."""
        by_gpus = self.node.gpus // demand.gpus if demand.gpus else _UNLIMITED
        return _least(by_gpus, self.mcpus_when_empty // demand.mcpus, self.node.memory_mb // demand.memory_mb)


#: distinct demands whose rooms-when-empty a room keeps: tenants choose demands (CPUs, memory), and
#: the scheduler role keeps its room until the inventory changes, so the memo is bounded
WHEN_EMPTY_KEPT = 256


class ClusterRoom:
    """The free capacity of a set of nodes, with gang placement over it (see the module docstring)."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self._rooms: dict[str, NodeRoom] = {}
        self._by_index: list[NodeRoom] = []
        # GPU type -> free GPU count -> the indices of the schedulable nodes with that many free, sorted
        self._buckets: dict[str, list[list[int]]] = {}
        self._free: dict[str, int] = {}
        self._free_total = 0  # the sum of ``_free``: the free GPUs of any type a step asks about often
        self._cordoned_free: dict[str, int] = {}  # GPU type -> free GPUs on nodes not schedulable
        for index, node in enumerate(sorted(nodes, key=lambda n: n.name)):
            room = NodeRoom(node, index)
            self._rooms[node.name] = room
            self._by_index.append(room)
            if not node.schedulable:
                self._cordoned_free[node.gpu_type] = self._cordoned_free.get(node.gpu_type, 0) + node.gpus
            else:
                buckets = self._buckets.setdefault(node.gpu_type, [])
                buckets.extend([] for _ in range(len(buckets), node.gpus + 1))
                buckets[node.gpus].append(index)
                self._free[node.gpu_type] = self._free.get(node.gpu_type, 0) + node.gpus
                self._free_total += node.gpus
        self._types = tuple(sorted(self._buckets))
        self._when_empty: dict[Demand, tuple[dict[int, int], int]] = {}  # see _holding_when_empty
        #: the schedulable rooms by node name (what a bound on slots reads, node by node); read only
        self.usable = {name: room for name, room in self._rooms.items() if room.node.schedulable}
        self._max_gpus = max((len(b) - 1 for b in self._buckets.values()), default=0)
        # GPU type -> GPUs per learner -> the learners of that many GPUs its schedulable nodes' free
        # GPUs would take (:meth:`_slot_bound`), kept as free counts change: a planning step asks
        # it of every gang it tries to place, and every placement changed it
        self._slots = {
            gpu_type: [
                sum(len(bucket) * (free // per) for free, bucket in enumerate(buckets)) if per else 0
                for per in range(self._max_gpus + 1)
            ]
            for gpu_type, buckets in self._buckets.items()
        }
        # free GPUs before -> after -> what that changes in a node's slots per GPUs per learner
        levels = range(self._max_gpus + 1)
        self._slot_changes = [
            [[after // per - before // per if per else 0 for per in levels] for after in levels]
            for before in levels
        ]

    # -- the view ---------------------------------------------------------------------------------

    def __contains__(self, node: str) -> bool:
        return node in self._rooms

    def __len__(self) -> int:
        """How many nodes it has, cordoned ones too (a node's ``index`` is below it)."""
        return len(self._by_index)

    def room(self, node: str) -> NodeRoom | None:
        return self._rooms.get(node)

    def gpu_type(self, node: str) -> str | None:
        room = self._rooms.get(node)
        return room.node.gpu_type if room else None

    def free_gpus(self, gpu_type: str | None = None) -> int:
        """Free GPUs on schedulable nodes, of ``gpu_type`` (``None``: of any type)."""
        if gpu_type is None:
            return self._free_total
        return self._free.get(gpu_type, 0)

    def free_for(self, demand: Demand) -> int:
        """Free GPUs that ``demand`` could use."""
        return self.free_gpus(demand.gpu_kind)

    def cordoned_for(self, demand: Demand) -> int:
        """Free GPUs that ``demand`` could use if their nodes were not cordoned."""
        return sum(
            free for gpu_type, free in self._cordoned_free.items() if demand.gpu_type in (None, gpu_type)
        )

    # -- changing it ------------------------------------------------------------------------------

    def take(self, demand: Demand, gang: Gang) -> None:
        """Hold ``gang`` (of a job with ``demand``). GPUs already taken or unknown are skipped, so a
        stale or doubled holding never makes the room negative."""
        for node, gpus, learners in gang.on_nodes:
            room = self._rooms.get(node)
            if room is None:
                continue
            taken = set(gpus)
            before = len(room.free)
            room.free = [gpu for gpu in room.free if gpu not in taken]
            room.mcpus -= demand.mcpus * learners
            room.memory_mb -= demand.memory_mb * learners
            self._rebucket(room, before)

    def release(self, demand: Demand, gang: Gang) -> None:
        """Give back what :meth:`take` held for ``gang``."""
        for node, gpus, learners in gang.on_nodes:
            room = self._rooms.get(node)
            if room is None:
                continue
            before = len(room.free)
            room.free = sorted(set(room.free) | {gpu for gpu in gpus if gpu < room.node.gpus})
            room.mcpus += demand.mcpus * learners
            room.memory_mb += demand.memory_mb * learners
            self._rebucket(room, before)

    def _rebucket(self, room: NodeRoom, before: int) -> None:
        node = room.node
        after = len(room.free)
        if after == before:
            return
        if not node.schedulable:
            self._cordoned_free[node.gpu_type] += after - before
            return
        buckets = self._buckets[node.gpu_type]
        leaving = buckets[before]
        del leaving[bisect_left(leaving, room.index)]
        insort(buckets[after], room.index)
        self._free[node.gpu_type] += after - before
        self._free_total += after - before
        slots = self._slots[node.gpu_type]
        for per, change in enumerate(self._slot_changes[before][after]):
            slots[per] += change

    # -- placing ----------------------------------------------------------------------------------

    def find(self, demand: Demand, excluded: Set[str] = frozenset()) -> Gang | None:
        """A placement of the whole gang on nodes not in ``excluded``, or ``None``; changes nothing."""
        types = self.types_for(demand)
        if demand.gpus and self._slot_bound(demand, types) < demand.learners:
            return None
        if demand.policy == "spread":
            return self._spread(demand, types, excluded)
        return self._pack(demand, types, excluded)

    def types_for(self, demand: Demand) -> tuple[str, ...]:
        """The GPU types whose nodes may hold learners of ``demand``."""
        if demand.gpus and demand.gpu_type is not None:
            return (demand.gpu_type,) if demand.gpu_type in self._buckets else ()
        return self._types

    def _slot_bound(self, demand: Demand, types: Sequence[str]) -> int:
        """Slots by free GPUs alone, ignoring CPUs, memory and exclusions: an upper bound, read off
        the counts kept per GPU type (``_slots``)."""
        per = demand.gpus
        if per > self._max_gpus:
            return 0
        slots = self._slots
        if len(types) == 1:
            return slots[types[0]][per]
        return sum(slots[gpu_type][per] for gpu_type in types)

    def slots_with(self, demand: Demand, freed: Mapping[str, int], excluded: Set[str]) -> int:
        """How many learners of ``demand`` (which needs GPUs) could fit outside ``excluded`` with
        ``freed`` more GPUs free on each named node: an upper bound by GPUs alone (CPUs and memory
        not counted), without touching the room, so a search can rule a set of victims out cheaply."""
        return self.slots_freeing(demand, freed) - self.slots_on(demand, freed, excluded)

    def slots_freeing(self, demand: Demand, freed: Mapping[str, int]) -> int:
        """:meth:`slots_with` on every node: the sum over them of (free + freed) // GPUs per learner."""
        types = self.types_for(demand)
        per = demand.gpus
        total = self._slot_bound(demand, types)
        usable = self.usable if len(types) == len(self._types) else self._usable_of(types)
        if per == 1:  # each freed GPU is one more slot: no node's free count to read
            return total + sum(more for name, more in freed.items() if name in usable)
        for name, more in freed.items():
            room = usable.get(name)
            if room is not None:
                free = len(room.free)
                total += (free + more) // per - free // per
        return total

    def slots_on(self, demand: Demand, freed: Mapping[str, int], nodes: Iterable[str]) -> int:
        """The part of :meth:`slots_freeing` that lies on ``nodes``: what leaving them out takes
        away, in the time it takes to read them."""
        types = self.types_for(demand)
        per = demand.gpus
        rooms = self._rooms
        total = 0
        for name in nodes:
            room = rooms.get(name)
            if room is not None and room.node.schedulable and room.node.gpu_type in types:
                total += (len(room.free) + freed.get(name, 0)) // per
        return total

    def _usable_of(self, types: Sequence[str]) -> dict[str, NodeRoom]:
        """The schedulable rooms of ``types``, by node name."""
        return {name: room for name, room in self.usable.items() if room.node.gpu_type in types}

    def _rooms_by_free(self, types: Sequence[str], lowest: int, ascending: bool) -> Iterator[NodeRoom]:
        """Schedulable rooms with at least ``lowest`` free GPUs, by free GPUs, then type, then name."""
        levels = range(lowest, self._max_gpus + 1)
        rooms = self._by_index
        for free in levels if ascending else reversed(levels):
            for gpu_type in types:
                buckets = self._buckets[gpu_type]
                if free < len(buckets):
                    for index in buckets[free]:
                        yield rooms[index]

    def _pack(self, demand: Demand, types: Sequence[str], excluded: Set[str]) -> Gang | None:
        need = demand.learners
        for room in self._rooms_by_free(types, need * demand.gpus, ascending=True):
            if room.node.name not in excluded and room.slots(demand) >= need:
                return _gang(demand, [(room, need)])
        chosen: list[tuple[NodeRoom, int]] = []
        total = 0
        for room in self._rooms_by_free(types, demand.gpus, ascending=False):
            if room.node.name in excluded:
                continue
            slots = room.slots(demand)
            if slots == 0:
                continue
            if total + slots >= need:
                rest = need - total
                taken = {r.node.name for r, _ in chosen}
                chosen.append((self._best_fit(demand, types, rest, excluded | taken) or room, rest))
                return _gang(demand, chosen)
            chosen.append((room, slots))
            total += slots
        return None

    def _best_fit(
        self, demand: Demand, types: Sequence[str], learners: int, excluded: Set[str]
    ) -> NodeRoom | None:
        for room in self._rooms_by_free(types, learners * demand.gpus, ascending=True):
            if room.node.name not in excluded and room.slots(demand) >= learners:
                return room
        return None

    def _spread(self, demand: Demand, types: Sequence[str], excluded: Set[str]) -> Gang | None:
        need = demand.learners
        candidates: list[tuple[NodeRoom, int]] = []
        total = 0
        for room in self._rooms_by_free(types, demand.gpus, ascending=False):
            if room.node.name in excluded:
                continue
            slots = room.slots(demand)
            if slots:
                candidates.append((room, slots))
                total += slots
                if total >= need and len(candidates) >= need:
                    break
        if total < need:
            return None
        # (-free GPUs left, learners given, order): the most free first; CPU-only gangs by fewest given.
        heap = [(-len(room.free), 0, order) for order, (room, _) in enumerate(candidates)]
        heapify(heap)
        picks: list[int] = []
        while len(picks) < need:
            minus_free, given, order = heappop(heap)
            picks.append(order)
            if given + 1 < candidates[order][1]:
                heappush(heap, (minus_free + demand.gpus, given + 1, order))
        handed = [0] * len(candidates)
        learners = []
        for order in picks:
            room = candidates[order][0]
            start = handed[order] * demand.gpus
            learners.append((room.node.name, tuple(room.free[start : start + demand.gpus])))
            handed[order] += 1
        return Gang(tuple(learners))

    def freeing(self, demand: Demand, excluded: Set[str] = frozenset()) -> Freeing:
        """The slots of ``demand`` outside ``excluded`` now, to count holdings given back and taken
        again without touching the room (:class:`Freeing`)."""
        types = self.types_for(demand)
        rooms = self._rooms_by_free(types, demand.gpus, ascending=False)
        slots = sum(room.slots(demand) for room in rooms if room.node.name not in excluded)
        return Freeing(self, demand, frozenset(types), excluded, slots)

    # -- reserving --------------------------------------------------------------------------------

    def reservation(self, demand: Demand, excluded: Set[str]) -> tuple[str, ...] | None:
        """The nodes to keep for ``demand`` until it fits: the fewest that could hold it once empty,
        those with the most free GPUs first (the quickest to drain), then by name; ``None`` if no
        such set exists. Read off the buckets most free first, so it stops at the last node it
        needs: sorting every node that could hold a learner cost a millisecond a head on a
        thousand nodes, every step a head's nodes were taken."""
        holding, when_empty = self._holding_when_empty(demand)
        if when_empty < demand.learners:
            return None
        types = self.types_for(demand)
        rooms = self._by_index
        chosen: list[str] = []
        total = 0
        for free in range(self._max_gpus, -1, -1):
            if len(types) == 1:
                buckets = self._buckets[types[0]]
                level = buckets[free] if free < len(buckets) else []
            else:  # by name across the types, as within one
                level = sorted(i for t in types if free < len(b := self._buckets[t]) for i in b[free])
            for index in level:
                slots = holding.get(index, 0)
                name = rooms[index].node.name
                if slots and name not in excluded:
                    chosen.append(name)
                    total += slots
                    if total >= demand.learners:
                        return tuple(sorted(chosen))
        return None

    def _holding_when_empty(self, demand: Demand) -> tuple[dict[int, int], int]:
        """The schedulable rooms of a usable type that could hold learners of ``demand`` once empty,
        by index, with how many, and their sum: fixed for a room's life, so worked out once per
        demand."""
        holding = self._when_empty.get(demand)
        if holding is None:
            rooms = (
                self._by_index[index]
                for gpu_type in self.types_for(demand)
                for bucket in self._buckets[gpu_type]
                for index in bucket
            )
            slots_of_room = {
                room.index: slots for room in rooms if (slots := room.slots_when_empty(demand)) > 0
            }
            holding = (slots_of_room, sum(slots_of_room.values()))
            if len(self._when_empty) >= WHEN_EMPTY_KEPT:
                self._when_empty.clear()
            self._when_empty[demand] = holding
        return holding

    def can_hold_when_empty(self, demand: Demand, nodes: Sequence[str]) -> bool:
        """Whether ``nodes`` (all schedulable and of a usable type) could hold the gang once empty."""
        types = set(self.types_for(demand))
        total = 0
        for name in nodes:
            room = self._rooms.get(name)
            if room is None or not room.node.schedulable or room.node.gpu_type not in types:
                return False
            total += room.slots_when_empty(demand)
        return total >= demand.learners


class _Freed:
    """One node as :class:`Freeing` counts it: what would be free on it, whether it counts (not
    cordoned, of a usable GPU type, not left out), and its slots as counted."""

    __slots__ = ("counts", "free", "gpus", "mcpus", "memory_mb", "slots")

    def __init__(self, room: NodeRoom, counts: bool, slots: int) -> None:
        self.gpus = room.node.gpus
        self.free = set(room.free)
        self.mcpus = room.mcpus
        self.memory_mb = room.memory_mb
        self.counts = counts
        self.slots = slots


class Freeing:
    """The slots of one demand as holdings are given back (as :meth:`ClusterRoom.release` would)
    and taken again (:meth:`ClusterRoom.take`), without touching the room.

    ``find`` places a gang exactly when the slots on the schedulable nodes of a usable type outside
    the nodes left out add up to its learners, so :meth:`fits` says what it would (the room must
    not change meanwhile: a node is read when first touched). A victim search
    asks that again and again for the gang with some victims gone; freeing them in the room and
    placing the gang each time rebucketed every node touched and built a gang, about a millisecond
    a search that found victims (counting instead: 7% less CPU at load 1.3, 4% on Philly)."""

    __slots__ = ("_demand", "_excluded", "_nodes", "_room", "_types", "slots")

    def __init__(
        self, room: ClusterRoom, demand: Demand, types: Set[str], excluded: Set[str], slots: int
    ) -> None:
        self._room = room
        self._demand = demand
        self._types = types
        self._excluded = excluded
        self.slots = slots  # on the nodes that count, as freed so far
        self._nodes: dict[str, _Freed] = {}  # the nodes touched so far

    def fits(self) -> bool:
        return self.slots >= self._demand.learners

    def release(self, demand: Demand, gang: Gang) -> None:
        """Count ``gang`` (of a job with ``demand``) as given back."""
        for node, gpus, learners in gang.on_nodes:
            freed = self._node(node)
            if freed is not None:
                freed.free.update(gpu for gpu in gpus if gpu < freed.gpus)
                self._recount(freed, demand.mcpus * learners, demand.memory_mb * learners)

    def take(self, demand: Demand, gang: Gang) -> None:
        """Count ``gang`` as held again."""
        for node, gpus, learners in gang.on_nodes:
            freed = self._node(node)
            if freed is not None:
                freed.free.difference_update(gpus)
                self._recount(freed, -demand.mcpus * learners, -demand.memory_mb * learners)

    def _node(self, name: str) -> _Freed | None:
        freed = self._nodes.get(name)
        if freed is None:
            room = self._room.room(name)
            if room is None:
                return None  # as the room skips a node it does not know
            node = room.node
            counts = node.schedulable and node.gpu_type in self._types and name not in self._excluded
            freed = self._nodes[name] = _Freed(room, counts, room.slots(self._demand) if counts else 0)
        return freed

    def _recount(self, freed: _Freed, mcpus: int, memory_mb: int) -> None:
        freed.mcpus += mcpus
        freed.memory_mb += memory_mb
        if freed.counts:
            slots = slots_of(len(freed.free), freed.mcpus, freed.memory_mb, self._demand)
            self.slots += slots - freed.slots
            freed.slots = slots


class Admission:
    """Whether gangs could ever run on an inventory: built once per inventory, asked per job.

    A job is weighed against the inventory empty and with every cordon lifted: a cordon passes,
    so it is a reason to wait, not to be rejected.
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self._room = ClusterRoom(replace(node, schedulable=True, draining=False) for node in self.nodes)

    def why_never_fits(self, spec: JobSpec) -> str | None:
        """Why the job can never run here; None when it could."""
        if self._room.find(Demand.of(spec)) is not None:
            return None
        largest = max((n.gpus for n in self.nodes if spec.gpu_type in (None, n.gpu_type)), default=0)
        gpu_type = f" of type {spec.gpu_type}" if spec.gpu_type else ""
        return (
            f"{spec.learners} learner(s) x {spec.gpus} GPU(s){gpu_type} with {spec.cpus} CPUs and "
            f"{spec.memory_mb} MB each can never fit this cluster ({len(self.nodes)} node(s), "
            f"at most {largest} matching GPUs on one node)"
        )


def _gang(demand: Demand, chosen: Sequence[tuple[NodeRoom, int]]) -> Gang:
    learners = []
    for room, count in chosen:
        for index in range(count):
            start = index * demand.gpus
            learners.append((room.node.name, tuple(room.free[start : start + demand.gpus])))
    return Gang(tuple(learners))


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A job that holds GPUs: running, or being stopped (``stopping``: halting, halted, ended)."""

    job_id: str
    tenant: str
    demand: Demand
    priority: int
    gang: Gang
    started_at: float  # when it last got its GPUs, in seconds (the planner's clock)
    stopping: bool = False


#: a GPU-equivalent in the thousandths that quotas and fair share count (:class:`Charges`)
MILLI_GPUS = 1000


def counted(charge: int, gpus: int) -> str:
    """What a job of ``gpus`` GPUs counts against its quota (``charge``), in the user's words: its
    GPUs, or what its CPUs or memory are worth in GPUs where that is more."""
    if charge == gpus * MILLI_GPUS:
        return str(gpus)
    return f"the worth of {charge / MILLI_GPUS:g} GPUs (its CPUs or memory, as a share of the cluster's)"


class Charges:
    """What gangs count against their tenants on an inventory, in thousandths of a GPU-equivalent:
    per learner, the largest of its GPUs, and its CPUs and memory each in the GPUs that the same
    share of the inventory's CPUs or memory would be (dominant-resource fairness, with GPUs as the
    unit). A learner asking no more CPU and memory per GPU than the inventory has counts its GPUs
    exactly; a job without GPUs counts what its CPUs and memory take from gangs that need them, so
    CPU-only jobs cannot fill a cluster beyond every quota. An inventory without GPUs counts
    nothing (there is no GPU to share). Quotas, fair share, reclaiming and least attained service
    all count this."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        nodes = list(nodes)
        self._gpus = sum(node.gpus for node in nodes)
        self._mcpus = sum(milli_cpus(node.cpus) for node in nodes)
        self._memory_mb = sum(node.memory_mb for node in nodes)
        self._charges: dict[Demand, int] = {}

    def charge(self, demand: Demand) -> int:
        """What a gang of ``demand`` counts. Memoised per demand: the planner asks for every job it weighs."""
        charge = self._charges.get(demand)
        if charge is None:
            charge = demand.learners * max(demand.gpus * MILLI_GPUS, self._beside_gpus(demand))
            if len(self._charges) >= WHEN_EMPTY_KEPT:
                self._charges.clear()
            self._charges[demand] = charge
        return charge

    def held_charge(self, job: HeldJob) -> int:
        """What a job counts as it holds its gang (its GPUs as held, its learners as placed)."""
        gang = job.gang
        demand = job.demand
        if len(gang.learners) == demand.learners and gang.gpus == demand.total_gpus:
            return self.charge(demand)
        return max(gang.gpus * MILLI_GPUS, len(gang.learners) * self._beside_gpus(demand))

    def _beside_gpus(self, demand: Demand) -> int:
        """What one learner's CPUs and memory are worth in thousandths of a GPU (rounded up)."""
        scale = self._gpus * MILLI_GPUS
        worth = -(-demand.mcpus * scale // self._mcpus) if self._mcpus else 0
        if self._memory_mb:
            worth = max(worth, -(-demand.memory_mb * scale // self._memory_mb))
        return worth


class ClusterState:
    """The planner's working view: the free room of every node, the jobs holding GPUs, and what each
    tenant holds (and of that, how much is being freed). Callers build one per cycle from their
    fold (the scheduler role) or keep one up to date (the simulator); a plan applies its own
    decisions to it, so it reads the same afterwards as the cluster will once they take effect.

    What a tenant holds is counted in *GPU-equivalents* (:class:`Charges`), what quotas and fair
    share read; the GPUs themselves are ``gpus_held``.

    Its ``room`` changes only through it (:meth:`hold`, :meth:`stop`, :meth:`release`), as what it
    keeps for victim searches follows the room's free GPUs; a search that gives back and takes
    again a gang to place another in between reads nothing of that meanwhile."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        nodes = list(nodes)
        self.room = ClusterRoom(nodes)
        charges = Charges(nodes)
        self.charge = charges.charge
        self.held_charge = charges.held_charge
        self.held: dict[str, HeldJob] = {}
        #: tenant -> the GPU-equivalents (thousandths, :meth:`charge`) of the jobs it holds
        self.usage: dict[str, int] = {}
        #: tenant -> of its ``usage``, what jobs being stopped hold
        self.releasing: dict[str, int] = {}
        #: tenant -> the GPUs its jobs hold
        self.gpus_held: dict[str, int] = {}
        self.gpus_by_priority: dict[int, int] = {}  # GPUs of running (not stopping) jobs per priority
        #: the running (not stopping) jobs of each priority: where preemption looks for victims
        self.running: dict[int, dict[str, HeldJob]] = {}
        #: the same jobs as (-started_at, job id, job), sorted: the youngest first, as a victim
        #: search takes them, and those still inside their minimum runtime a prefix of each list
        #: (:class:`~ffdl.core.preemption.VictimPool`), kept sorted instead of sorted every step
        self.by_start: dict[int, list[tuple[float, str, HeldJob]]] = {}
        #: per priority, the GPUs its running (not stopping) jobs hold on each node
        self.gpus_on_nodes: dict[int, dict[str, int]] = {}
        #: jobs to move off their nodes, with why: a node of theirs left the inventory or is draining
        self.evacuees: dict[str, str] = {}
        #: node -> the jobs holding GPUs on it (what a drain of that node waits for)
        self.on_node: dict[str, set[str]] = {}
        #: bumped whenever ``gpus_on_nodes`` changes: what a memo of what they add up to checks
        self.running_changes = 0
        # priority -> (``running_changes`` when counted, :meth:`gpus_below`)
        self._below: dict[int, tuple[int, int | None]] = {}
        # priority -> what each schedulable node would have free were the running jobs of the
        # classes below it halted (:meth:`frees_room_below`), kept as jobs come, stop and go
        self._freeable: dict[int, _Freeable] = {}

    def gpus_below(self, priority: int) -> int | None:
        """The GPUs the running jobs of the classes below ``priority`` hold, None where no such job
        runs (one may hold no GPUs and still be a victim: its node's CPUs or memory); memoised
        until the running jobs change, for the planner asks it of every class and demand it
        settles, step after step."""
        known = self._below.get(priority)
        if known is not None and known[0] == self.running_changes:
            return known[1]
        outranked = [below for below, jobs in self.running.items() if below < priority and jobs]
        gpus = sum(self.gpus_by_priority[below] for below in outranked) if outranked else None
        self._below[priority] = (self.running_changes, gpus)
        return gpus

    def hold(self, job: HeldJob) -> None:
        if not math.isfinite(job.started_at):  # it would not sort among the class's running jobs
            raise ValueError(f"job {job.job_id} started at {job.started_at}: not a time")
        if job.job_id in self.held:
            self.release(job.job_id)
        self.held[job.job_id] = job
        self.room.take(job.demand, job.gang)
        for node in job.gang.nodes:
            self.on_node.setdefault(node, set()).add(job.job_id)
        gpus = job.gang.gpus
        charge = self.held_charge(job)
        self.usage[job.tenant] = self.usage.get(job.tenant, 0) + charge
        self.gpus_held[job.tenant] = self.gpus_held.get(job.tenant, 0) + gpus
        if job.stopping:
            self.releasing[job.tenant] = self.releasing.get(job.tenant, 0) + charge
        else:
            self.gpus_by_priority[job.priority] = self.gpus_by_priority.get(job.priority, 0) + gpus
            self.running.setdefault(job.priority, {})[job.job_id] = job
            insort(self.by_start.setdefault(job.priority, []), (-job.started_at, job.job_id, job))
            self._count_on_nodes(job, 1)
        self._refresh_freeable(job.gang.nodes)
        if (why := self._evacuation(job.gang)) is not None:
            self.evacuees[job.job_id] = why

    def _evacuation(self, gang: Gang) -> str | None:
        """Why a gang must leave its nodes, if it must."""
        for name in gang.nodes:
            room = self.room.room(name)
            if room is None:
                return f"node {name} left the inventory"
            if room.node.draining:
                return f"node {name} is being drained"
        return None

    def release(self, job_id: str) -> HeldJob | None:
        """The job's GPUs are free again."""
        job = self.held.pop(job_id, None)
        if job is None:
            return None
        self.room.release(job.demand, job.gang)
        for node in job.gang.nodes:
            holders = self.on_node[node]
            holders.discard(job_id)
            if not holders:
                del self.on_node[node]
        gpus = job.gang.gpus
        charge = self.held_charge(job)
        self.usage[job.tenant] -= charge
        self.gpus_held[job.tenant] -= gpus
        if job.stopping:
            self.releasing[job.tenant] -= charge
        else:
            self.gpus_by_priority[job.priority] -= gpus
            self._stop_running(job)
        self._refresh_freeable(job.gang.nodes)
        self.evacuees.pop(job_id, None)
        return job

    def _count_on_nodes(self, job: HeldJob, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) the running ``job``'s GPUs in its class's per-node
        counts, which a victim search reads to rule a preemptor out without listing victims."""
        self.running_changes += 1
        on_nodes = self.gpus_on_nodes.setdefault(job.priority, {})
        for node, gpus in job.gang.learners:
            count = on_nodes.get(node, 0) + sign * len(gpus)
            if count:
                on_nodes[node] = count
            else:
                on_nodes.pop(node, None)

    def stop(self, job_id: str) -> HeldJob:
        """The job is being stopped: it holds its GPUs until released, but they are on their way out."""
        job = self.held[job_id]
        if not job.stopping:
            self.held[job_id] = replace(job, stopping=True)
            self.releasing[job.tenant] = self.releasing.get(job.tenant, 0) + self.held_charge(job)
            self.gpus_by_priority[job.priority] -= job.gang.gpus
            self._stop_running(job)
            self._refresh_freeable(job.gang.nodes)
        return self.held[job_id]

    def _stop_running(self, job: HeldJob) -> None:
        """``job`` no longer runs: it leaves its class's running jobs (and their counts)."""
        del self.running[job.priority][job.job_id]
        by_start = self.by_start[job.priority]
        del by_start[bisect_left(by_start, (-job.started_at, job.job_id))]
        self._count_on_nodes(job, -1)

    def frees_room_below(
        self, demand: Demand, priority: int, excluded: Iterable[str], kept: dict[str, int]
    ) -> bool:
        """Whether every learner of ``demand`` (which asks for GPUs) would fit outside ``excluded``
        were every running job of a class below ``priority`` halted but for the GPUs ``kept`` on
        each node (a search's young jobs), by GPUs alone (CPUs and memory not counted):
        :meth:`ClusterRoom.slots_with` of what those jobs hold on each node, against its learners,
        without reading every node. A victim search is ruled out by it many times a step (a gang
        of whole nodes mostly is), and every placement changed what that read. The nodes left out
        are read only while the rest could still do: three asks in four fail on the whole cluster
        already (at load 1.3), and reading them was most of an ask's cost."""
        freeable = self._freeable.get(priority)
        if freeable is None:
            if len(self._freeable) >= _FREEABLE_KEPT:
                self._freeable.clear()
            freeable = self._freeable[priority] = _Freeable(len(self.room))
            for room in self.room.usable.values():
                freeable.move(room, self._freeable_on(room, priority))
        cluster = self.room
        per = demand.gpus
        needed = demand.learners
        types = cluster.types_for(demand)
        values = freeable.values
        total = 0
        for gpu_type in types:
            # a list or None, not ``.get(gpu_type, ())``: compiled, a list is read by index, a list
            # or a tuple through the iterator protocol
            counts = freeable.counts.get(gpu_type)
            if counts is not None:
                for value, nodes in enumerate(counts):
                    total += nodes * (value // per)
        for name, gpus in kept.items():
            left = cluster.usable.get(name)
            if gpus and left is not None and left.node.gpu_type in types:
                value = values[left.index]
                total += (value - gpus) // per - value // per
        for name in excluded:  # each takes off what that node counted (none below nothing)
            if total < needed:
                return False
            left = cluster.usable.get(name)
            if left is not None and left.node.gpu_type in types:
                total -= (values[left.index] - kept.get(name, 0)) // per
        return total >= needed

    def _freeable_on(self, room: NodeRoom, priority: int) -> int:
        """The GPUs free on ``room`` with those of the running jobs below ``priority`` added."""
        name = room.node.name
        value = len(room.free)
        for below, on_nodes in self.gpus_on_nodes.items():
            if below < priority:
                value += on_nodes.get(name, 0)
        return value

    def _refresh_freeable(self, nodes: Iterable[str]) -> None:
        """What the nodes of a gang that came, stopped or went would free, for every priority kept."""
        if not self._freeable:
            return
        usable = self.room.usable
        for name in nodes:
            room = usable.get(name)
            if room is not None:
                for priority, freeable in self._freeable.items():
                    freeable.move(room, self._freeable_on(room, priority))


#: priorities whose freeable GPUs a state keeps (:meth:`ClusterState.frees_room_below`): a
#: class is a priority and a service band, so a state sees a few; the bound keeps a tenant's many
#: distinct priorities from costing every hold that many updates
_FREEABLE_KEPT = 32


class _Freeable:
    """For one priority, what each schedulable node would have free were the running jobs of the
    classes below it halted (by the room's node index), and per GPU type how many nodes would
    have each such count."""

    __slots__ = ("counts", "values")

    def __init__(self, nodes: int) -> None:
        self.values: list[int] = [-1] * nodes  # -1: not counted yet
        self.counts: dict[str, list[int]] = {}

    def move(self, room: NodeRoom, value: int) -> None:
        """The node of ``room`` would now free ``value`` GPUs."""
        index = room.index
        before = self.values[index]
        if before == value:
            return
        counts = self.counts.setdefault(room.node.gpu_type, [])
        if before >= 0:
            counts[before] -= 1
        if value >= len(counts):
            counts.extend([0] * (value + 1 - len(counts)))
        counts[value] += 1
        self.values[index] = value
