"""The grace between SIGTERM and SIGKILL when learners are stopped: the job's own, else the platform's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from ffdl.core.job import start
from ffdl.events import job_events as ev
from ffdl.events.envelope import Event
from ffdl.events.model import JobSpec
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.halting import stop_learners


class RecordingLauncher:
    def __init__(self) -> None:
        self.stops: list[tuple[str, float]] = []

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.stops.append((job_id, grace_s))


@pytest.mark.parametrize(("asked", "used"), [(None, 10.0), (120.0, 120.0), (0.0, 0.0)])
async def test_a_stop_waits_the_jobs_grace_or_the_platforms(asked: float | None, used: float) -> None:
    spec = JobSpec(name="job", command="train", stop_grace_s=asked)
    job = start(
        Event(
            event_id=uuid.uuid4(),
            job_id="job-1",
            tenant="acme",
            seq=1,
            occurred_at=datetime(2024, 5, 1, tzinfo=UTC),
            producer="test",
            data=ev.JobSubmitted(spec=spec),
        )
    )
    launcher = RecordingLauncher()
    ctx = ReactionContext(sender=cast(Any, None), launcher=cast(Any, launcher), stop_grace_s=10.0)
    await stop_learners(job, cast(Any, None), ctx)
    assert launcher.stops == [("job-1", used)]
