"""What the reactor does next for a job (``next_action``), for the states a launch passes through.

Today's owner launches in the allocation's decision, so a freshly allocated job asks for the launch of
its learners at once; a job an older owner left in SCHEDULED (allocated, not launching) asks the owner
to begin its attempt, and so does a restart once its backoff is over.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.core.reconcile import ActionKind, next_action
from ffdl.core.restart import RestartPolicy
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import JobSpec, LearnerPlacement, Placement

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
PLACEMENT = Placement(learners=(LearnerPlacement(rank=0, node="n0", gpus=(0,)),))


def send(job: Job | None, data: CommandData) -> Job:
    command = Command(
        command_id=uuid.uuid4(), job_id="j", tenant="t", issued_at=NOW, producer="test", data=data
    )
    for event in decide(job, command, NOW, policy=RestartPolicy(base_s=4.0)):
        job = evolve(job, event)
    assert job is not None
    return job


def queued() -> Job:
    job = send(None, cmd.SubmitJob(spec=JobSpec(name="j", command="train", learners=1, gpus=1)))
    return send(job, cmd.AdmitJob())


def test_a_job_allocated_by_todays_owner_launches_its_learners_at_once() -> None:
    job = send(queued(), cmd.AllocateGpus(placement=PLACEMENT))

    action = next_action(job, NOW)

    assert action is not None and (action.kind, action.attempt, action.delay_s) == (ActionKind.LAUNCH, 1, 0.0)
    assert action.since_seq == job.seq


def test_a_job_an_older_owner_left_in_scheduled_is_asked_to_begin_its_attempt() -> None:
    job = queued()
    allocated = Event(
        event_id=uuid.uuid4(),
        job_id="j",
        tenant="t",
        seq=job.seq + 1,
        occurred_at=NOW,
        producer="older-owner",
        data=ev.GpusAllocated(placement=PLACEMENT),
    )
    job = evolve(job, allocated)

    action = next_action(job, NOW)

    assert action is not None and (action.kind, action.attempt) == (ActionKind.BEGIN_LAUNCH, 1)


def test_a_restart_begins_the_next_attempt_after_what_is_left_of_its_backoff() -> None:
    job = send(queued(), cmd.AllocateGpus(placement=PLACEMENT))
    job = send(job, cmd.ReportLearnerStarted(rank=0, attempt=1))
    job = send(job, cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=1))

    action = next_action(job, NOW + timedelta(seconds=1))

    assert action is not None and (action.kind, action.attempt) == (ActionKind.RELAUNCH, 2)
    assert action.delay_s == 3.0
