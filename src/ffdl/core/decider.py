"""The job decider: ``decide(job, command, now) -> events``, pure and deterministic (architecture §2, §5).

The job's owner calls it for every command on the job's partition. The events it returns are
numbered from the job's current ``seq`` and get ids derived from the command id, so deciding the
same command twice yields the same events: a reader can tell a duplicate from a conflict.
Observations that no longer matter (a stale attempt, a learner of a finished job) decide nothing;
requests that are illegal in the job's state become a ``CommandRejected`` event.

A halt with ``requeue`` (the scheduler preempting the job) ends like any halt, with the learners'
checkpoint recorded in ``JobHalted``, and then queues the job again at once, so it resumes from
that checkpoint when the scheduler next gives it GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ffdl.core.aggregate import (
    Address,
    AggregateKind,
    Decision,
    EventHead,
    UnknownAggregate,
    is_deposed,
    seen,
)
from ffdl.core.authorization import Senders, job_senders
from ffdl.core.job import Job, LearnerStatus, WaitRecord, evolve
from ffdl.core.places import CheckpointPlaces
from ffdl.core.restart import RestartPolicy
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Command, CommandData, Event, EventData
from ffdl.events.job_events import quoted, within_reason
from ffdl.events.model import Checkpoint, ErrorCode, LossReason, Placement

S = JobState
DECIDER = "decider"


class UnknownJob(UnknownAggregate):
    """A command for a job that does not exist (and is not a submission): it goes to dead letters."""


#: The events decided so far for one command on a job, with the job as they leave it.
_Decision = Decision[Job, Event, Command, EventData]


def decide(
    job: Job | None,
    command: Command,
    now: datetime,
    *,
    policy: RestartPolicy | None = None,
    producer: str = DECIDER,
    leader_token: int | None = None,
    checkpoints: CheckpointPlaces | None = None,
) -> list[Event]:
    """The events that ``command`` causes on ``job`` (``None``: the job does not exist yet).

    ``leader_token`` is the fencing token of the scheduler's current leader: a fenced command
    carrying another token comes from a deposed leader and is rejected. ``checkpoints``: where each
    job's checkpoints must lie; a reported checkpoint elsewhere is rejected, and no attempt resumes
    from one recorded elsewhere (by an older platform). None: anywhere (a decision replayed without
    the platform's layout).
    """
    decision = _Decision(JOBS, command, now, producer, job)
    data = command.data
    if job is None:
        if not isinstance(data, cmd.SubmitJob):
            raise UnknownJob(f"no job {command.job_id} for {command.type}")
        decision.emit(ev.JobSubmitted(spec=data.spec, submitted_by=command.producer))
        return decision.events
    if seen(job, command.command_id):
        return []
    if command.tenant != job.tenant:
        decision.reject(f"job belongs to another tenant than {command.tenant!r}")
    elif is_deposed(command.fencing_token, job.fencing_token, leader_token):
        decision.reject(f"fencing token {command.fencing_token} is not the leader's: sender was deposed")
    else:
        _decide(decision, job, data, _Rules(policy or RestartPolicy(), checkpoints))
    return decision.events


@dataclass(frozen=True, slots=True)
class _Rules:
    """What a decision is made by besides the job and the command: the platform's configuration."""

    policy: RestartPolicy
    checkpoints: CheckpointPlaces | None = None


def resume_point(job: Job, checkpoints: CheckpointPlaces | None) -> Checkpoint | None:
    """The checkpoint the job's next attempt starts from: its latest inside its checkpoint place."""
    if checkpoints is None:
        return job.latest_checkpoint
    inside = (c for c in job.checkpoints if checkpoints.problem(job.job_id, c.uri) is None)
    return max(inside, key=lambda c: (c.step, c.attempt), default=None)


def _decide(d: _Decision, job: Job, data: CommandData, rules: _Rules) -> None:  # noqa: PLR0915
    state = job.state
    match data:
        case cmd.SubmitJob():
            d.reject("a job with this id exists already")
        case cmd.AdmitJob() if state is S.SUBMITTED:
            d.emit(ev.JobAccepted())
            d.emit(ev.JobQueued(reason="waiting for GPUs"))
        case cmd.RejectJob(code=code, reason=reason) if state is S.SUBMITTED:
            d.emit(ev.JobRejected(code=code, reason=reason))
        case cmd.AllocateGpus(placement=placement, reason=reason) if allocates(job):
            problem = _placement_problem(job, placement)
            if problem:
                d.reject(problem)
            else:
                allocated = d.emit(ev.GpusAllocated(placement=placement, reason=reason))
                d.emit(launch_on_allocation(allocated, rules.checkpoints))
        case cmd.RecordWaitReason(code=code, detail=detail, waiting_for=waiting_for, reserved_nodes=nodes):
            record = WaitRecord(code, detail, waiting_for, nodes)
            if state is S.QUEUED and job.placement is None and not record.same_as(job.waiting):
                d.emit(ev.JobWaiting(code=code, detail=detail, waiting_for=waiting_for, reserved_nodes=nodes))
        case cmd.BeginLaunch(attempt=attempt):
            _begin_launch(d, job, attempt, rules.checkpoints)
        case cmd.ReportLearnerStarted(rank=rank, attempt=attempt, pid=pid, host=host):
            if _observes_current(d, job, rank, attempt) and not job.learners[rank].has_started:
                d.emit(ev.LearnerStarted(rank=rank, attempt=attempt, pid=pid, host=host))
                _consequences(d, rules)
        case cmd.ReportProgress(rank=rank, attempt=attempt, step=step, metrics=metrics, dropped=dropped):
            if _observes_current(d, job, rank, attempt):
                learner = job.learners[rank]
                if learner.active and (
                    step != learner.step or tuple(sorted(metrics.items())) != learner.metrics
                ):
                    if not learner.has_started:
                        d.emit(ev.LearnerStarted(rank=rank, attempt=attempt))
                    progressed = ev.LearnerProgressed(
                        rank=rank, attempt=attempt, step=step, metrics=metrics, dropped=dropped
                    )
                    d.emit(progressed)
                    _consequences(d, rules)
        case cmd.ReportCheckpoint(checkpoint=checkpoint) if rules.checkpoints is not None and (
            refusal := rules.checkpoints.problem(job.job_id, checkpoint.uri)
        ):
            d.reject(f"checkpoint {checkpoint.uri!r:.300} refused: {refusal}")
        case cmd.ReportCheckpoint(checkpoint=checkpoint):
            known = any(c.uri == checkpoint.uri and c.step == checkpoint.step for c in job.checkpoints)
            usable = state.holds_learners
            if (
                usable
                and not known
                and checkpoint.attempt <= job.attempt
                and checkpoint.rank < job.spec.learners
            ):
                d.emit(ev.CheckpointRecorded(checkpoint=checkpoint))
        case cmd.ReportLearnerExited(rank=rank, attempt=attempt, exit_code=code):
            if _observes_current(d, job, rank, attempt) and job.learners[rank].active:
                d.emit(ev.LearnerExited(rank=rank, attempt=attempt, exit_code=code))
                _consequences(d, rules)
        case cmd.ReportLearnerLost(rank=rank, attempt=attempt, reason=reason, detail=detail):
            if _observes_current(d, job, rank, attempt) and job.learners[rank].active:
                d.emit(ev.LearnerLost(rank=rank, attempt=attempt, reason=reason, detail=detail))
                _consequences(d, rules)
        case cmd.HaltJob(reason=reason, requeue=requeue, for_own_tenant=for_own_tenant):
            _halt(d, job, reason, requeue, for_own_tenant and requeue, rules.checkpoints)
        case cmd.ResumeJob():
            if state is S.HALTED:
                d.emit(ev.ResumeRequested(requested_by=d.command.producer))
                d.emit(ev.JobQueued(reason="resumed"))
            else:
                d.reject(f"only a HALTED job can be resumed; this one is {state}")
        case cmd.CancelJob(reason=reason):
            if not state.terminal:
                d.emit(ev.CancelRequested(reason=reason, requested_by=d.command.producer))
                d.emit(ev.JobCancelled(reason=reason or "cancelled on request"))
            elif state is not S.CANCELLED:
                d.reject(f"job has ended already ({state})")
        case cmd.FinishStoring(result=result) if state is S.STORING:
            d.emit(ev.JobCompleted(result=result))
        case cmd.ReleaseGpus():
            if job.placement is not None and state.releasable:
                d.emit(ev.GpusReleased(placement=job.placement))
        case cmd.DeleteJob():
            if not state.terminal:
                d.reject(f"only an ended job can be deleted; this one is {state} (cancel it first)")
            elif not job.deleted:
                d.emit(ev.JobDeleted(requested_by=d.command.producer))
        case _:
            d.reject(f"{d.command.type} is not allowed in state {state}")


def allocates(job: Job) -> bool:
    """Whether an ``AllocateGpus`` would give the job GPUs now (else it is refused for the job's state)."""
    return job.state is S.QUEUED and job.placement is None


def _placement_problem(job: Job, placement: Placement) -> str:
    ranks = [learner.rank for learner in placement.learners]
    if ranks != list(range(job.spec.learners)):
        return f"placement must list ranks 0..{job.spec.learners - 1} in order, got {ranks}"
    for learner in placement.learners:
        if len(learner.gpus) != job.spec.gpus or len(set(learner.gpus)) != len(learner.gpus):
            return f"learner {learner.rank} needs {job.spec.gpus} distinct GPUs, got {list(learner.gpus)}"
    return ""


def launch_on_allocation(job: Job, checkpoints: CheckpointPlaces | None = None) -> ev.JobLaunching:
    """The launch that begins once a job has its GPUs: its next attempt, from its latest checkpoint (a
    resumed or requeued job goes on where it stopped).

    The owner decides it with the allocation itself, since nothing is learnt in between. A job found
    in SCHEDULED was allocated by an older owner, which waited for the reactor's ``BeginLaunch``; that
    command still launches it with this same event.
    """
    return ev.JobLaunching(attempt=job.attempt + 1, resume_from=resume_point(job, checkpoints))


def next_attempt(job: Job) -> int | None:
    """The attempt a ``BeginLaunch`` would start now, or ``None`` when no launch is due."""
    if job.state is S.SCHEDULED:
        return job.attempt + 1
    if job.state is S.RESTARTING:
        return job.attempt
    return None


def _begin_launch(d: _Decision, job: Job, attempt: int, checkpoints: CheckpointPlaces | None) -> None:
    """A launch after a restart's backoff (or of a job an older owner left in SCHEDULED).

    A relaunch resumes from the latest checkpoint recorded by now (inside the job's checkpoint
    place), not only by the failure: the learners that outlived the failed one, stopped since, may
    have saved a newer one on their way out (their agents record it before they report their exit),
    and it is the one a program that resumes from its newest file will load, so the attempt says
    truthfully where it starts."""
    due = next_attempt(job)
    if due == attempt:
        if job.state is S.SCHEDULED:
            d.emit(launch_on_allocation(job, checkpoints))
        else:
            d.emit(ev.JobLaunching(attempt=attempt, resume_from=resume_point(job, checkpoints)))
    elif not (attempt <= job.attempt and job.state.holds_learners):
        d.reject(f"launch of attempt {attempt} is not due in state {job.state} (attempt {job.attempt})")


def _observes_current(d: _Decision, job: Job, rank: int, attempt: int) -> bool:
    """Whether a learner observation is about the running attempt; stale ones decide nothing."""
    if rank >= job.spec.learners:
        d.reject(f"rank {quoted(str(rank))} does not exist: the job has {job.spec.learners} learners")
        return False
    return attempt == job.attempt and job.state.observes_learners


def _halt(
    d: _Decision,
    job: Job,
    reason: str,
    requeue: bool,
    for_own_tenant: bool,
    checkpoints: CheckpointPlaces | None,
) -> None:
    state = job.state
    if state is S.HALTING and job.requeue_on_halt and not requeue:
        d.emit(ev.HaltRequested(reason=reason or "halt requested", requested_by=d.command.producer))
        return
    if state in (S.HALTING, S.HALTED):
        return
    if not state.haltable:
        d.reject(f"a job in state {state} cannot be halted")
        return
    requester = d.command.producer
    job = d.emit(
        ev.HaltRequested(
            reason=reason or "halt requested",
            requested_by=requester,
            requeue=requeue,
            for_own_tenant=for_own_tenant,
        )
    )
    nothing_runs = state is S.RESTARTING or not any(learner.active for learner in job.learners)
    if job.state is not S.HALTING or nothing_runs:
        _halted(d, job, checkpoints)


def _halted(d: _Decision, job: Job, checkpoints: CheckpointPlaces | None) -> None:
    """Every learner has stopped: the job is HALTED, and queues again at once if it was preempted."""
    checkpoint = resume_point(job, checkpoints)
    job = d.emit(ev.JobHalted(checkpoint=checkpoint))
    if job.requeue_on_halt:
        d.emit(ev.ResumeRequested(requested_by=d.producer))
        where = f"its checkpoint at step {checkpoint.step}" if checkpoint else "the start (no checkpoint)"
        d.emit(ev.JobQueued(reason=f"requeued after preemption: resumes from {where}"))


def _failure(job: Job) -> tuple[ErrorCode, str] | None:
    """The first learner failure of the current attempt, as an error code and a reason."""
    for learner in job.learners:
        if learner.status is LearnerStatus.EXITED and learner.exit_code != 0:
            return ErrorCode.LEARNER_FAILED, f"learner {learner.rank} exited with code {learner.exit_code}"
        if learner.status is LearnerStatus.LOST:
            code = (
                ErrorCode.LEARNER_HUNG if learner.lost_reason == LossReason.HUNG else ErrorCode.LEARNER_LOST
            )
            detail = f": {learner.lost_detail}" if learner.lost_detail else ""
            return code, f"learner {learner.rank} lost ({learner.lost_reason}){detail}"
    return None


def _consequences(d: _Decision, rules: _Rules) -> None:
    """What follows from the learners' state once an observation has been applied."""
    job = d.state
    assert job is not None  # an observation always follows at least one event
    if job.state is S.HALTING:
        if not any(learner.active for learner in job.learners):
            _halted(d, job, rules.checkpoints)
        return
    failure = _failure(job)
    if failure is not None:
        code, reason = failure
        if job.restarts < job.spec.max_restarts:
            d.emit(
                ev.JobRestarting(
                    attempt=job.attempt + 1,
                    reason=within_reason(reason),
                    backoff_s=rules.policy.backoff(job.restarts),
                    resume_from=resume_point(job, rules.checkpoints),
                )
            )
        else:
            gave_up = f"{reason}; gave up after {job.restarts} restarts"
            d.emit(ev.JobFailed(code=code, reason=within_reason(gave_up)))
        return
    if job.state is S.LAUNCHING and all(learner.has_started for learner in job.learners):
        job = d.emit(ev.JobRunning(attempt=job.attempt))
    if job.state is S.RUNNING and all(learner.status is LearnerStatus.EXITED for learner in job.learners):
        d.emit(ev.JobStoring(attempt=job.attempt))


class JobKind(AggregateKind[Job, Event, Command, EventData]):
    """Jobs as an aggregate kind: keyed by job id, each belonging to a tenant, decided with ``policy``."""

    name = "job"
    id_field = "job_id"
    envelopes = (Event, Command)

    def __init__(
        self, policy: RestartPolicy | None = None, checkpoints: CheckpointPlaces | None = None
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.checkpoints = checkpoints

    def identity(self, item: Event | Command) -> str:
        return item.job_id

    def key(self, identity: str) -> str:
        return identity

    def tenant_of(self, item: Event | Command) -> str:
        return item.tenant

    def senders(self, command: Command) -> Senders:
        return job_senders(command.data)

    def owning_tenant(self, state: Job | None, command: Command) -> str:
        return state.tenant if state is not None else command.tenant

    def evolve(self, state: Job | None, event: Event) -> Job:
        return evolve(state, event)

    def decide(
        self, state: Job | None, command: Command, now: datetime, *, producer: str, leader_token: int | None
    ) -> list[Event]:
        return decide(
            state,
            command,
            now,
            policy=self.policy,
            producer=producer,
            leader_token=leader_token,
            checkpoints=self.checkpoints,
        )

    def event(self, command: Command, state: Job | None, head: EventHead, data: EventData) -> Event:
        tenant = state.tenant if state is not None else command.tenant
        return Event(**head, job_id=command.job_id, tenant=tenant, data=data)

    def rejection(self, command: Command, reason: str) -> EventData:
        command_id = str(command.command_id)
        return ev.CommandRejected(command_id=command_id, command_type=command.type, reason=reason)

    def address(self, job_id: str, tenant: str) -> Address[Command, CommandData]:
        """Where a command for the job goes."""
        return Address(Command, {"job_id": job_id, "tenant": tenant})


#: Jobs, decided with the default restart policy.
JOBS = JobKind()
