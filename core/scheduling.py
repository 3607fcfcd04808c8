"""Which queued gangs get GPUs now: a pure planning function over the queue and free capacity.

Jobs are considered by priority (higher first), then by the order they were queued; a gang that
does not fit is skipped so smaller ones behind it can run (no head-of-line blocking, FfDL's FIFO
flaw). Each planned placement is subtracted from the capacity before the next job is considered,
so one plan never promises a GPU twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ffdl.core.allocator import Capacity, place_gang, subtract
from ffdl.events.model import JobSpec, Placement


@dataclass(frozen=True, slots=True)
class QueuedJob:
    job_id: str
    tenant: str
    spec: JobSpec
    queued_order: int


@dataclass(frozen=True, slots=True)
class PlannedAllocation:
    job_id: str
    placement: Placement
    reason: str


def queue_order(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
    return sorted(queue, key=lambda job: (-job.spec.priority, job.queued_order, job.job_id))


def plan(queue: Iterable[QueuedJob], capacity: Capacity) -> list[PlannedAllocation]:
    """Allocations to make now, in the order they should be sent."""
    planned = []
    for position, job in enumerate(queue_order(queue)):
        placement = place_gang(job.spec, capacity)
        if placement is None:
            continue
        capacity = subtract(capacity, job.spec, placement)
        reason = f"fits now ({job.spec.placement}); was position {position + 1} in the queue"
        planned.append(PlannedAllocation(job.job_id, placement, reason))
    return planned
