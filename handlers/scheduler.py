"""The scheduler role: the one process that sees the whole cluster, hands out GPUs and preempts.

It runs under leader election and folds every partition of the events topic (its consumer group
has one active member). After each batch it builds the cluster state from the inventory and the
folded jobs, runs one planning step of :mod:`ffdl.core.scheduling`, and sends what the plan says,
all with its fencing token (the jobs' owners refuse a token that is no longer the leader's):

* ``AllocateGpus`` for each gang that fits;
* ``HaltJob(requeue=True)`` for each job preempted, or stranded on a node that left the inventory;
* ``RecordWaitReason`` for each waiting job whose reason changed since the one on the log.

Everything it sent counts as done until the owner's answer is on the log (an event whose
``causation_id`` is the command's id) or the job's state makes it moot: an allocation it sent is
held, a preempted job is stopping, a reason is recorded. Waiting for the answer itself, not just
for the job's next event, matters: a job's next event may answer an earlier command (a reason
sent a cycle before), and forgetting the allocation then would let its GPUs be promised twice.
So one GPU is never promised twice, no job is preempted twice, and an unchanged reason is never
sent again. A new
leader starts from the log alone: reservations and preemption claims live in the jobs' recorded
reasons, so it carries on where the old one stopped.

Processing is sequential: one lock serialises the planning step with the folding of new records.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from ffdl.core.allocator import Node
from ffdl.core.cluster import ClusterState, Demand, Gang, HeldJob
from ffdl.core.job import Job, WaitRecord
from ffdl.core.scheduling import Plan, SchedulerPolicy, WaitingJob, plan
from ffdl.core.states import JobState
from ffdl.events import commands as cmd
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import Placement
from ffdl.handlers.messaging import CommandSender, utcnow
from ffdl.handlers.ports import Bus, Record, TopicPartition
from ffdl.handlers.runtime import JobBook, decode_event

log = structlog.get_logger(__name__)

S = JobState
#: States in which a job holding GPUs may be preempted; in any other it is already on its way out.
_PREEMPTIBLE = frozenset({S.SCHEDULED, S.LAUNCHING, S.RUNNING, S.RESTARTING})


@dataclass(frozen=True, slots=True)
class _Sent:
    """A command sent for a job whose owner's answer is not on the log yet."""

    command_id: uuid.UUID
    placement: Placement | None = None
    wait: WaitRecord | None = None


