"""The reactor host: folds the jobs of its partitions of the events topic and drives each one.

On gaining a partition it folds the partition to its end, then asks the driver for every job
in it (this is what re-drives work interrupted by a crash), and skips the records below that end
when the consumer redelivers them. Every applied event is shown to the observers (the monitor), who
need to know which learners to expect; the driver is asked once per job per batch, after the batch's
events are folded. The events of one decision are appended together, so a state the owner passes
through within a decision (SCHEDULED, on the way to LAUNCHING with the allocation) starts nothing;
and since a fetch may end between two records of one decision, a job left in SCHEDULED by a batch
is not driven then either: its ``JobLaunching`` is the next record. Only a job an older owner left
in SCHEDULED (it launched on the reactor's ``BeginLaunch``) stays there; it is driven when its
partition is loaded and by the reconcile pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import structlog

from ffdl.core.aggregate import Aggregates, Applied, Kinds
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events.envelope import Event
from ffdl.handlers.aio import sleep_or_stop
from ffdl.handlers.driver import Driver
from ffdl.handlers.ports import Bus
from ffdl.handlers.runtime import EventFollower

log = structlog.get_logger(__name__)


class JobObserver(Protocol):
    def observe(self, event: Event | None, job: Job) -> None:
        """Called with each applied event and the job after it (event None: the job was loaded)."""

    def forget(self, job_ids: set[str]) -> None: ...


class ReactorHost(EventFollower):
    def __init__(
        self, bus: Bus, events_topic: str, driver: Driver, observers: Sequence[JobObserver] = ()
    ) -> None:
        super().__init__(bus, events_topic, Kinds(JOBS))  # nodes are the scheduler's concern
        self.driver = driver
        self._observers = list(observers)
        self._touched: dict[str, Job] = {}  # the jobs a batch changed, driven once it is folded

    def owns(self, job_id: str) -> bool:
        return job_id in self.book.jobs

    async def loaded(self, partitions: list[int]) -> None:
        for job in self.book.on_partitions(JOBS, partitions).values():
            self._notify(None, job)
            self.driver.update(job)
        log.info("reacting for partitions", partitions=partitions, jobs=len(self.book.jobs))

    def revoked(self, dropped: Aggregates) -> None:
        job_ids = set(dropped.of(JOBS))
        self.driver.forget(job_ids)
        for observer in self._observers:
            observer.forget(job_ids)

    async def policy(self, applied: Applied[Any, Any]) -> None:
        folded = applied.of(JOBS)
        if folded is not None:
            self._notify(folded.event, folded.after)
            self._touched[folded.after.job_id] = folded.after

    async def processed(self) -> None:
        touched, self._touched = self._touched, {}
        for job in touched.values():
            if job.state is not JobState.SCHEDULED:
                self.driver.update(job)

    def _notify(self, event: Event | None, job: Job) -> None:
        for observer in self._observers:
            observer.observe(event, job)

    async def reconcile_forever(self, stop: asyncio.Event, every_s: float = 5.0) -> None:
        """Re-ask the driver for every job now and then: heals an action that failed."""
        while not await sleep_or_stop(stop, every_s):
            for job in list(self.book.jobs.values()):
                self.driver.update(job)
