"""The scheduler role: the one process that sees the whole cluster and hands out GPUs.

It runs under leader election and folds every partition of the events topic (its consumer group
has one active member). After each batch it plans with ``core.scheduling.plan`` over the queued
jobs and the free capacity, and sends ``AllocateGpus`` with its fencing token; the jobs' owners
refuse a token that is no longer the leader's. An allocation it sent counts as held until the
job's next event shows it accepted or refused, so one GPU is never promised twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from ffdl.core.allocator import Node, empty_capacity, subtract
from ffdl.core.job import Job
from ffdl.core.scheduling import QueuedJob, plan
from ffdl.core.states import JobState
from ffdl.events import commands as cmd
from ffdl.events.model import Placement
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import Bus, Record, TopicPartition
from ffdl.handlers.runtime import JobBook, decode_event

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Pending:
    placement: Placement
    seq_when_sent: int


class Scheduler:
    def __init__(
        self,
        bus: Bus,
        events_topic: str,
        sender: CommandSender,
        inventory: Callable[[], Sequence[Node]],
        fencing_token: int,
    ) -> None:
        self._bus = bus
        self._topic = events_topic
        self._sender = sender
        self._inventory = inventory
        self._token = fencing_token
        self.book = JobBook(bus, events_topic)
        self._loaded_until: dict[int, int] = {}
        self._pending: dict[str, _Pending] = {}
        self._queued_order: dict[str, tuple[str, str]] = {}
        self._lock = asyncio.Lock()

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        ends = await self._bus.end_offsets(self._topic)
        await self.book.load(mine)
        self._loaded_until.update({p: ends.get(p, 0) for p in mine})
        for job in self.book.jobs.values():
            self._track(job)
        await self.schedule()

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions if tp.topic == self._topic}
        self.book.drop(gone)
        for partition in gone:
            self._loaded_until.pop(partition, None)

    async def process(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.offset < self._loaded_until.get(record.partition, 0):
                continue
            event = decode_event(record)
            if event is None:
                continue
            applied = self.book.apply(event, record.partition)
            if applied is not None:
                self._track(applied[1])
        await self.schedule()

    def _track(self, job: Job) -> None:
        pending = self._pending.get(job.job_id)
        if pending is not None and job.seq > pending.seq_when_sent:
            del self._pending[job.job_id]
        if job.state is JobState.QUEUED:
            entered = job.history[-1]
            self._queued_order.setdefault(job.job_id, (entered.at.isoformat(), job.job_id))
        else:
            self._queued_order.pop(job.job_id, None)

    def queue(self) -> list[QueuedJob]:
        ordered = sorted(self._queued_order.items(), key=lambda item: item[1])
        return [
            QueuedJob(job_id, self.book.jobs[job_id].tenant, self.book.jobs[job_id].spec, order)
            for order, (job_id, _) in enumerate(ordered)
            if job_id not in self._pending and self.book.jobs[job_id].placement is None
        ]

    async def schedule(self) -> None:
        async with self._lock:
            capacity = empty_capacity(self._inventory())
            for job in self.book.jobs.values():
                if job.placement is not None:
                    capacity = subtract(capacity, job.spec, job.placement)
            for job_id, pending in self._pending.items():
                capacity = subtract(capacity, self.book.jobs[job_id].spec, pending.placement)
            for allocation in plan(self.queue(), capacity):
                job = self.book.jobs[allocation.job_id]
                command = self._sender.make(
                    job.job_id,
                    job.tenant,
                    cmd.AllocateGpus(placement=allocation.placement, reason=allocation.reason),
                    fencing_token=self._token,
                )
                self._pending[job.job_id] = _Pending(allocation.placement, job.seq)
                await self._sender.send(command)
                log.info("gpus offered", job_id=job.job_id, reason=allocation.reason,
                         command_id=str(command.command_id))
