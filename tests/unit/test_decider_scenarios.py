"""The decider's behaviour, one readable story per test: the job's life as its owner decides it.

Each test drives one job through ``decide`` and ``evolve`` exactly as the job's owner does, and
states what the log must say: which events, in which order, with which codes and reasons.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from ffdl.core.decider import UnknownJob, decide
from ffdl.core.invariants import check
from ffdl.core.job import Job, evolve
from ffdl.core.restart import RestartPolicy
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.ids import derived_id
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    FailureKind,
    JobSpec,
    LearnerPlacement,
    LossReason,
    Placement,
    ResultSummary,
)

S = JobState
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"


def _spec(learners: int = 2, gpus: int = 1, max_restarts: int = 3) -> JobSpec:
    return JobSpec(
        name="mnist", command="python train.py", learners=learners, gpus=gpus, max_restarts=max_restarts
    )


def _names(events: list[Event]) -> list[str]:
    return [event.type for event in events]


def _checkpoint(step: int, attempt: int = 1, rank: int = 0) -> Checkpoint:
    return Checkpoint(rank=rank, attempt=attempt, step=step, uri=f"s3://ckpt/mnist/{attempt}/{step}")


class Owner:
    """One job's owner in miniature: it decides each command on the folded job and keeps the log."""

    def __init__(self, spec: JobSpec | None = None, policy: RestartPolicy | None = None) -> None:
        self.spec = spec or _spec()
        self.policy = policy
        self.job: Job | None = None
        self.log: list[Event] = []
        self.sent = 0

    def state(self) -> JobState:
        """The job's state now (a call, so that a type checker does not pin it after one assert)."""
        assert self.job is not None
        return self.job.state

    @property
    def attempt(self) -> int:
        assert self.job is not None
        return self.job.attempt

    def command(self, data: CommandData, *, tenant: str = TENANT, token: int | None = None) -> Command:
        self.sent += 1
        return Command(
            command_id=uuid.UUID(int=self.sent),
            job_id="job-1",
            tenant=tenant,
            issued_at=NOW,
            producer="scenario",
            fencing_token=token,
            data=data,
        )

    def deliver(self, command: Command, leader_token: int | None = None) -> list[Event]:
        events = decide(self.job, command, NOW, policy=self.policy, leader_token=leader_token)
        for event in events:
            self.job = evolve(self.job, event)
        self.log.extend(events)
        return events

    def send(
        self,
        data: CommandData,
        *,
        tenant: str = TENANT,
        token: int | None = None,
        leader_token: int | None = None,
    ) -> list[Event]:
        return self.deliver(self.command(data, tenant=tenant, token=token), leader_token)

    def placement(self, learners: int | None = None) -> Placement:
        count = self.spec.learners if learners is None else learners
        gpus = tuple(range(self.spec.gpus))
        return Placement(
            learners=tuple(LearnerPlacement(rank=r, node=f"node-{r}", gpus=gpus) for r in range(count))
        )

    def allocated_by_an_older_owner(self) -> None:
        """``GpusAllocated`` alone, as the owner decided an allocation before it launched in the same
        decision: the job rests in SCHEDULED until a ``BeginLaunch`` comes (a log of an older release)."""
        assert self.job is not None
        allocated = Event(
            event_id=uuid.uuid4(),
            job_id=self.job.job_id,
            tenant=self.job.tenant,
            seq=self.job.seq + 1,
            occurred_at=NOW,
            producer="older-owner",
            data=ev.GpusAllocated(placement=self.placement()),
        )
        self.job = evolve(self.job, allocated)
        self.log.append(allocated)

    def start_all(self) -> list[Event]:
        return [e for rank in range(self.spec.learners) for e in self.send(self._started(rank))]

    def exit_all(self, code: int) -> list[Event]:
        return [e for rank in range(self.spec.learners) for e in self.send(self._exited(rank, code))]

    def _started(self, rank: int) -> cmd.ReportLearnerStarted:
        return cmd.ReportLearnerStarted(rank=rank, attempt=self.attempt, pid=1000 + rank, host=f"node-{rank}")

    def _exited(self, rank: int, code: int) -> cmd.ReportLearnerExited:
        return cmd.ReportLearnerExited(rank=rank, attempt=self.attempt, exit_code=code)

    def reach(self, target: JobState) -> None:
        """Drive the job along the shortest healthy path into ``target``."""
        self.send(cmd.SubmitJob(spec=self.spec))
        if target is not S.SUBMITTED:
            self.send(cmd.AdmitJob())
        if target is S.HALTED:
            self.send(cmd.HaltJob())
        if target is S.SCHEDULED:
            self.allocated_by_an_older_owner()
        elif target not in (S.SUBMITTED, S.QUEUED, S.HALTED):
            self.send(cmd.AllocateGpus(placement=self.placement()))
        if target in (S.RUNNING, S.RESTARTING, S.HALTING, S.STORING):
            self.start_all()
        if target is S.RESTARTING:
            self.send(self._exited(0, 1))
        if target is S.HALTING:
            self.send(cmd.HaltJob())
        if target is S.STORING:
            self.exit_all(0)
        assert self.state() is target


