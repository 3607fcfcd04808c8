"""The reactor drives each job once per batch, on the state the batch leaves it in; a batch that ends
between the two records of an allocation (``GpusAllocated``, ``JobLaunching``) drives nothing for
it, and a job an older owner left in SCHEDULED is driven by the reconcile pass."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

from ffdl.adapters.bus import open_bus
from ffdl.core.job import Job
from ffdl.core.states import JobState
from ffdl.events import job_events as ev
from ffdl.events.codec import event_to_json
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers.driver import Driver
from ffdl.handlers.ports import Record
from ffdl.handlers.reactor import ReactorHost
from tests.services import wait_until_async

TOPIC = "ffdl.events"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
PLACEMENT = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))


class RecordingDriver(Driver):
    """A driver that notes the state of each job it is asked about, and runs nothing."""

    def __init__(self) -> None:
        self.asked: list[JobState] = []

    def update(self, job: Job) -> None:
        self.asked.append(job.state)


def records(first_offset: int, first_seq: int, *datas: EventData) -> list[Record]:
    return [
        Record(
            TOPIC,
            0,
            first_offset + n,
            "job-1",
            event_to_json(
                Event(
                    event_id=uuid.uuid4(),
                    job_id="job-1",
                    tenant="acme",
                    seq=first_seq + n,
                    occurred_at=NOW,
                    producer="owner",
                    data=data,
                )
            ),
        )
        for n, data in enumerate(datas)
    ]


async def test_a_batch_that_ends_inside_an_allocation_drives_nothing_until_the_launch(tmp_path: Path) -> None:
    bus = open_bus(f"embedded://{tmp_path}", 1)
    await bus.start()
    driver = RecordingDriver()
    reactor = ReactorHost(bus, TOPIC, driver)
    queued = records(
        0,
        1,
        ev.JobSubmitted(spec=JobSpec(name="j", command="true", gpus=1)),
        ev.JobAccepted(),
        ev.JobQueued(),
    )
    try:
        await reactor.process([*queued, *records(3, 4, ev.GpusAllocated(placement=PLACEMENT))])
        assert driver.asked == [], "SCHEDULED: the launch is the next record"
        await reactor.process(records(4, 5, ev.JobLaunching(attempt=1)))
        assert driver.asked == [JobState.LAUNCHING]

        reconciled = RecordingDriver()
        left = ReactorHost(bus, TOPIC, reconciled)  # a job an older owner left in SCHEDULED
        await left.process([*queued, *records(3, 4, ev.GpusAllocated(placement=PLACEMENT))])
        stop = asyncio.Event()
        reconciling = asyncio.create_task(left.reconcile_forever(stop, every_s=0.01))
        await wait_until_async(lambda: JobState.SCHEDULED in reconciled.asked, 5, what="the reconcile pass")
        stop.set()
        await reconciling
    finally:
        await bus.close()
