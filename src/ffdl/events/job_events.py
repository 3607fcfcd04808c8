"""Every event of a job's life. Each is a fact the job's owner appended; names are past tense."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ffdl.events.envelope import EventData
from ffdl.events.model import (
    Checkpoint,
    ErrorCode,
    JobSpec,
    LossReason,
    Placement,
    ResultSummary,
    WaitReason,
)
from ffdl.events.reports import MAX_STEP, DropReasons, Metrics

Rank = Annotated[int, Field(ge=0)]
Attempt = Annotated[int, Field(ge=1)]
#: The most characters a reason may have, and the most job ids or node names one event may name.
REASON_MAX = 2000
NAMES_MAX = 1024
Reason = Annotated[str, Field(max_length=REASON_MAX)]


#: The most characters of a value its sender chose (a record's key, a rank) that a reason quotes.
QUOTE_MAX = 200


def within_reason(text: str) -> str:
    """``text`` as a reason may hold it: its head, and an ellipsis where it was cut (for text from
    elsewhere, a Kubernetes message say, that may be longer)."""
    return _cut(text, REASON_MAX)


def quoted(text: str) -> str:
    """``text`` (a sender's value) as a reason quotes it: at most :data:`QUOTE_MAX` characters, so
    that what the reason says around it still fits (a tenant's record key may be a megabyte long,
    a rank 4,000 digits)."""
    return _cut(text, QUOTE_MAX)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


JobIds = Annotated[tuple[str, ...], Field(max_length=NAMES_MAX)]
NodeNames = Annotated[tuple[str, ...], Field(max_length=NAMES_MAX)]


class JobSubmitted(EventData):
    VERSION = 2  # v2: the spec's launcher, nproc_per_node, keep_checkpoints and stop_grace_s

    spec: JobSpec
    submitted_by: str = ""


class JobAccepted(EventData):
    """Admission found the job can run on this cluster under its tenant's limits."""


class JobRejected(EventData):
    """Admission refused the job (it can never fit, or its tenant may never run it)."""

    code: ErrorCode
    reason: Reason


class JobQueued(EventData):
    """The job waits for GPUs: first after admission, again after a halt was resumed."""

    reason: Reason = ""


class JobWaiting(EventData):
    """Why the queued job does not run yet, appended only when the scheduler's reason changes.

    ``waiting_for`` names the jobs it waits on (the reservation holder ahead of it, the jobs being
    preempted for it); ``reserved_nodes`` are the nodes kept free for it, which jobs behind it may not use.
    """

    code: WaitReason
    detail: Reason = ""
    waiting_for: JobIds = ()
    reserved_nodes: NodeNames = ()


class GpusAllocated(EventData):
    """The scheduler reserved the whole gang's GPUs at once."""

    placement: Placement
    reason: Reason = ""


class JobLaunching(EventData):
    """The launcher starts every learner of ``attempt``, resuming from ``resume_from`` if set."""

    attempt: Attempt
    resume_from: Checkpoint | None = None


class LearnerStarted(EventData):
    rank: Rank
    attempt: Attempt
    pid: int | None = None
    host: str = ""


class JobRunning(EventData):
    """Every learner of ``attempt`` has started."""

    attempt: Attempt


class LearnerProgressed(EventData):
    """``dropped`` (v2): why metrics the learner reported were left out (not finite, too many...)."""

    VERSION = 2

    rank: Rank
    attempt: Attempt
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    metrics: Metrics = Field(default_factory=dict)
    dropped: DropReasons = ()


class CheckpointRecorded(EventData):
    checkpoint: Checkpoint


class LearnerExited(EventData):
    rank: Rank
    attempt: Attempt
    exit_code: int


class LearnerLost(EventData):
    rank: Rank
    attempt: Attempt
    reason: LossReason
    detail: Reason = ""


class JobRestarting(EventData):
    """The gang restarts as ``attempt`` after ``backoff_s`` seconds, from ``resume_from``."""

    attempt: Attempt
    reason: Reason
    backoff_s: Annotated[float, Field(ge=0)]
    resume_from: Checkpoint | None = None


class HaltRequested(EventData):
    """``requeue``: once halted the job queues again (a preemption), to resume from its checkpoint;
    ``for_own_tenant``: that preemption makes room for a job of its own tenant."""

    VERSION = 3

    reason: Reason = ""
    requested_by: str = ""
    requeue: bool = False
    for_own_tenant: bool = False


class JobHalted(EventData):
    """Every learner stopped; the job resumes from ``checkpoint`` (None: from the start)."""

    checkpoint: Checkpoint | None = None


class ResumeRequested(EventData):
    requested_by: str = ""


class CancelRequested(EventData):
    reason: Reason = ""
    requested_by: str = ""


class JobCancelled(EventData):
    reason: Reason = ""


class JobStoring(EventData):
    """Every learner exited 0; the platform records the job's results."""

    attempt: Attempt


class JobCompleted(EventData):
    VERSION = 2  # v2: the result's metrics are finite and bounded

    result: ResultSummary


class JobDeleted(EventData):
    """An ended job was deleted by its owner: it leaves the job listings; its history stays on the log."""

    requested_by: str = ""


class JobFailed(EventData):
    code: ErrorCode
    reason: Reason


class GpusReleased(EventData):
    """The gang's GPUs are free again; only ever after a terminal or halted event."""

    placement: Placement


class CommandRejected(EventData):
    """A command that was illegal in the job's state: recorded, and processing moved on."""

    command_id: str
    command_type: str
    reason: Reason


EVENT_TYPES: dict[str, type[EventData]] = {
    cls.type_name(): cls
    for cls in (
        JobSubmitted,
        JobAccepted,
        JobRejected,
        JobQueued,
        JobWaiting,
        GpusAllocated,
        JobLaunching,
        LearnerStarted,
        JobRunning,
        LearnerProgressed,
        CheckpointRecorded,
        LearnerExited,
        LearnerLost,
        JobRestarting,
        HaltRequested,
        JobHalted,
        ResumeRequested,
        CancelRequested,
        JobCancelled,
        JobStoring,
        JobCompleted,
        JobDeleted,
        JobFailed,
        GpusReleased,
        CommandRejected,
    )
}