def test_happy_path_runs_to_completed_and_releases_the_gpus() -> None:
    owner = Owner(_spec(learners=2, gpus=2))

    assert _names(owner.send(cmd.SubmitJob(spec=owner.spec))) == ["JobSubmitted"]
    assert _names(owner.send(cmd.AdmitJob())) == ["JobAccepted", "JobQueued"]
    allocated = owner.send(cmd.AllocateGpus(placement=owner.placement()))
    assert _names(allocated) == ["GpusAllocated", "JobLaunching"]
    assert allocated[1].data == ev.JobLaunching(attempt=1, resume_from=None)
    assert _names(owner.send(owner._started(0))) == ["LearnerStarted"]
    assert owner.state() is S.LAUNCHING
    assert _names(owner.send(owner._started(1))) == ["LearnerStarted", "JobRunning"]
    assert _names(owner.send(owner._exited(0, 0))) == ["LearnerExited"]
    assert _names(owner.send(owner._exited(1, 0))) == ["LearnerExited", "JobStoring"]
    assert _names(owner.send(cmd.FinishStoring(result=ResultSummary(files=3)))) == ["JobCompleted"]
    assert _names(owner.send(cmd.ReleaseGpus())) == ["GpusReleased"]

    assert owner.job is not None
    assert owner.job.state is S.COMPLETED
    assert owner.job.placement is None
    assert owner.job.result == ResultSummary(files=3)
    assert [entry.state for entry in owner.job.history] == [
        S.SUBMITTED,
        S.QUEUED,
        S.SCHEDULED,
        S.LAUNCHING,
        S.RUNNING,
        S.STORING,
        S.COMPLETED,
    ]
    assert [event.seq for event in owner.log] == list(range(1, len(owner.log) + 1))
    assert check((event, str(event.seq)) for event in owner.log) == []


def test_events_take_their_ids_and_causation_from_the_command() -> None:
    owner = Owner()
    owner.reach(S.SUBMITTED)
    admit = owner.command(cmd.AdmitJob())

    events = owner.deliver(admit)

    assert [event.event_id for event in events] == [
        derived_id(admit.command_id, "decider", i) for i in range(2)
    ]
    assert {event.causation_id for event in events} == {admit.command_id}
    assert {event.correlation_id for event in events} == {admit.command_id}


def test_learner_exit_nonzero_restarts_the_next_attempt_from_the_latest_checkpoint() -> None:
    policy = RestartPolicy(base_s=2.0, factor=3.0, max_backoff_s=100.0)
    owner = Owner(_spec(learners=2), policy)
    owner.reach(S.RUNNING)
    latest, older = _checkpoint(step=900), _checkpoint(step=500)
    owner.send(cmd.ReportCheckpoint(checkpoint=latest))
    owner.send(cmd.ReportCheckpoint(checkpoint=older))

    events = owner.send(owner._exited(1, 3))

    assert _names(events) == ["LearnerExited", "JobRestarting"]
    restarting = events[1].data
    assert isinstance(restarting, ev.JobRestarting)
    assert (restarting.attempt, restarting.backoff_s, restarting.resume_from) == (2, 2.0, latest)
    assert "learner 1" in restarting.reason
    assert "code 3" in restarting.reason
    assert owner.job is not None
    assert (owner.job.state, owner.job.restarts) == (S.RESTARTING, 1)

    relaunch = owner.send(cmd.BeginLaunch(attempt=2))
    assert relaunch[0].data == ev.JobLaunching(attempt=2, resume_from=latest)
    owner.start_all()
    second = owner.send(owner._exited(0, 1))
    assert isinstance(second[-1].data, ev.JobRestarting)
    assert (second[-1].data.attempt, second[-1].data.backoff_s) == (3, 6.0)


