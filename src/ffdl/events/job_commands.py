"""Every command: requests from users and services, and observations from platform roles.

Commands are untrusted input; the job's owner checks each against the job's state and turns it
into events or a ``CommandRejected``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from ffdl.events.envelope import CommandData
from ffdl.events.job_events import Attempt, JobIds, NodeNames, Rank, Reason
from ffdl.events.model import Checkpoint, ErrorCode, JobSpec, LossReason, Placement, ResultSummary, WaitReason
from ffdl.events.reports import MAX_STEP, DropReasons, ReportedMetrics


class SubmitJob(CommandData):
    VERSION = 2  # v2: the spec's launcher, nproc_per_node, keep_checkpoints and stop_grace_s
    CREATES_JOB = True

    spec: JobSpec

    @field_validator("spec")
    @classmethod
    def _submittable(cls, spec: JobSpec) -> JobSpec:
        """A spec enters the platform only under today's rules (whoever sends it: API or producer)."""
        if problems := spec.submission_problems():
            raise ValueError("; ".join(f"{field}: {message}" for field, message in problems))
        return spec


class AdmitJob(CommandData):
    """Sent by admission: the job may queue."""


class RejectJob(CommandData):
    code: ErrorCode
    reason: Reason


class AllocateGpus(CommandData):
    """Sent by the scheduler (with its fencing token) to reserve a gang's GPUs."""

    placement: Placement
    reason: Reason = ""


class RecordWaitReason(CommandData):
    """Sent by the scheduler (with its fencing token) when its reason for not starting a job changes."""

    code: WaitReason
    detail: Reason = ""
    waiting_for: JobIds = ()
    reserved_nodes: NodeNames = ()


class BeginLaunch(CommandData):
    """Sent by the launcher once GPUs are reserved, or by the restart timer after its backoff."""

    attempt: Attempt


class ReportLearnerStarted(CommandData):
    rank: Rank
    attempt: Attempt
    pid: int | None = None
    host: str = ""


class ReportProgress(CommandData):
    """A learner's step and metrics, inside :mod:`ffdl.events.reports`' bounds (a command outside
    them is refused whole, with the reason, when it is decoded); ``dropped``: why the monitor
    left metrics out of what the learner reported (v2)."""

    VERSION = 2

    rank: Rank
    attempt: Attempt
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    metrics: ReportedMetrics = Field(default_factory=dict)
    dropped: DropReasons = ()


class ReportCheckpoint(CommandData):
    checkpoint: Checkpoint


class ReportLearnerExited(CommandData):
    rank: Rank
    attempt: Attempt
    exit_code: int


class ReportLearnerLost(CommandData):
    rank: Rank
    attempt: Attempt
    reason: LossReason
    detail: Reason = ""


class HaltJob(CommandData):
    """``requeue``: queue the job again once halted (a preemption), to resume from its checkpoint.
    ``for_own_tenant``: the preemption makes room for a job of the halted job's own tenant (it does
    not count towards least attained service's loop guard, :mod:`ffdl.core.service`)."""

    VERSION = 3

    reason: Reason = ""
    requeue: bool = False
    for_own_tenant: bool = False


class ResumeJob(CommandData):
    pass


class CancelJob(CommandData):
    reason: Reason = ""


class FinishStoring(CommandData):
    VERSION = 2  # v2: the result's metrics are finite and bounded

    result: ResultSummary


class ReleaseGpus(CommandData):
    """Sent by the finaliser once the learners of a halted or ended job are stopped."""


class DeleteJob(CommandData):
    """Forget an ended job in the listings (its events stay on the log)."""


COMMAND_TYPES: dict[str, type[CommandData]] = {
    cls.type_name(): cls
    for cls in (
        SubmitJob,
        AdmitJob,
        RejectJob,
        AllocateGpus,
        RecordWaitReason,
        BeginLaunch,
        ReportLearnerStarted,
        ReportProgress,
        ReportCheckpoint,
        ReportLearnerExited,
        ReportLearnerLost,
        HaltJob,
        ResumeJob,
        CancelJob,
        FinishStoring,
        ReleaseGpus,
        DeleteJob,
    )
}