class Scheduler:
    def __init__(
        self,
        bus: Bus,
        events_topic: str,
        sender: CommandSender,
        inventory: Callable[[], Sequence[Node]],
        fencing_token: int,
        *,
        policy: SchedulerPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._bus = bus
        self._topic = events_topic
        self._sender = sender
        self._inventory = inventory
        self._token = fencing_token
        self._policy = policy or SchedulerPolicy()
        self._clock = clock
        self.book = JobBook(bus, events_topic)
        self._allocations: dict[str, _Sent] = {}
        self._halts: dict[str, _Sent] = {}
        self._reasons: dict[str, _Sent] = {}
        self._queued_order: dict[str, tuple[float, str]] = {}
        self._lock = asyncio.Lock()

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        await self.book.load(mine)
        for job in self.book.jobs.values():
            self._track(job, None)
        await self.schedule()

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions if tp.topic == self._topic}
        self.book.drop(gone)
        for sent in (self._allocations, self._halts, self._reasons, self._queued_order):
            for job_id in [j for j in sent if j not in self.book.jobs]:
                del sent[job_id]

    async def process(self, records: Sequence[Record]) -> None:
        async with self._lock:
            for record in records:
                if self.book.folded(record):
                    continue
                event = decode_event(record)
                if event is not None:
                    self.fold(event, record.partition)
        await self.schedule()

    def fold(self, event: Event, partition: int) -> None:
        """Apply one event of ``partition`` to the jobs the scheduler knows (duplicates are ignored)."""
        applied = self.book.apply(event, partition)
        if applied is not None:
            self._track(applied[1], event)

    def _track(self, job: Job, event: Event | None) -> None:
        """Forget what the owner has answered (``event`` caused by it) or what the job's state settles."""
        for sent in (self._allocations, self._halts, self._reasons):
            entry = sent.get(job.job_id)
            if entry is not None and event is not None and event.causation_id == entry.command_id:
                del sent[job.job_id]
        if job.state is not S.QUEUED or job.placement is not None:
            self._allocations.pop(job.job_id, None)
        if job.state not in _PREEMPTIBLE:
            self._halts.pop(job.job_id, None)
        if job.state is S.QUEUED:
            entered = job.history[-1]
            self._queued_order.setdefault(job.job_id, (entered.at.timestamp(), job.job_id))
        else:
            self._queued_order.pop(job.job_id, None)
            self._reasons.pop(job.job_id, None)

    def cluster_state(self, now: float) -> ClusterState:
        """The inventory with every GPU held: by the folded jobs and by allocations sent but unanswered."""
        state = ClusterState(self._inventory())
        for job_id in sorted(self.book.jobs):
            job = self.book.jobs[job_id]
            sent = self._allocations.get(job_id)
            placement = job.placement or (sent.placement if sent else None)
            if placement is None:
                continue
            allocated_at = job.allocated_at if job.placement is not None else None
            stopping = (job.placement is not None and job.state not in _PREEMPTIBLE) or job_id in self._halts
            state.hold(
                HeldJob(
                    job_id=job_id,
                    tenant=job.tenant,
                    demand=Demand.of(job.spec),
                    priority=job.spec.priority,
                    gang=Gang.of(placement),
                    started_at=allocated_at.timestamp() if allocated_at else now,
                    stopping=stopping,
                )
            )
        return state

    def waiting(self) -> list[WaitingJob]:
        """Queued jobs that hold no GPUs and have no allocation on the way, with their latest reason."""
        waiting = []
        for job_id, order in self._queued_order.items():
            job = self.book.jobs[job_id]
            if job.placement is not None or job_id in self._allocations:
                continue
            waiting.append(
                WaitingJob(
                    job_id,
                    job.tenant,
                    Demand.of(job.spec),
                    job.spec.priority,
                    order,
                    self._current_reason(job),
                )
            )
        return waiting

    def _current_reason(self, job: Job) -> WaitRecord | None:
        sent = self._reasons.get(job.job_id)
        return sent.wait if sent is not None else job.waiting

    def next_plan(self, now: float) -> tuple[ClusterState, Plan]:
        """What the scheduler would decide at ``now`` from what it has folded (and sent) so far."""
        state = self.cluster_state(now)
        return state, plan(state, self.waiting(), now, self._policy)

    async def schedule(self) -> None:
        async with self._lock:
            state, decided = self.next_plan(self._clock().timestamp())
            commands: list[Command] = []
            for eviction in decided.evictions:
                job = self.book.jobs[eviction.job_id]
                commands.append(self._command(job, cmd.HaltJob(reason=eviction.reason, requeue=True)))
                self._halts[job.job_id] = _Sent(commands[-1].command_id)
                log.info(
                    "job preempted",
                    job_id=job.job_id,
                    preempted_by=eviction.preempted_by,
                    reason=eviction.reason,
                    command_id=str(commands[-1].command_id),
                )
            for allocation in decided.allocations:
                job = self.book.jobs[allocation.job_id]
                placement = allocation.gang.placement(state.room)
                commands.append(
                    self._command(job, cmd.AllocateGpus(placement=placement, reason=allocation.reason))
                )
                self._allocations[job.job_id] = _Sent(commands[-1].command_id, placement=placement)
                log.info(
                    "gpus offered",
                    job_id=job.job_id,
                    reason=allocation.reason,
                    command_id=str(commands[-1].command_id),
                )
            for job_id, wait in decided.waits.items():
                job = self.book.jobs[job_id]
                if wait.same_as(self._current_reason(job)):
                    continue
                data = cmd.RecordWaitReason(
                    code=wait.code,
                    detail=wait.detail,
                    waiting_for=wait.waiting_for,
                    reserved_nodes=wait.reserved_nodes,
                )
                commands.append(self._command(job, data))
                self._reasons[job_id] = _Sent(commands[-1].command_id, wait=wait)
                log.debug("job waits", job_id=job_id, code=str(wait.code), detail=wait.detail)
            if commands:
                await self._sender.send(*commands)

    def _command(self, job: Job, data: CommandData) -> Command:
        return self._sender.make(job.job_id, job.tenant, data, fencing_token=self._token)
