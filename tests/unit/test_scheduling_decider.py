"""What the decider makes of the scheduler's commands: a preempted job halts with its checkpoint,
queues again by itself and resumes from that checkpoint; wait reasons are recorded only on change."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.core.decider import decide
from ffdl.core.invariants import check
from ffdl.core.job import Job, evolve
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json, event_from_json, event_to_json
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement, WaitReason

S = JobState
START = datetime(2026, 1, 1, tzinfo=UTC)


class Driven:
    """One job driven through the decider, command by command, keeping its whole log."""

    def __init__(self, learners: int = 2) -> None:
        self.job: Job | None = None
        self.log: list[Event] = []
        self.clock = START
        self.learners = learners
        self.send(
            cmd.SubmitJob(spec=JobSpec(name="train", command="python train.py", learners=learners, gpus=1))
        )
        self.send(cmd.AdmitJob())

    def send(self, data: CommandData, producer: str = "test") -> list[Event]:
        self.clock += timedelta(seconds=1)
        command = Command(
            command_id=uuid.uuid4(),
            job_id="j",
            tenant="t",
            issued_at=self.clock,
            producer=producer,
            data=data,
        )
        events = decide(self.job, command, self.clock)
        for event in events:
            self.job = evolve(self.job, event)
        self.log.extend(events)
        return events

    @property
    def state(self) -> Job:
        assert self.job is not None
        return self.job

    def now_in(self, state: JobState) -> bool:
        return self.state.state is state

    def allocate(self) -> list[Event]:
        placement = Placement(
            learners=tuple(
                LearnerPlacement(rank=rank, node="n0", gpus=(rank,)) for rank in range(self.learners)
            )
        )
        return self.send(cmd.AllocateGpus(placement=placement, reason="fits"), producer="scheduler")

    def run(self) -> None:
        """See every learner of the attempt the allocation launched start."""
        attempt = self.state.attempt
        for rank in range(self.learners):
            self.send(cmd.ReportLearnerStarted(rank=rank, attempt=attempt))
        assert self.state.state is S.RUNNING

    def stop_learners(self) -> None:
        for rank in range(self.learners):
            self.send(cmd.ReportLearnerExited(rank=rank, attempt=self.state.attempt, exit_code=0))


def types(events: list[Event]) -> list[str]:
    return [event.type for event in events]


@settings(max_examples=40, deadline=None)
@given(
    learners=st.integers(1, 4), steps=st.lists(st.integers(1, 10_000), min_size=1, max_size=5, unique=True)
)
def test_a_preempted_job_resumes_from_its_latest_checkpoint(learners: int, steps: list[int]) -> None:
    job = Driven(learners)
    job.allocate()
    job.run()
    for step in steps:
        job.send(
            cmd.ReportCheckpoint(checkpoint=Checkpoint(rank=0, attempt=1, step=step, uri=f"ckpt/{step}"))
        )
    halting = job.send(cmd.HaltJob(reason="preempted by job urgent", requeue=True), producer="scheduler")
    assert types(halting) == ["HaltRequested"] and job.now_in(S.HALTING)
    job.stop_learners()
    assert types(job.log[-3:]) == ["JobHalted", "ResumeRequested", "JobQueued"]
    latest = max(steps)
    assert job.log[-3].data.checkpoint.step == latest  # type: ignore[attr-defined]
    assert f"resumes from its checkpoint at step {latest}" in job.state.reason
    assert job.now_in(S.QUEUED) and job.state.placement is not None, "its GPUs are still to be released"
    assert types(job.send(cmd.ReleaseGpus())) == ["GpusReleased"]
    launching = job.allocate()
    assert types(launching) == ["GpusAllocated", "JobLaunching"]
    assert launching[1].data.resume_from is not None  # type: ignore[attr-defined]
    assert launching[1].data.resume_from.step == latest  # type: ignore[attr-defined]
    assert check((event, str(index)) for index, event in enumerate(job.log)) == []


def test_a_queued_job_is_requeued_at_once_when_preempted() -> None:
    job = Driven()
    events = job.send(cmd.HaltJob(reason="preempted", requeue=True), producer="scheduler")
    assert types(events) == ["HaltRequested", "JobHalted", "ResumeRequested", "JobQueued"]
    assert "from the start (no checkpoint)" in job.state.reason


def test_a_preemption_for_a_job_of_its_own_tenant_is_counted_apart_and_only_a_preemption_is() -> None:
    job = Driven()
    events = job.send(
        cmd.HaltJob(reason="preempted", requeue=True, for_own_tenant=True), producer="scheduler"
    )
    assert events[0].data == ev.HaltRequested(
        reason="preempted", requested_by="scheduler", requeue=True, for_own_tenant=True
    )
    assert (job.state.preemptions, job.state.preemptions_for_own_tenant) == (1, 1)
    job.send(cmd.HaltJob(reason="preempted", requeue=True), producer="scheduler")
    assert (job.state.preemptions, job.state.preemptions_for_own_tenant) == (2, 1)
    halted = Driven()
    halted.allocate()
    halt = halted.send(cmd.HaltJob(reason="by its user", for_own_tenant=True))  # no preemption: no mark
    assert halt[0].data.for_own_tenant is False  # type: ignore[attr-defined]


def test_a_job_preempted_as_it_launches_requeues_once_its_learners_are_stopped() -> None:
    """The allocation launches at once, so a preemption finds the attempt's learners due: it waits for
    them to stop (or be lost), like any halt of a launching job."""
    job = Driven()
    job.allocate()
    events = job.send(cmd.HaltJob(reason="preempted", requeue=True), producer="scheduler")
    assert types(events) == ["HaltRequested"] and job.now_in(S.HALTING)
    job.stop_learners()
    assert types(job.log[-3:]) == ["JobHalted", "ResumeRequested", "JobQueued"]
    assert "from the start (no checkpoint)" in job.state.reason


def test_a_users_halt_during_a_preemption_keeps_the_job_halted() -> None:
    job = Driven()
    job.allocate()
    job.run()
    job.send(cmd.HaltJob(reason="preempted", requeue=True), producer="scheduler")
    assert types(job.send(cmd.HaltJob(reason="halted by its owner"))) == ["HaltRequested"]
    assert job.send(cmd.HaltJob(reason="halted again")) == []
    job.stop_learners()
    assert job.state.state is S.HALTED and job.log[-1].type == "JobHalted"


def test_a_preemption_of_a_job_halted_by_its_user_does_not_requeue_it() -> None:
    job = Driven()
    job.allocate()
    job.run()
    job.send(cmd.HaltJob(reason="user"))
    assert job.send(cmd.HaltJob(reason="preempted", requeue=True), producer="scheduler") == []
    job.stop_learners()
    assert job.state.state is S.HALTED


def test_a_wait_reason_is_recorded_when_it_changes_and_only_while_the_job_waits() -> None:
    job = Driven()
    capacity = cmd.RecordWaitReason(
        code=WaitReason.CAPACITY, detail="needs 2 x 1 GPU(s); not enough are free"
    )
    assert types(job.send(capacity)) == ["JobWaiting"]
    assert job.send(capacity) == []
    reworded = cmd.RecordWaitReason(code=WaitReason.CAPACITY, detail="another wording, same reason")
    assert job.send(reworded) == []
    reserved = cmd.RecordWaitReason(code=WaitReason.CAPACITY, detail="kept", reserved_nodes=("n0",))
    assert types(job.send(reserved)) == ["JobWaiting"]
    assert job.state.waiting is not None and job.state.waiting.reserved_nodes == ("n0",)
    assert job.state.reason == "kept" and job.state.state is S.QUEUED
    job.allocate()
    assert job.state.waiting is None
    assert job.send(capacity) == [], "a job that got its GPUs waits no more: the stale reason is dropped"


def test_halts_written_before_preemption_existed_still_decode_as_plain_halts() -> None:
    old_command = {
        "type": "HaltJob",
        "schema_version": 1,
        "command_id": str(uuid.uuid4()),
        "job_id": "j",
        "tenant": "t",
        "issued_at": START.isoformat(),
        "producer": "api",
        "data": {"reason": "x"},
    }
    decoded = command_from_json(json.dumps(old_command))
    assert isinstance(decoded.data, cmd.HaltJob) and decoded.data.requeue is False
    job = Driven()
    job.allocate()
    job.run()
    event = job.send(cmd.HaltJob(reason="x"))[0]
    raw = json.loads(event_to_json(event))
    raw["schema_version"] = 1
    del raw["data"]["requeue"]
    assert event_from_json(json.dumps(raw)) == event
