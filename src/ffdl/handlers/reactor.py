"""The reactor host: folds the jobs of its partitions of the events topic and drives each one.

On gaining a partition it folds the partition to its end, then asks the driver for every job
in it (this is what re-drives work interrupted by a crash), and skips the records below that end
when the consumer redelivers them. Every applied event is shown to the observers (the monitor), who
need to know which learners to expect; the driver is asked once per job per batch, after the batch's
events are folded. The events of one decision are appended together, so a state the owner passes
through within a decision (SCHEDULED, on the way to LAUNCHING with the allocation) starts nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog

from ffdl.core.job import Job
from ffdl.events.envelope import Event
from ffdl.handlers.driver import Driver
from ffdl.handlers.ports import Bus, Record, TopicPartition
from ffdl.handlers.runtime import AggregateBook, decode_event

log = structlog.get_logger(__name__)


class JobObserver(Protocol):
    def observe(self, event: Event | None, job: Job) -> None:
        """Called with each applied event and the job after it (event None: the job was loaded)."""

    def forget(self, job_ids: set[str]) -> None: ...


class ReactorHost:
    def __init__(
        self, bus: Bus, events_topic: str, driver: Driver, observers: Sequence[JobObserver] = ()
    ) -> None:
        self._bus = bus
        self._topic = events_topic
        self.driver = driver
        self._observers = list(observers)
        self.book = AggregateBook(bus, events_topic)
        self.partitions: frozenset[int] = frozenset()

    def owns(self, job_id: str) -> bool:
        return job_id in self.book.jobs

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        await self.book.load(mine)
        self.partitions = self.partitions | frozenset(mine)
        for job_id, job in self.book.jobs.items():
            if self.book.partition_of[job_id] in mine:
                self._notify(None, job)
                self.driver.update(job)
        log.info("reacting for partitions", partitions=mine, jobs=len(self.book.jobs))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions if tp.topic == self._topic}
        job_ids = {j for j, p in self.book.partition_of.items() if p in gone}
        self.book.drop(gone)
        self.partitions = self.partitions - frozenset(gone)
        self.driver.forget(job_ids)
        for observer in self._observers:
            observer.forget(job_ids)

    async def process(self, records: Sequence[Record]) -> None:
        folded: dict[str, Job] = {}
        for record in records:
            if self.book.folded(record):
                continue
            event = decode_event(record)
            if not isinstance(event, Event):
                continue  # undecodable (logged), or a node's event: nodes are the scheduler's concern
            applied = self.book.apply(event, record.partition)
            if applied is None:
                continue
            _, job = applied
            self._notify(event, job)
            folded[job.job_id] = job
        for job in folded.values():
            self.driver.update(job)

    def _notify(self, event: Event | None, job: Job) -> None:
        for observer in self._observers:
            observer.observe(event, job)

    async def reconcile_forever(self, stop: asyncio.Event, every_s: float = 5.0) -> None:
        """Re-ask the driver for every job now and then: heals an action that failed."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                for job in list(self.book.jobs.values()):
                    self.driver.update(job)
