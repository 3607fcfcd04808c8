"""Value types shared by events and commands: the job manifest, placements, checkpoints, error codes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ffdl.events.reports import Metrics

_NAME = re.compile(r"\A[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?\Z")

#: The learner environment contract: the variables the platform sets for every learner (README, "The
#: manifest"), which nothing a job asks for may change.
LEARNER_CONTRACT_VARIABLES = frozenset(
    {
        "FFDL_JOB_ID",
        "FFDL_TENANT",
        "FFDL_ATTEMPT",
        "FFDL_CHECKPOINT_DIR",
        "FFDL_RESUME_FROM",
        "FFDL_HEARTBEATS",
        "FFDL_HEARTBEAT_TTL",
        "FFDL_KEEP_CHECKPOINTS",
        "FFDL_LOG_FILE",
        "FFDL_REPORT_SOCKET",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TF_CONFIG",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "LEARNER_ID",
        "NUM_LEARNERS",
        "CHECKPOINT_DIR",
        "RESULT_DIR",
        "DATA_DIR",
    }
)

#: Prefixes of names a job's env may not set: the platform's own namespace, and the dynamic loader's
#: (every ``LD_`` variable is read by ld.so: ``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``...).
_FORBIDDEN_ENV_PREFIXES = {
    "FFDL_": "the platform's own variables",
    "LD_": "the dynamic loader's variables",
    "PET_": "torchrun's options, which the platform sets for its rendezvous",
}
#: Names that make an interpreter or a shell run code other than the command's: Python's module and
#: startup paths, the shell's startup files and traced prompts, glibc's charset converter modules;
#: and those that make glibc read files the job chose (tunables, locales, message catalogs, time
#: zones, host aliases), whose contents glibc trusts, ignoring the variables only in programs that
#: gain privileges. They were refused when the job's env was the environment of the programs that
#: start its command as root (the shell, nsenter, bwrap); those now start with the platform's PATH
#: alone and bwrap sets the command's environment (``adapters/launchers/sandbox.py``), so this is
#: defence in depth, not what keeps the job's env from root (docs/security.md).
_FORBIDDEN_ENV_NAMES = {
    **dict.fromkeys(
        (
            "PYTHONPATH",
            "PYTHONHOME",
            "PYTHONSTARTUP",
            "PYTHONINSPECT",
            "PYTHONUSERBASE",
            "PYTHONPLATLIBDIR",
            "PYTHONPYCACHEPREFIX",
            "PYTHONBREAKPOINT",
            "PYTHONEXECUTABLE",
        ),
        "a variable that makes Python load other code",
    ),
    **dict.fromkeys(
        ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4"), "a variable that makes the shell run other code"
    ),
    "GCONV_PATH": "a variable that makes glibc load other code",
    **dict.fromkeys(
        ("GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "TZDIR", "HOSTALIASES"),
        "a variable that makes glibc read other files",
    ),
}
#: ``TZ``: glibc opens the file a value names (after an optional ``:``, an absolute path as it is,
#: anything else under ``TZDIR``, ``..`` included) in every program that converts a time, and the
#: job's env was the environment of the root-side shell, ``nsenter`` and ``bwrap`` that start its
#: command (no longer: defence in depth, as above). So a job's ``TZ`` is a zone name or a POSIX TZ
#: string (their rules may hold ``/``: ``M10.5.0/3``), with no ``..``, and a path only to the
#: system's own zone files.
TZ_MAX = 255
_TZ = re.compile(rf":?[A-Za-z0-9_+\-.,:/<>]{{0,{TZ_MAX}}}\Z")
_SYSTEM_ZONES = ("/usr/share/zoneinfo/",)
_SYSTEM_DEFAULT_ZONE = "/etc/localtime"
ENV_NAME_MAX = 128
ENV_VALUE_MAX = 4096
ENV_TOTAL_MAX_BYTES = 64 * 1024
LABEL_KEY_MAX = 63
LABEL_VALUE_MAX = 256
MAP_ENTRIES_MAX = 256
_ENV_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_.-]{{0,{ENV_NAME_MAX - 1}}}\Z")
_LABEL_KEY = re.compile(rf"[A-Za-z0-9]([A-Za-z0-9._/-]{{0,{LABEL_KEY_MAX - 2}}}[A-Za-z0-9])?\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: A lone UTF-16 surrogate: what JSON's ``\ud800`` and YAML's ``"\uD800"`` escapes make of half a
#: pair. Python keeps it in a ``str``, but it is no Unicode character and UTF-8 cannot encode it.
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_UNICODE = (
    "is not Unicode text: it holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair)"
)


def env_problems(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Why a job may not run with ``env``, as (field, message) pairs; empty when it may.

    A job's env reaches only its own command: names the platform sets, the loader's and the
    interpreters' start-up variables are refused (they would change what the platform's own
    processes run, or break the contract), and sizes are bounded so that every learner can be started.
    """
    problems: list[tuple[str, str]] = []
    if len(env) > MAP_ENTRIES_MAX:
        problems.append(("env", f"at most {MAP_ENTRIES_MAX} entries"))
    for name, value in env.items():
        field = f"env.{name}"
        if not _ENV_NAME.match(name):
            problems.append(
                (
                    field,
                    f"a variable name is a letter or '_', then letters, digits, '_', '.' or '-' "
                    f"(at most {ENV_NAME_MAX} characters)",
                )
            )
        elif reason := _forbidden_env_reason(name):
            problems.append((field, f"may not be set: {reason}"))
        elif name == "TZ" and not _is_time_zone(value):
            problems.append(
                (
                    field,
                    "a time zone is a zone name (Europe/Berlin, :Europe/Berlin) or a POSIX TZ string "
                    f"(CET-1CEST,M3.5.0,M10.5.0/3) of at most {TZ_MAX} characters, not a path (a leading "
                    "'/' outside the system's zone files, '..'): glibc reads the file it names",
                )
            )
        if len(value) > ENV_VALUE_MAX or "\0" in value:
            problems.append((field, f"a value is at most {ENV_VALUE_MAX} characters, with no NUL"))
    total = sum(len(name.encode()) + len(value.encode()) + 2 for name, value in env.items())
    if total > ENV_TOTAL_MAX_BYTES:
        problems.append(("env", f"at most {ENV_TOTAL_MAX_BYTES} bytes in all"))
    return problems