def test_a_relaunch_resumes_from_a_checkpoint_recorded_while_the_gang_was_stopping() -> None:
    """The surviving learners' agents record what they find on their way out (rank 0 saved just
    before its peer died): the next attempt starts from it, and says so."""
    owner = Owner(_spec(learners=2))
    owner.reach(S.RUNNING)
    owner.send(cmd.ReportCheckpoint(checkpoint=_checkpoint(step=40)))
    restarting = owner.send(owner._exited(1, -9))[-1].data
    assert isinstance(restarting, ev.JobRestarting) and restarting.resume_from == _checkpoint(step=40)

    newest = _checkpoint(step=60)
    owner.send(cmd.ReportCheckpoint(checkpoint=newest))
    relaunch = owner.send(cmd.BeginLaunch(attempt=2))

    assert relaunch[0].data == ev.JobLaunching(attempt=2, resume_from=newest)
    assert owner.job is not None and owner.job.resume_from == newest


def test_restarts_beyond_the_manifest_limit_fail_the_job_with_c200_naming_the_learner() -> None:
    owner = Owner(_spec(learners=2, max_restarts=1))
    owner.reach(S.RUNNING)
    owner.send(owner._exited(1, 2))
    owner.send(cmd.BeginLaunch(attempt=2))
    owner.start_all()

    events = owner.send(owner._exited(1, 2))

    assert _names(events) == ["LearnerExited", "JobFailed"]
    failed = events[1].data
    assert isinstance(failed, ev.JobFailed)
    assert failed.code is ErrorCode.LEARNER_FAILED
    assert failed.code.kind is FailureKind.CLIENT
    assert "learner 1" in failed.reason
    assert owner.job is not None
    assert (owner.job.state, owner.job.restarts, owner.job.failure_code) == (
        S.FAILED,
        1,
        ErrorCode.LEARNER_FAILED,
    )


@pytest.mark.parametrize(
    ("reason", "code"),
    [(LossReason.HUNG, ErrorCode.LEARNER_HUNG), (LossReason.EXPIRED, ErrorCode.LEARNER_LOST)],
)
def test_a_lost_learner_fails_the_job_with_its_code_once_restarts_are_spent(
    reason: LossReason, code: ErrorCode
) -> None:
    owner = Owner(_spec(learners=2, max_restarts=0))
    owner.reach(S.RUNNING)

    events = owner.send(cmd.ReportLearnerLost(rank=0, attempt=1, reason=reason, detail="no heartbeat"))

    assert _names(events) == ["LearnerLost", "JobFailed"]
    failed = events[1].data
    assert isinstance(failed, ev.JobFailed)
    assert failed.code is code
    assert f"learner 0 lost ({reason})" in failed.reason


@pytest.mark.parametrize(("max_restarts", "outcome"), [(3, ev.JobRestarting), (0, ev.JobFailed)])
def test_a_loss_whose_detail_fills_a_reason_is_recorded_and_its_consequence_cut_to_a_reason(
    max_restarts: int, outcome: type[ev.JobRestarting | ev.JobFailed]
) -> None:
    """A launch error or a Kubernetes message is cut to a reason's length; prefixed with the loss it
    was too long for the job's restart or failure, so the loss itself was never recorded (the
    command was dead-lettered as an internal error, the job left launching with its GPUs held)."""
    owner = Owner(_spec(learners=1, max_restarts=max_restarts))
    owner.reach(S.RUNNING)
    detail = ev.within_reason("launch failed: " + "x" * 5_000)

    events = owner.send(cmd.ReportLearnerLost(rank=0, attempt=1, reason=LossReason.VANISHED, detail=detail))

    assert [type(event.data) for event in events] == [ev.LearnerLost, outcome]
    consequence = events[1].data
    assert isinstance(consequence, outcome)
    assert len(consequence.reason) == ev.REASON_MAX
    assert consequence.reason.startswith("learner 0 lost (vanished): launch failed: xxx")


