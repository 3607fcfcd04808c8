"""A job's state as the fold of its events: ``evolve(job, event) -> job``, pure and total.

``evolve`` applies the transition table and keeps everything the decider and the read side need:
per-learner state, the current attempt, the GPUs the job holds, its checkpoints, the time it
entered each state and why. It never looks at a clock; times come from the events.

Replaying a log folds every event through ``evolve``, so it copies ``Job`` and ``Learner`` with
field copiers generated once at import instead of ``dataclasses.replace``, and copies the job once
per event. The copiers hold no state: ``evolve`` stays a pure function, safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from types import MemberDescriptorType
from typing import Protocol, TypeVar

from ffdl.core.aggregate import EvolveError, remember
from ffdl.core.states import JobState, next_state
from ffdl.events import job_events as ev
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import Checkpoint, ErrorCode, JobSpec, Placement, ResultSummary, WaitReason


class LearnerStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    LOST = "LOST"


@dataclass(frozen=True, slots=True)
class Learner:
    """One learner of the current attempt (FfDL only ever reported learner 1; we track each)."""

    rank: int
    status: LearnerStatus = LearnerStatus.PENDING
    node: str = ""
    gpus: tuple[int, ...] = ()
    pid: int | None = None
    host: str = ""
    step: int = 0
    metrics: tuple[tuple[str, float], ...] = ()
    last_progress_at: datetime | None = None
    exit_code: int | None = None
    lost_reason: str = ""
    lost_detail: str = ""

    @property
    def active(self) -> bool:
        return self.status in (LearnerStatus.PENDING, LearnerStatus.RUNNING)

    @property
    def has_started(self) -> bool:
        return self.status is not LearnerStatus.PENDING


@dataclass(frozen=True, slots=True)
class StateEntry:
    """The job entered ``state`` at ``at`` because of ``reason``."""

    state: JobState
    at: datetime
    reason: str
    seq: int


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """The scheduler's recorded reason why a queued job does not run yet (a ``JobWaiting`` event)."""

    code: WaitReason
    detail: str = ""
    waiting_for: tuple[str, ...] = ()
    reserved_nodes: tuple[str, ...] = ()

    def same_as(self, other: WaitRecord | None) -> bool:
        """Whether ``other`` says the same thing; the detail's wording alone is no change worth an event."""
        return (
            other is not None
            and self.code is other.code
            and self.waiting_for == other.waiting_for
            and self.reserved_nodes == other.reserved_nodes
        )


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    tenant: str
    spec: JobSpec
    state: JobState
    seq: int
    submitted_at: datetime
    updated_at: datetime
    attempt: int = 0
    restarts: int = 0
    backoff_s: float = 0.0
    placement: Placement | None = None
    learners: tuple[Learner, ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    resume_from: Checkpoint | None = None
    history: tuple[StateEntry, ...] = ()
    failure_code: ErrorCode | None = None
    result: ResultSummary | None = None
    deleted: bool = False
    reason: str = ""
    fencing_token: int | None = None
    waiting: WaitRecord | None = None
    waiting_since: datetime | None = None
    requeue_on_halt: bool = False
    halt_for_own_tenant: bool = False  # the halt under way makes room for a job of its own tenant
    preemptions: int = 0  # halts that requeued it: preemptions, moves off a lost or drained node
    #: of those, preemptions that made room for a job of its own tenant (least attained service's
    #: loop guard counts the others only: a tenant's own jobs could halt its job into the guard)
    preemptions_for_own_tenant: int = 0
    recent_commands: tuple[int, ...] = field(default=(), repr=False)  # the ids' ints (``remember``)

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return max(self.checkpoints, key=lambda c: (c.step, c.attempt), default=None)

    @property
    def releasing(self) -> bool:
        """It holds GPUs on their way out (halting, storing its results): they count for its
        tenant until freed, but not as what it borrows, and it is no victim."""
        return self.placement is not None and not self.state.preemptible

    @property
    def allocated_at(self) -> datetime | None:
        """When the job last got its GPUs (entered SCHEDULED): how long its current run has lasted."""
        return next((entry.at for entry in reversed(self.history) if entry.state is JobState.SCHEDULED), None)

    def learner(self, rank: int) -> Learner | None:
        return self.learners[rank] if 0 <= rank < len(self.learners) else None


_Record = TypeVar("_Record")


class _Copy(Protocol[_Record]):
    """A copier's signature: ``record`` with the fields named in ``changes`` replaced."""

    def __call__(self, record: _Record, /, **changes: object) -> _Record: ...


#: What a copier's parameter holds when the field is kept as it is.
_KEEP = object()


def _field_copier(cls: type[_Record]) -> _Copy[_Record]:
    """``dataclasses.replace`` for the slotted dataclass ``cls``, at a fraction of its cost.

    ``replace`` walks the field metadata and calls ``__init__`` with keywords on every call, which was
    most of what a replay spent per event. Like ``dataclasses`` itself, this generates the code once:
    a function that makes a bare instance and sets every slot through its member descriptor (which
    bypasses the frozen ``__setattr__``, as the generated ``__init__`` does), from ``changes`` or
    else from ``record``. That equals calling ``__init__`` only for a slotted class without
    ``__post_init__`` or ``init=False`` fields, so any other class is refused. Like ``replace``, a
    change naming no field raises ``TypeError``.
    """
    record_fields = fields(cls)  # type: ignore[arg-type]
    if (
        hasattr(cls, "__post_init__")
        or not all(f.init for f in record_fields)
        or not all(isinstance(getattr(cls, f.name, None), MemberDescriptorType) for f in record_fields)
    ):
        raise TypeError(f"{cls.__name__}.__init__ does more than set slots; copy it with replace")
    namespace: dict[str, object] = {"new": object.__new__, "cls": cls, "KEEP": _KEEP}
    names = [f.name for f in record_fields]
    if any(name in namespace or name in ("record", "copied") or name.startswith("set_") for name in names):
        raise TypeError(f"{cls.__name__} has a field named like a name of its copier; copy it with replace")
    # Keyword-only parameters: Python binds ``changes`` to them (and refuses a name that is no field),
    # so each field costs one identity test, not a dictionary lookup.
    lines = [
        f"def copy(record, /, *, {', '.join(f'{name}=KEEP' for name in names)}):",
        "    copied = new(cls)",
    ]
    for index, name in enumerate(names):
        namespace[f"set_{index}"] = getattr(cls, name).__set__
        lines.append(f"    set_{index}(copied, record.{name} if {name} is KEEP else {name})")
    lines.append("    return copied")
    exec("\n".join(lines), namespace)
    copy: _Copy[_Record] = namespace["copy"]  # type: ignore[assignment]
    return copy


_copy_job = _field_copier(Job)
_copy_learner = _field_copier(Learner)


def _reason_of(data: EventData) -> str:
    match data:
        case ev.JobLaunching(attempt=attempt, resume_from=None):
            return f"attempt {attempt} from the start"
        case ev.JobLaunching(attempt=attempt, resume_from=checkpoint) if checkpoint is not None:
            return f"attempt {attempt} from the checkpoint of step {checkpoint.step}"
        case ev.JobRunning(attempt=attempt):
            return f"every learner of attempt {attempt} started"
        case ev.JobStoring():
            return "every learner exited 0; recording results"
        case ev.JobCompleted(result=result):
            return f"results recorded: {result.files} file(s), {result.size_bytes} bytes"
        case ev.JobHalted(checkpoint=checkpoint):
            return (
                f"halted at the checkpoint of step {checkpoint.step}"
                if checkpoint
                else "halted before a checkpoint"
            )
        case _:
            pass
    for name in ("reason", "detail"):
        value = getattr(data, name, None)
        if isinstance(value, str) and value:
            return str(value)
    return data.type_name()


def _fresh_learners(placement: Placement | None, count: int) -> tuple[Learner, ...]:
    if placement is None:
        return tuple(Learner(rank=rank) for rank in range(count))
    return tuple(Learner(rank=p.rank, node=p.node, gpus=p.gpus) for p in placement.learners)


def _learner_at(job: Job, rank: int) -> Learner:
    """The learner of ``rank``; an event naming a rank the job does not have cannot apply."""
    if not 0 <= rank < len(job.learners):
        raise EvolveError(f"job {job.job_id} has no learner of rank {rank}")
    return job.learners[rank]


def _update_learner(job: Job, rank: int, **changes: object) -> tuple[Learner, ...]:
    learners = list(job.learners)
    learners[rank] = _copy_learner(_learner_at(job, rank), **changes)
    return tuple(learners)


def start(event: Event) -> Job:
    """The job that a ``JobSubmitted`` event creates."""
    if not isinstance(event.data, ev.JobSubmitted):
        raise EvolveError(f"job {event.job_id} must start with JobSubmitted, not {event.type}")
    if event.seq != 1:
        raise EvolveError(f"job {event.job_id}: JobSubmitted must have seq 1, has {event.seq}")
    state = next_state(None, ev.JobSubmitted)
    return Job(
        job_id=event.job_id,
        tenant=event.tenant,
        spec=event.data.spec,
        state=state,
        seq=1,
        submitted_at=event.occurred_at,
        updated_at=event.occurred_at,
        learners=_fresh_learners(None, event.data.spec.learners),
        history=(StateEntry(state, event.occurred_at, "submitted", 1),),
        reason="submitted",
        recent_commands=remember((), event.causation_id),
    )


def evolve(job: Job | None, event: Event) -> Job:
    """Apply one event; raises :class:`EvolveError` for a gap, a duplicate seq or an illegal event."""
    if job is None:
        return start(event)
    if event.job_id != job.job_id:
        raise EvolveError(f"event of job {event.job_id} applied to job {job.job_id}")
    if event.seq != job.seq + 1:
        raise EvolveError(f"job {job.job_id}: expected seq {job.seq + 1}, got {event.seq}")
    try:
        state = next_state(job.state, type(event.data))
    except ValueError as exc:
        raise EvolveError(f"job {job.job_id} seq {event.seq}: {exc}") from exc
    changes = _payload_changes(job, event)
    recent = remember(job.recent_commands, event.causation_id)
    history = job.history
    if state is not job.state:
        entered = StateEntry(state, event.occurred_at, _reason_of(event.data), event.seq)
        history = (*history, entered)
        # the reason is the current state's, the one its entry records (an event's own reason where it
        # gives one): a reason left from an earlier state ("waiting for GPUs" on a RUNNING job)
        # answers a question nobody asks any more
        changes["reason"] = entered.reason
    token = job.fencing_token
    if event.fencing_token is not None:
        token = max(token or 0, event.fencing_token)
    return _copy_job(
        job,
        **changes,
        state=state,
        seq=event.seq,
        updated_at=event.occurred_at,
        history=history,
        recent_commands=recent,
        fencing_token=token,
    )


def _payload_changes(job: Job, event: Event) -> dict[str, object]:
    """The fields of ``job`` that the event's payload changes; ``evolve`` adds its own and copies once.

    ``LearnerProgressed`` comes first since most of a running job's events are progress; the cases
    match disjoint classes, so their order only decides how many are tried.
    """
    at = event.occurred_at
    match event.data:
        case ev.LearnerProgressed(rank=rank, step=step, metrics=metrics):
            metric_items = tuple(sorted(metrics.items()))
            progressed = _update_learner(job, rank, step=step, metrics=metric_items, last_progress_at=at)
            return {"learners": progressed}
        case ev.JobRejected(code=code, reason=reason) | ev.JobFailed(code=code, reason=reason):
            return {"failure_code": code, "reason": reason}
        case ev.JobWaiting(code=code, detail=detail, waiting_for=waiting_for, reserved_nodes=reserved_nodes):
            waiting = WaitRecord(code, detail, waiting_for, reserved_nodes)
            return {"waiting": waiting, "waiting_since": at, "reason": detail or job.reason}
        case ev.GpusAllocated(placement=placement):
            learners = _fresh_learners(placement, job.spec.learners)
            return {"placement": placement, "learners": learners, "waiting": None, "waiting_since": None}
        case ev.JobLaunching(attempt=attempt, resume_from=resume_from):
            return {
                "attempt": attempt,
                "resume_from": resume_from,
                "learners": _fresh_learners(job.placement, job.spec.learners),
            }
        case ev.LearnerStarted(rank=rank, pid=pid, host=host):
            learner = _learner_at(job, rank)
            status = learner.status if learner.has_started else LearnerStatus.RUNNING
            started = _update_learner(job, rank, status=status, pid=pid, host=host, last_progress_at=at)
            return {"learners": started}
        case ev.CheckpointRecorded(checkpoint=checkpoint):
            kept = tuple(c for c in job.checkpoints if c.uri != checkpoint.uri)[-15:]
            return {"checkpoints": (*kept, checkpoint)}
        case ev.LearnerExited(rank=rank, exit_code=code):
            return {"learners": _update_learner(job, rank, status=LearnerStatus.EXITED, exit_code=code)}
        case ev.LearnerLost(rank=rank, reason=reason, detail=detail):
            lost = _update_learner(
                job, rank, status=LearnerStatus.LOST, lost_reason=str(reason), lost_detail=detail
            )
            return {"learners": lost}
        case ev.JobRestarting(attempt=attempt, reason=reason, resume_from=resume_from, backoff_s=backoff_s):
            return {
                "attempt": attempt,
                "restarts": job.restarts + 1,
                "backoff_s": backoff_s,
                "resume_from": resume_from,
                "reason": reason,
                "learners": _fresh_learners(job.placement, job.spec.learners),
            }
        case ev.JobCompleted(result=result):
            return {"result": result}
        case ev.JobDeleted():
            return {"deleted": True}
        case ev.GpusReleased():
            return {"placement": None}
        case ev.JobQueued(reason=reason):
            return {
                "reason": reason or job.reason,
                "waiting": None,
                "waiting_since": None,
                "requeue_on_halt": False,
                "halt_for_own_tenant": False,
            }
        case ev.JobHalted() if job.requeue_on_halt:
            own = job.preemptions_for_own_tenant + int(job.halt_for_own_tenant)
            return {"preemptions": job.preemptions + 1, "preemptions_for_own_tenant": own}
        case ev.HaltRequested(reason=reason, requeue=requeue, for_own_tenant=for_own_tenant):
            return {
                "reason": reason or job.reason,
                "requeue_on_halt": requeue,
                "halt_for_own_tenant": requeue and for_own_tenant,
            }
        case ev.JobCancelled(reason=reason):
            return {"reason": reason or job.reason}
        case _:
            return {}