def _is_time_zone(value: str) -> bool:
    """Whether ``value`` is a ``TZ`` that names no file but the system's own zone files."""
    if not _TZ.match(value):
        return False
    zone = value.removeprefix(":")
    if ".." in zone:
        return False
    return not zone.startswith("/") or zone == _SYSTEM_DEFAULT_ZONE or zone.startswith(_SYSTEM_ZONES)


def _forbidden_env_reason(name: str) -> str | None:
    if name in LEARNER_CONTRACT_VARIABLES:
        return "the platform sets it for every learner"
    if name in _FORBIDDEN_ENV_NAMES:
        return _FORBIDDEN_ENV_NAMES[name]
    for prefix, reason in _FORBIDDEN_ENV_PREFIXES.items():
        if name.startswith(prefix):
            return reason
    return None


def label_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """Why a job may not carry ``labels``, as (field, message) pairs; empty when it may."""
    problems: list[tuple[str, str]] = []
    if len(labels) > MAP_ENTRIES_MAX:
        problems.append(("labels", f"at most {MAP_ENTRIES_MAX} entries"))
    for key, value in labels.items():
        field = f"labels.{key}"
        if not _LABEL_KEY.match(key):
            problems.append(
                (
                    field,
                    f"a label key is letters, digits, '.', '_', '/' or '-', starting and ending "
                    f"alphanumeric (at most {LABEL_KEY_MAX} characters)",
                )
            )
        if len(value) > LABEL_VALUE_MAX or _CONTROL.search(value):
            problems.append(
                (field, f"a label value is at most {LABEL_VALUE_MAX} characters, with no control characters")
            )
    return problems


