"""The notifier role: a retained status message per job, for subscribers outside the platform.

It folds the jobs of its partitions of the events topic and, on every state transition, publishes
the job's status, retained, on ``ffdl/<tenant>/jobs/<job>/status``; deleting a job clears it (an
empty retained message). A subscriber that connects late reads each job's last status at once. On
gaining partitions it publishes the status of each of their jobs again (see :meth:`Notifier.loaded`).

Where the messages go is its port, :class:`StatusSink` (MQTT in ``adapters/mqtt.py``). A publish
returns once the sink has acknowledged it, and the runtime commits a batch only after its policy
returned, so a subscriber may see a status twice, never miss the last one.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from ffdl.core.aggregate import Applied, Kinds
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.events import job_events as ev
from ffdl.handlers.ports import Bus
from ffdl.handlers.runtime import EventFollower


class StatusSink(Protocol):
    async def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        """Deliver ``payload`` on ``topic`` (kept for late subscribers if ``retain``; an empty
        retained payload clears what was kept); return once the sink has acknowledged it."""


def status_topic(tenant: str, job_id: str) -> str:
    return f"ffdl/{tenant}/jobs/{job_id}/status"


def status_payload(job: Job) -> bytes:
    """The job's status as published: its state, since when and why, its attempt and seq."""
    entered = job.history[-1]
    return json.dumps(
        {
            "job_id": job.job_id,
            "tenant": job.tenant,
            "state": str(job.state),
            "since": entered.at.isoformat(),
            "reason": entered.reason,
            "attempt": job.attempt,
            "seq": job.seq,
        },
        sort_keys=True,
    ).encode()


class Notifier(EventFollower):
    """Turns each job's transitions into retained status messages on ``sink``."""

    def __init__(self, bus: Bus, events_topic: str, sink: StatusSink) -> None:
        super().__init__(bus, events_topic, Kinds(JOBS))  # a node's event changes no job's status
        self._sink = sink

    async def loaded(self, partitions: list[int]) -> None:
        """Publish the status of every job of ``partitions`` again. Their events are folded to the
        end of the log on assignment, and the records after the last committed offset are then
        skipped as folded: a transition the previous member folded but did not publish (it stopped
        first) would otherwise never be."""
        for job in self.book.on_partitions(JOBS, partitions).values():
            await self._publish(job)

    async def policy(self, applied: Applied[Any, Any]) -> None:
        folded = applied.of(JOBS)
        if folded is None:
            return
        if isinstance(folded.event.data, ev.JobDeleted) or (
            folded.before is None or folded.before.state is not folded.after.state
        ):
            await self._publish(folded.after)

    async def _publish(self, job: Job) -> None:
        """The job's status, retained; for a deleted job, an empty retained message that clears it."""
        payload = b"" if job.deleted else status_payload(job)
        await self._sink.publish(status_topic(job.tenant, job.job_id), payload, retain=True)