def test_halt_while_running_stops_with_the_latest_checkpoint_and_resumes_from_it() -> None:
    owner = Owner(_spec(learners=2))
    owner.reach(S.RUNNING)
    owner.send(cmd.ReportCheckpoint(checkpoint=_checkpoint(step=100)))

    assert _names(owner.send(cmd.HaltJob(reason="maintenance"))) == ["HaltRequested"]
    assert owner.state() is S.HALTING
    final = _checkpoint(step=150, rank=1)
    assert _names(owner.send(cmd.ReportCheckpoint(checkpoint=final))) == ["CheckpointRecorded"]
    assert _names(owner.send(owner._exited(0, 143))) == ["LearnerExited"]
    halted = owner.send(owner._exited(1, 143))
    assert _names(halted) == ["LearnerExited", "JobHalted"]
    assert halted[1].data == ev.JobHalted(checkpoint=final)
    assert _names(owner.send(cmd.ReleaseGpus())) == ["GpusReleased"]

    assert _names(owner.send(cmd.ResumeJob())) == ["ResumeRequested", "JobQueued"]
    assert owner.state() is S.QUEUED
    launching = owner.send(cmd.AllocateGpus(placement=owner.placement()))

    assert launching[1].data == ev.JobLaunching(attempt=2, resume_from=final)
    assert owner.job is not None
    assert owner.job.restarts == 0  # a halt is not a restart
    assert check((event, str(event.seq)) for event in owner.log) == []


def test_an_allocation_launches_the_next_attempt_from_the_latest_checkpoint_in_the_same_decision() -> None:
    """Nothing is learnt between the GPUs and the launch, so the owner decides both at once: submitted
    to running takes no ``BeginLaunch``, and a reactor's late one decides nothing."""
    owner = Owner()
    owner.reach(S.RUNNING)
    kept = _checkpoint(step=300)
    owner.send(cmd.ReportCheckpoint(checkpoint=kept))
    owner.send(cmd.HaltJob(requeue=True))
    owner.exit_all(143)
    owner.send(cmd.ReleaseGpus())
    assert owner.state() is S.QUEUED

    allocate = owner.command(cmd.AllocateGpus(placement=owner.placement()), token=3)
    events = owner.deliver(allocate, leader_token=3)

    assert _names(events) == ["GpusAllocated", "JobLaunching"]
    assert events[1].data == ev.JobLaunching(attempt=2, resume_from=kept)
    assert [(e.event_id, e.causation_id, e.fencing_token) for e in events] == [
        (derived_id(allocate.command_id, "decider", i), allocate.command_id, 3) for i in range(2)
    ]
    assert owner.job is not None
    assert [entry.state for entry in owner.job.history[-2:]] == [S.SCHEDULED, S.LAUNCHING]
    assert owner.send(cmd.BeginLaunch(attempt=2)) == []
    assert check((event, str(event.seq)) for event in owner.log) == []


def test_a_job_an_older_owner_left_in_scheduled_is_launched_by_begin_launch() -> None:
    """Logs of the older release hold allocations without their launch; the reactor still begins it."""
    owner = Owner()
    owner.reach(S.RUNNING)
    kept = _checkpoint(step=300)
    owner.send(cmd.ReportCheckpoint(checkpoint=kept))
    owner.send(cmd.HaltJob(requeue=True))
    owner.exit_all(143)
    owner.send(cmd.ReleaseGpus())
    owner.allocated_by_an_older_owner()
    assert owner.state() is S.SCHEDULED

    events = owner.send(cmd.BeginLaunch(attempt=2))

    assert [event.data for event in events] == [ev.JobLaunching(attempt=2, resume_from=kept)]
    assert owner.state() is S.LAUNCHING


@pytest.mark.parametrize("state", [S.QUEUED, S.SCHEDULED])
def test_halt_before_launch_halts_at_once(state: JobState) -> None:
    owner = Owner()
    owner.reach(state)

    events = owner.send(cmd.HaltJob())

    assert _names(events) == ["HaltRequested", "JobHalted"]
    assert events[1].data == ev.JobHalted(checkpoint=None)
    assert owner.state() is S.HALTED