class Frozen(BaseModel):
    """Base of every value on the log: immutable and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


#: What a learner's agent takes of the learner's ``memory_mb``: the scheduler places a learner by
#: its ``memory_mb`` alone, so the agent beside it (a Python process, about 57 MB) must come out of
#: it (on Kubernetes it runs in the learner's pod, under the pod's limit; on the local launcher its
#: learner's cgroup gets the rest). Before, a manifest of 1,024 learners of 16 MB and no GPUs was
#: placed on one node and its agents, counted nowhere, took the host's memory.
LEARNER_AGENT_MEMORY_MB = 64
#: The least ``memory_mb`` a job may ask for: the agent's share and as much again for the learner.
LEARNER_MEMORY_MIN_MB = 2 * LEARNER_AGENT_MEMORY_MB


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
    launcher: Annotated[
        Literal["command", "torchrun"],
        Field(description="command: run the command as it is; torchrun: under torchrun, one per learner"),
    ] = "command"
    nproc_per_node: Annotated[
        int | None, Field(ge=1, le=64, description="torchrun's workers per learner (default: its GPUs, or 1)")
    ] = None
    keep_checkpoints: Annotated[
        int, Field(ge=0, le=10_000, description="complete checkpoints kept in the checkpoint dir; 0: all")
    ] = 3
    stop_grace_s: Annotated[
        float | None,
        Field(
            ge=0, le=3600, description="seconds from SIGTERM to SIGKILL on a stop (default: the platform's)"
        ),
    ] = None

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
        if len(value) > MAP_ENTRIES_MAX:
            raise ValueError(f"at most {MAP_ENTRIES_MAX} entries")
        return value

    @property
    def workers_per_learner(self) -> int:
        """The processes each learner runs: torchrun's ``nproc_per_node`` (default: the learner's GPUs,
        or 1), else one."""
        if self.launcher != "torchrun":
            return 1
        return self.nproc_per_node or max(self.gpus, 1)

    def submission_problems(self) -> list[tuple[str, str]]:
        """Why this spec may not be submitted now, as (field, message) pairs; empty when it may.

        These rules are checked where a spec enters the platform (the ``SubmitJob`` command, the
        manifest parser) and again by the launchers, not whenever a spec is decoded: a job submitted
        under older rules stays readable on the log, and is refused when it would launch.
        """
        if problems := self._surrogates():
            return problems  # the rules below measure text in UTF-8 and echo it: Unicode text only
        problems = [*env_problems(self.env), *label_problems(self.labels)]
        if self.nproc_per_node is not None and self.launcher != "torchrun":
            problems.append(("nproc_per_node", "only with launcher: torchrun"))
        for field in ("gpu_type", "image", "framework", "framework_version"):
            value = getattr(self, field)
            if value is not None and not value.isprintable():  # echoed in reasons the CLI shows
                problems.append((field, "may hold no control characters"))
        if self.memory_mb < LEARNER_MEMORY_MIN_MB:
            problems.append(
                (
                    "memory_mb",
                    f"at least {LEARNER_MEMORY_MIN_MB}: each learner's agent, which watches it and "
                    f"reports for it, takes {LEARNER_AGENT_MEMORY_MB} of it",
                )
            )
        return problems

    def _surrogates(self) -> list[tuple[str, str]]:
        """The entries of the spec's maps (``env``, ``labels``) whose key or value is not Unicode
        text, each named with a key's surrogate written as its escape.

        The spec's other strings are bounded in the model, and pydantic refuses a bounded string
        that is not Unicode (``string_unicode``); a map's keys and values are bounded by the rules
        after this one, which measure them in UTF-8. Such text in ``env`` made that measure raise (a
        500 from the API), and in a label it was accepted, after which no response naming it could
        be encoded."""
        problems: list[tuple[str, str]] = []
        for name, value in self:
            if isinstance(value, Mapping):
                problems += [
                    (f"{name}.{key.encode('utf-8', 'backslashreplace').decode()}", _NOT_UNICODE)
                    for key, text in value.items()
                    if _SURROGATE.search(key) or _SURROGATE.search(text)
                ]
        return problems


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


#: Where a checkpoint is, as the log carries it: 1 to 4096 characters of text. A file name that is
#: not UTF-8 decodes (``os.fsdecode``) to lone surrogates, which are no text: the model refuses them.
CheckpointUri = Annotated[str, Field(min_length=1, max_length=4096)]
_CHECKPOINT_URI: TypeAdapter[str] = TypeAdapter(CheckpointUri)


def checkpoint_uri_problem(uri: object) -> str | None:
    """Why :class:`Checkpoint` would refuse ``uri``, or None: the learner's agent asks before it
    records what a learner named, since a refusal raised from inside the agent ended it before its
    exit record."""
    try:
        _CHECKPOINT_URI.validate_python(uri, strict=True)
    except ValidationError as error:
        return str(error.errors()[0]["msg"])
    return None


class Checkpoint(Frozen):
    """A checkpoint the platform recorded (it records; the learner stores)."""

    rank: Annotated[int, Field(ge=0)]
    attempt: Annotated[int, Field(ge=1)]
    step: Annotated[int, Field(ge=0)]
    uri: CheckpointUri
    size_bytes: Annotated[int, Field(ge=0)] = 0
    checksum: Annotated[str, Field(max_length=200)] = ""


class ResultSummary(Frozen):
    """What the platform recorded of a job's results when it completed."""

    result_dir: str | None = None
    files: int = 0
    size_bytes: int = 0
    metrics: Metrics = Field(default_factory=dict)


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
    PRIORITY = "priority"  # a job of a higher priority (or service band) waits ahead of it for the same GPUs
    RESERVATION = "reservation"  # it would fit, but only on nodes reserved for a job ahead of it
    PREEMPTION = "preemption"  # lower-priority or borrowing jobs are being halted to make room for it


class LossReason(StrEnum):
    """Why the platform decided a learner is gone although it reported no exit."""

    EXPIRED = "expired"  # its heartbeat lease ran out
    HUNG = "hung"  # alive, but no progress for the job's progress timeout
    VANISHED = "vanished"  # its process or pod disappeared
