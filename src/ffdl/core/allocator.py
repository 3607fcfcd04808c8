"""Gang GPU placement over a node inventory: every learner of a job placed, or none.

Pure functions over an immutable view of free capacity. ``pack`` (FfDL's "dense") puts each
learner on the node with the least room that still fits it, keeping whole nodes free for big
gangs; ``spread`` puts each on the node with the most room, for jobs that prefer fewer
neighbours. A learner never spans nodes; GPU indices are handed out lowest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from ffdl.events.model import JobSpec, LearnerPlacement, Placement

PlacementPolicy = Literal["pack", "spread"]


@dataclass(frozen=True, slots=True)
class Node:
    """A machine of the inventory; ``schedulable`` is False while it is cordoned, and ``draining``
    while its jobs are being moved off it."""

    name: str
    gpus: int
    gpu_type: str = "simulated"
    cpus: float = 64.0
    memory_mb: int = 262_144
    schedulable: bool = True
    draining: bool = False


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What is free on one node right now."""

    node: Node
    free_gpus: frozenset[int]
    free_cpus: float
    free_memory_mb: int

    def fits(self, spec: JobSpec) -> bool:
        return (
            self.node.schedulable
            and (spec.gpu_type is None or spec.gpu_type == self.node.gpu_type or spec.gpus == 0)
            and len(self.free_gpus) >= spec.gpus
            and self.free_cpus >= spec.cpus - CPU_EPSILON
            and self.free_memory_mb >= spec.memory_mb
        )

    def take(self, spec: JobSpec) -> tuple[NodeCapacity, tuple[int, ...]]:
        gpus = tuple(sorted(self.free_gpus)[: spec.gpus])
        rest = replace(
            self,
            free_gpus=self.free_gpus - frozenset(gpus),
            free_cpus=round(self.free_cpus - spec.cpus, 6),
            free_memory_mb=self.free_memory_mb - spec.memory_mb,
        )
        return rest, gpus


Capacity = Mapping[str, NodeCapacity]

#: CPUs are fractional (0.2 of a core); sums of such fractions are kept rounded to this precision.
CPU_EPSILON = 1e-6


def empty_capacity(nodes: Iterable[Node]) -> dict[str, NodeCapacity]:
    return {n.name: NodeCapacity(n, frozenset(range(n.gpus)), n.cpus, n.memory_mb) for n in nodes}


def subtract(capacity: Capacity, spec: JobSpec, placement: Placement) -> dict[str, NodeCapacity]:
    """Capacity left once ``placement`` (of a job with ``spec``) holds its share."""
    left = dict(capacity)
    for learner in placement.learners:
        node = left.get(learner.node)
        if node is None:  # a node that left the inventory: nothing to take from
            continue
        left[learner.node] = replace(
            node,
            free_gpus=node.free_gpus - frozenset(learner.gpus),
            free_cpus=round(node.free_cpus - spec.cpus, 6),
            free_memory_mb=node.free_memory_mb - spec.memory_mb,
        )
    return left


def _room(capacity: NodeCapacity, spec: JobSpec) -> tuple[float, float, str]:
    primary = len(capacity.free_gpus) if spec.gpus else capacity.free_cpus
    return (primary, capacity.free_memory_mb, capacity.node.name)


def place_gang(spec: JobSpec, capacity: Capacity, policy: PlacementPolicy | None = None) -> Placement | None:
    """A placement for every learner of ``spec``, or ``None`` if the whole gang does not fit now."""
    policy = policy or spec.placement
    left = dict(capacity)
    learners = []
    for rank in range(spec.learners):
        candidates = [c for c in left.values() if c.fits(spec)]
        if not candidates:
            return None
        if policy == "pack":
            chosen = min(candidates, key=lambda c: _room(c, spec))
        else:
            chosen = max(candidates, key=lambda c: (_room(c, spec)[:2], _reverse(c.node.name)))
        left[chosen.node.name], gpus = chosen.take(spec)
        learners.append(
            LearnerPlacement(rank=rank, node=chosen.node.name, gpus=gpus, gpu_type=chosen.node.gpu_type)
        )
    return Placement(learners=tuple(learners))


def _reverse(name: str) -> tuple[int, ...]:
    """A key that orders names backwards, so ``max`` breaks ties by the smallest name."""
    return tuple(-ord(ch) for ch in name)


def could_ever_fit(spec: JobSpec, nodes: Iterable[Node]) -> bool:
    """Whether the gang fits the inventory when it is completely empty (else: reject it)."""
    return place_gang(spec, empty_capacity(n for n in nodes if n.schedulable), "pack") is not None
