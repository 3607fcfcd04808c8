"""A job folded from a list of event payloads, for tests that need a job in a given state."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from ffdl.core.job import Job, evolve, start
from ffdl.events import job_events as ev
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement


def folded_job(
    datas: Sequence[EventData], at: datetime, *, job_id: str = "job-1", tenant: str = "acme"
) -> tuple[Job, list[Event]]:
    """The job ``datas`` make, in order from its submission, each event occurring ``at``; and the events."""
    events = [
        Event(
            event_id=uuid.uuid4(),
            job_id=job_id,
            tenant=tenant,
            seq=seq,
            occurred_at=at,
            producer="test",
            data=data,
        )
        for seq, data in enumerate(datas, start=1)
    ]
    job = start(events[0])
    for event in events[1:]:
        job = evolve(job, event)
    return job, events


def running_job(
    name: str, at: datetime, checkpoints: Sequence[Checkpoint] = (), *, job_id: str = "job-1"
) -> tuple[Job, list[Event]]:
    """A job of one learner on ``node-a``, folded to RUNNING in attempt 1 with ``checkpoints``
    recorded, each event occurring ``at``; and its events."""
    spec = JobSpec(name=name, command="true", learners=1, gpus=1)
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
        ev.LearnerStarted(rank=0, attempt=1),
        ev.JobRunning(attempt=1),
        *(ev.CheckpointRecorded(checkpoint=checkpoint) for checkpoint in checkpoints),
    ]
    return folded_job(datas, at, job_id=job_id)


def submission(job_id: str, at: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> Event:
    """The first event of a job of the default tenant: a one-learner ``true``."""
    return Event(
        event_id=uuid.uuid4(),
        job_id=job_id,
        tenant="default",
        seq=1,
        occurred_at=at,
        producer="test",
        data=ev.JobSubmitted(spec=JobSpec(name="j", command="true"), submitted_by="test"),
    )
