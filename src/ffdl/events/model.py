"""Value types shared by events and commands: the job manifest, placements, checkpoints, error codes."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = re.compile(r"\A[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?\Z")


class Frozen(BaseModel):
    """Base of every value on the log: immutable and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class JobSpec(Frozen):
    """What a user asks for: N learners x G GPUs running a command, with its data and result places.

    Field names follow FfDL's manifest where one existed (learners, gpus, cpus, memory) so that
    a manifest translates field for field.
    """

    name: Annotated[str, Field(min_length=1, max_length=63)]
    command: Annotated[str, Field(min_length=1, max_length=8192)]
    learners: Annotated[int, Field(ge=1, le=1024)] = 1
    gpus: Annotated[int, Field(ge=0, le=16, description="GPUs per learner")] = 0
    gpu_type: Annotated[str | None, Field(max_length=63)] = None
    cpus: Annotated[float, Field(gt=0, le=512, description="CPUs per learner")] = 1.0
    memory_mb: Annotated[int, Field(ge=16, le=4_194_304, description="memory per learner")] = 1024
    image: Annotated[str | None, Field(max_length=512)] = None
    framework: Annotated[str | None, Field(max_length=63)] = None
    framework_version: Annotated[str | None, Field(max_length=63)] = None
    data_dir: Annotated[str | None, Field(max_length=4096)] = None
    result_dir: Annotated[str | None, Field(max_length=4096)] = None
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    placement: Literal["pack", "spread"] = "pack"
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    progress_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 300.0

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "must be lower-case letters, digits, '.', '_' or '-', starting and ending alphanumeric"
            )
        return value

    @field_validator("env", "labels")
    @classmethod
    def _bounded_map(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 256:
            raise ValueError("at most 256 entries")
        return value


class LearnerPlacement(Frozen):
    """Where one learner runs: a node and the GPU indices it holds there."""

    rank: Annotated[int, Field(ge=0)]
    node: str
    gpus: tuple[int, ...] = ()
    gpu_type: str | None = None


class Placement(Frozen):
    """A whole gang's placement: one entry per learner rank, all or nothing."""

    learners: tuple[LearnerPlacement, ...]

    def gpu_slots(self) -> frozenset[tuple[str, int]]:
        """Every (node, gpu index) pair the gang holds."""
        return frozenset((learner.node, gpu) for learner in self.learners for gpu in learner.gpus)


class Checkpoint(Frozen):
    """A checkpoint the platform recorded (it records; the learner stores)."""

    rank: Annotated[int, Field(ge=0)]
    attempt: Annotated[int, Field(ge=1)]
    step: Annotated[int, Field(ge=0)]
    uri: Annotated[str, Field(min_length=1, max_length=4096)]
    size_bytes: Annotated[int, Field(ge=0)] = 0
    checksum: Annotated[str, Field(max_length=200)] = ""


class ResultSummary(Frozen):
    """What the platform recorded of a job's results when it completed."""

    result_dir: str | None = None
    files: int = 0
    size_bytes: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)


class FailureKind(StrEnum):
    """Whose fault a failure is, in FfDL's spirit: the user's code or manifest, or the platform."""

    CLIENT = "client"
    PLATFORM = "platform"


class ErrorCode(StrEnum):
    """Why a job failed or a command was refused; each code belongs to one :class:`FailureKind`."""

    INVALID_MANIFEST = "C100"
    UNSCHEDULABLE = "C101"
    LEARNER_FAILED = "C200"
    LEARNER_HUNG = "C201"
    ILLEGAL_COMMAND = "C300"
    LEARNER_LOST = "P200"
    LAUNCH_FAILED = "P201"

    @property
    def kind(self) -> FailureKind:
        return FailureKind.CLIENT if self.value.startswith("C") else FailureKind.PLATFORM


class WaitReason(StrEnum):
    """Why the scheduler has not started a queued job yet: what ``ffdl why`` answers with."""

    QUOTA = "quota"  # its tenant would exceed its GPU limit (guaranteed + borrowing)
    CAPACITY = "capacity"  # not enough GPUs are free
    FRAGMENTATION = "fragmentation"  # enough GPUs are free in total, but not on few enough nodes for the gang
    GPU_TYPE = "gpu-type"  # GPUs are free, but not of the type it asks for
    PRIORITY = "priority"  # a higher-priority job waits ahead of it for the same GPUs
    RESERVATION = "reservation"  # it would fit, but only on nodes reserved for a job ahead of it
    PREEMPTION = "preemption"  # lower-priority or borrowing jobs are being halted to make room for it


class LossReason(StrEnum):
    """Why the platform decided a learner is gone although it reported no exit."""

    EXPIRED = "expired"  # its heartbeat lease ran out
    HUNG = "hung"  # alive, but no progress for the job's progress timeout
    VANISHED = "vanished"  # its process or pod disappeared