def test_halting_a_halting_or_halted_job_decides_nothing() -> None:
    owner = Owner()
    owner.reach(S.HALTING)
    assert owner.send(cmd.HaltJob()) == []
    owner.exit_all(143)
    assert owner.state() is S.HALTED
    assert owner.send(cmd.HaltJob()) == []


@pytest.mark.parametrize(
    "state",
    [
        S.SUBMITTED,
        S.QUEUED,
        S.SCHEDULED,
        S.LAUNCHING,
        S.RUNNING,
        S.RESTARTING,
        S.HALTING,
        S.HALTED,
        S.STORING,
    ],
)
def test_cancel_ends_a_job_in_any_live_state(state: JobState) -> None:
    owner = Owner()
    owner.reach(state)

    events = owner.send(cmd.CancelJob(reason="no longer needed"))

    assert _names(events) == ["CancelRequested", "JobCancelled"]
    assert owner.state() is S.CANCELLED
    assert owner.send(cmd.CancelJob()) == []  # cancelling a cancelled job is a no-op


def test_cancel_of_a_completed_job_is_rejected() -> None:
    owner = Owner()
    owner.reach(S.STORING)
    owner.send(cmd.FinishStoring(result=ResultSummary()))

    events = owner.send(cmd.CancelJob())

    assert _names(events) == ["CommandRejected"]
    assert owner.state() is S.COMPLETED


@pytest.mark.parametrize(
    ("state", "data", "reason_part"),
    [
        (S.RUNNING, cmd.ResumeJob(), "only a HALTED job can be resumed"),
        (S.RUNNING, cmd.AdmitJob(), "AdmitJob is not allowed in state RUNNING"),
        (S.RUNNING, cmd.FinishStoring(result=ResultSummary()), "FinishStoring is not allowed"),
        (S.SUBMITTED, cmd.HaltJob(), "cannot be halted"),
        (S.QUEUED, cmd.SubmitJob(spec=_spec()), "exists already"),
        (S.SCHEDULED, cmd.BeginLaunch(attempt=5), "launch of attempt 5 is not due"),
        (S.RUNNING, cmd.ReportLearnerStarted(rank=7, attempt=1), "rank 7 does not exist"),
    ],
)
def test_illegal_commands_are_recorded_as_rejections(
    state: JobState, data: CommandData, reason_part: str
) -> None:
    owner = Owner()
    owner.reach(state)

    events = owner.send(data)

    assert _names(events) == ["CommandRejected"]
    rejected = events[0].data
    assert isinstance(rejected, ev.CommandRejected)
    assert rejected.command_type == data.type_name()
    assert reason_part in rejected.reason
    assert owner.state() is state


def test_a_report_for_a_rank_of_thousands_of_digits_is_refused_quoting_the_ranks_head() -> None:
    """Quoted whole, the rank made the refusal too long to be valid: the command was dead-lettered as
    an internal error instead of refused in the job's history."""
    owner = Owner(_spec(learners=1))
    owner.reach(S.RUNNING)

    events = owner.send(cmd.ReportProgress(rank=10**4_000, attempt=1, step=1))

    assert _names(events) == ["CommandRejected"]
    rejected = events[0].data
    assert isinstance(rejected, ev.CommandRejected)
    assert rejected.reason.startswith("rank 1000")
    assert rejected.reason.endswith("\u2026 does not exist: the job has 1 learners")
    assert len(rejected.reason) < ev.QUOTE_MAX + 100
    assert owner.state() is S.RUNNING


