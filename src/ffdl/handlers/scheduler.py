"""The scheduler role: the one process that sees the whole cluster, admits, hands out GPUs, preempts.

It runs under leader election and folds every partition of the events topic (its consumer group
has one active member): the jobs, and the nodes of the inventory. After each batch it sends, all
with its fencing token (the owners refuse a token that is no longer the leader's):

* node observations (``ObserveNode``, ``ReportNodeLost``, ``RemoveNode``) wherever its inventory
  source (the configuration, the Kubernetes nodes) disagrees with the nodes on the log, so every
  join, cordon, loss and removal is an event; operators' cordons and drains arrive as events too;
* ``AdmitJob`` or ``RejectJob`` for each submitted job, once the log agrees with the source: a job
  that could never fit the inventory (empty, every cordon lifted) is rejected with the reason;
* from one planning step of :mod:`ffdl.core.scheduling` over the present nodes and the folded
  jobs: ``AllocateGpus`` for each gang that fits; ``HaltJob(requeue=True)`` for each job
  preempted, or on a node that left the inventory or is being drained; ``RecordWaitReason`` for
  each waiting job whose reason changed since the one on the log.

Everything it sent counts as done until the owner's answer is on the log (an event whose
``causation_id`` is the command's id) or the job's state makes it moot: an allocation it sent is
held, a preempted job is stopping, a reason is recorded. Waiting for the answer itself, not just
for the job's next event, matters: a job's next event may answer an earlier command (a reason
sent a cycle before), and forgetting the allocation then would let its GPUs be promised twice.
So one GPU is never promised twice, no job is preempted twice, and an unchanged reason is never
sent again. A new
leader starts from the log alone: reservations and preemption claims live in the jobs' recorded
reasons, so it carries on where the old one stopped.

What it knows and decides is :class:`~ffdl.handlers.scheduler_state.SchedulerState`, a structure
with no asyncio; this module is its async shell. Folding and planning are apart: :meth:`process`
only folds a batch and marks a plan due, and :meth:`plan_forever` plans once for everything folded
since its last pass (a fetch brings batches of several partitions: one plan, not one per batch),
and at least every ``SCHEDULE_TICK_S`` even when nothing arrives, since time alone changes some
decisions (minimum runtimes, backoffs, what the inventory source sees). One lock serialises a
planning step with the folding of new records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ffdl.core.aggregate import Aggregates, Applied
from ffdl.core.cluster import ClusterState
from ffdl.core.scheduling import Plan, SchedulerPolicy
from ffdl.events.codec import AnyEvent
from ffdl.handlers.aio import sleep_or_stop, until_stopped
from ffdl.handlers.messaging import CommandSender, utcnow
from ffdl.handlers.ports import Bus, InventorySource, Record
from ffdl.handlers.runtime import EventFollower
from ffdl.handlers.scheduler_state import SchedulerState

#: How often the scheduler plans when no event arrives.
SCHEDULE_TICK_S = 1.0
#: The least time between two plans: under a flood of events a pass covers more of them (a pass
#: costs about the same for one event as for a hundred), for at most this much added latency.
MIN_PLAN_INTERVAL_S = 0.02


class Scheduler(EventFollower):
    def __init__(
        self,
        bus: Bus,
        events_topic: str,
        sender: CommandSender,
        inventory: InventorySource,
        fencing_token: int,
        *,
        policy: SchedulerPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(bus, events_topic)
        self._sender = sender
        self._inventory = inventory
        self.state = SchedulerState(
            self.book,
            sender,
            fencing_token,
            policy=policy or SchedulerPolicy(),
            clock=lambda: clock().timestamp(),
        )
        self._lock = asyncio.Lock()
        self._due = asyncio.Event()  # something was folded since the last plan
        self.ready = False  # its partitions are folded: it may plan

    async def loaded(self, partitions: list[int]) -> None:
        self.state.loaded()
        self.ready = True
        self._due.set()

    def revoked(self, dropped: Aggregates) -> None:
        self.state.revoked()
        self.ready = False

    async def process(self, records: Sequence[Record]) -> None:
        async with self._lock:
            await super().process(records)
        self._due.set()

    async def policy(self, applied: Applied[Any, Any]) -> None:
        self.state.folded(applied)

    def fold(self, event: AnyEvent, partition: int) -> None:
        """Apply one event of ``partition`` to the jobs and nodes the scheduler knows (duplicates are
        ignored), as :meth:`process` does for a record."""
        applied = self.book.apply(event, partition)
        if applied is not None:
            self.state.folded(applied)

    def next_plan(self, now: float) -> tuple[ClusterState, Plan]:
        """What the scheduler would decide at ``now`` from what it has folded (and sent) so far."""
        return self.state.next_plan(now)

    async def plan_forever(self, stop: asyncio.Event, tick_s: float = SCHEDULE_TICK_S) -> None:
        """Plan whenever something was folded, and every ``tick_s`` anyway, until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await until_stopped(asyncio.wait_for(self._due.wait(), tick_s), stop)
            self._due.clear()
            if self.ready and not stop.is_set():
                await self.schedule()
                await sleep_or_stop(stop, MIN_PLAN_INTERVAL_S)

    async def schedule(self) -> None:
        """One planning step over what is folded and what the inventory source sees; sends what it decides."""
        async with self._lock:
            commands = self.state.decide(self._inventory.observe())
            if commands:
                await self._sender.send(*commands)