@pytest.mark.parametrize(
    ("placement", "reason_part"),
    [
        (Placement(learners=(LearnerPlacement(rank=0, node="n", gpus=(0,)),)), "must list ranks 0..1"),
        (
            Placement(
                learners=(
                    LearnerPlacement(rank=1, node="n", gpus=(0,)),
                    LearnerPlacement(rank=0, node="n", gpus=(1,)),
                )
            ),
            "in order",
        ),
        (
            Placement(
                learners=(
                    LearnerPlacement(rank=0, node="n", gpus=(0, 0)),
                    LearnerPlacement(rank=1, node="m", gpus=(0, 1)),
                )
            ),
            "needs 2 distinct GPUs",
        ),
        (
            Placement(
                learners=(
                    LearnerPlacement(rank=0, node="n", gpus=(0,)),
                    LearnerPlacement(rank=1, node="m", gpus=(0, 1)),
                )
            ),
            "needs 2 distinct GPUs",
        ),
    ],
)
def test_allocation_that_does_not_fit_the_gang_is_rejected(placement: Placement, reason_part: str) -> None:
    owner = Owner(_spec(learners=2, gpus=2))
    owner.reach(S.QUEUED)

    events = owner.send(cmd.AllocateGpus(placement=placement))

    assert _names(events) == ["CommandRejected"]
    assert isinstance(events[0].data, ev.CommandRejected)
    assert reason_part in events[0].data.reason
    assert owner.job is not None
    assert (owner.job.state, owner.job.placement) == (S.QUEUED, None)


def test_observations_of_a_stale_attempt_decide_nothing() -> None:
    owner = Owner(_spec(learners=2))
    owner.reach(S.RESTARTING)
    owner.send(cmd.BeginLaunch(attempt=2))
    owner.start_all()
    assert (owner.state(), owner.attempt) == (S.RUNNING, 2)

    stale = [
        cmd.ReportLearnerStarted(rank=0, attempt=1),
        cmd.ReportProgress(rank=1, attempt=1, step=42, metrics={"loss": 0.1}),
        cmd.ReportLearnerExited(rank=1, attempt=1, exit_code=137),
        cmd.ReportLearnerLost(rank=1, attempt=1, reason=LossReason.EXPIRED),
        cmd.ReportCheckpoint(checkpoint=_checkpoint(step=10, attempt=3)),  # from an attempt not yet begun
        cmd.BeginLaunch(attempt=1),
    ]
    for data in stale:
        assert owner.send(data) == [], f"stale {data.type_name()} decided something"
    assert (owner.state(), owner.attempt) == (S.RUNNING, 2)


def test_a_command_for_an_unknown_job_raises_unknown_job() -> None:
    owner = Owner()
    with pytest.raises(UnknownJob, match="no job job-1 for HaltJob"):
        owner.send(cmd.HaltJob())
    assert owner.log == []


def test_a_redelivered_command_decides_nothing_and_deciding_again_is_identical() -> None:
    owner = Owner()
    owner.reach(S.RUNNING)
    assert owner.job is not None
    before = owner.job
    exited = owner.command(cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0))

    first = owner.deliver(exited)

    assert decide(before, exited, NOW) == first
    assert owner.deliver(exited) == []
    assert owner.job.seq == before.seq + len(first)


def test_a_deposed_scheduler_is_refused_and_its_refusal_keeps_the_log_clean() -> None:
    owner = Owner()
    owner.reach(S.QUEUED)
    owner.send(cmd.AllocateGpus(placement=owner.placement()), token=2, leader_token=2)

    events = owner.send(cmd.HaltJob(), token=1, leader_token=2)

    assert _names(events) == ["CommandRejected"]
    assert isinstance(events[0].data, ev.CommandRejected)
    assert "deposed" in events[0].data.reason
    assert owner.state() is S.LAUNCHING
    assert check((event, str(event.seq)) for event in owner.log) == []


def test_a_scheduler_token_older_than_the_jobs_is_refused_without_knowing_the_leader() -> None:
    owner = Owner()
    owner.reach(S.QUEUED)
    owner.send(cmd.AllocateGpus(placement=owner.placement()), token=5)
    owner.send(cmd.HaltJob())
    owner.exit_all(143)
    owner.send(cmd.ReleaseGpus())
    owner.send(cmd.ResumeJob())

    events = owner.send(cmd.AllocateGpus(placement=owner.placement()), token=4)

    assert _names(events) == ["CommandRejected"]
    assert owner.state() is S.QUEUED


def test_a_command_from_another_tenant_is_rejected_on_the_jobs_own_log() -> None:
    owner = Owner()
    owner.reach(S.RUNNING)

    events = owner.send(cmd.CancelJob(), tenant="intruder")

    assert _names(events) == ["CommandRejected"]
    assert owner.state() is S.RUNNING
    assert {event.tenant for event in owner.log} == {TENANT}
