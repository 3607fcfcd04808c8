"""The key layout of learner heartbeats in the heartbeat store (architecture §6), shared by agent and monitor.

``/ffdl/jobs/<job>/learners/<rank>`` is bound to the learner's lease and holds its liveness and
progress as JSON; ``/ffdl/jobs/<job>/exits/<attempt>/<rank>`` holds its exit code, written without
a lease just before the agent revokes its lease, so a clean exit is never mistaken for a loss. The
exit record also names the last checkpoint the agent knew of: it outlives the beat, so whoever
relaunches a gang can still read what a stopped rank saved on its way out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ffdl.events.model import Checkpoint
from ffdl.events.reports import MAX_STEP, bound_metrics, bound_step, few_reasons, finite_or_null

JOBS_PREFIX = "/ffdl/jobs/"

#: what a checkpoint field of a beat may be
_SCALARS = (str, int, float, bool, type(None))


def learner_key(job_id: str, rank: int) -> str:
    return f"{JOBS_PREFIX}{job_id}/learners/{rank}"


def exits_prefix(job_id: str, attempt: int) -> str:
    """The prefix of the exit records of one attempt of a job."""
    return f"{JOBS_PREFIX}{job_id}/exits/{attempt}/"


def exit_key(job_id: str, attempt: int, rank: int) -> str:
    return f"{exits_prefix(job_id, attempt)}{rank}"


#: The largest exit record the monitor reads: the code and a checkpoint (a URI of at most 4,096
#: characters, each at most six bytes in the record, and a few short fields).
MAX_EXIT_BYTES = 32 * 1024


def encode_exit(exit_code: int, checkpoint: Mapping[str, Any] | None = None) -> bytes:
    """The exit record an agent writes: ``{"exit_code": N}`` (negative N: killed by signal N), with
    ``"checkpoint"``, the last one its beat named, when it knew of one.

    The checkpoint's fields are the learner's own words, so the record is written as UTF-8 (an
    escaped character outside ASCII takes up to twelve bytes, and a URI of them would swell the
    record past what the monitor reads), and one that would still be over :data:`MAX_EXIT_BYTES`
    goes without its checkpoint: the exit itself must always be readable, or a clean exit would be
    taken for a lost learner."""
    if checkpoint:
        encoded = _utf8_json({"exit_code": exit_code, "checkpoint": dict(checkpoint)})
        if len(encoded) <= MAX_EXIT_BYTES:
            return encoded
    return _utf8_json({"exit_code": exit_code})


def _utf8_json(record: Mapping[str, Any]) -> bytes:
    """``record`` as JSON in UTF-8; with JSON's ASCII escapes where only they can carry a string
    (a lone surrogate, which UTF-8 cannot encode)."""
    try:
        return json.dumps(record, sort_keys=True, allow_nan=False, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(record, sort_keys=True, allow_nan=False).encode()


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """What an exit record says: the command's exit code and the last checkpoint its agent knew of
    (as the agent wrote it: :func:`recorded_checkpoint` makes it one the owner may record)."""

    exit_code: int
    checkpoint: dict[str, Any] | None = None


def parse_exit(value: bytes) -> ExitRecord:
    """The exit record in ``value``, or :class:`ValueError` (the record is hostile input too).

    Over :data:`MAX_EXIT_BYTES`, not a JSON object, or without a 32-bit ``exit_code`` it is refused
    whole; a ``checkpoint`` that is not an object is left out (the exit still counts)."""
    if len(value) > MAX_EXIT_BYTES:
        raise ValueError(f"exit record of {len(value)} bytes is over the limit of {MAX_EXIT_BYTES}")
    try:
        raw = json.loads(value)
    except RecursionError as exc:
        raise ValueError("exit record nested too deeply") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"exit record is not UTF-8: {exc}") from exc
    code = raw.get("exit_code") if isinstance(raw, dict) else None
    if isinstance(code, bool) or not isinstance(code, int) or not -(2**31) <= code < 2**31:
        raise ValueError('exit record must be {"exit_code": int} (32 bits)')
    checkpoint = raw.get("checkpoint")
    return ExitRecord(code, checkpoint if isinstance(checkpoint, dict) and checkpoint else None)


def recorded_checkpoint(named: Mapping[str, Any], rank: int, attempt: int) -> Checkpoint:
    """The checkpoint a beat or an exit record names, as the job's owner records it: its rank and
    attempt are the key's and the beat's, never what the learner's side claims. :class:`ValueError`
    (pydantic's ``ValidationError`` is one) when it is not a checkpoint."""
    return Checkpoint.model_validate({**named, "rank": rank, "attempt": attempt})


@dataclass(frozen=True, slots=True)
class ParsedKey:
    kind: Literal["learner", "exit"]
    job_id: str
    rank: int
    attempt: int | None = None


def parse_key(key: str) -> ParsedKey | None:
    if not key.startswith(JOBS_PREFIX):
        return None
    parts = key[len(JOBS_PREFIX) :].split("/")
    if len(parts) == 3 and parts[1] == "learners" and _index(parts[2]):
        return ParsedKey("learner", parts[0], int(parts[2]))
    if len(parts) == 4 and parts[1] == "exits" and _index(parts[2]) and _index(parts[3]):
        return ParsedKey("exit", parts[0], int(parts[3]), int(parts[2]))
    return None


def _index(part: str) -> bool:
    """Whether a key's part is a rank or an attempt: ASCII digits (``str.isdigit`` takes "²", which
    ``int`` refuses), at most nine of them."""
    return part.isascii() and part.isdigit() and len(part) <= 9


@dataclass(frozen=True, slots=True)
class LearnerBeat:
    """What an agent publishes under its learner key.

    The monitor reads it as hostile input (on Kubernetes the agent runs in the tenant's pod, and
    anyone holding the job's heartbeat login writes the key): :meth:`from_json` takes only bounded
    data and brings step and metrics inside :mod:`ffdl.events.reports`' bounds, keeping the
    reasons of what it dropped in ``dropped``.
    """

    attempt: int
    pid: int | None = None
    agent_pid: int | None = None
    host: str = ""
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    last_progress: float = 0.0
    started_at: float = 0.0
    checkpoint: dict[str, Any] | None = None
    #: Under torchrun, each local worker's step by its global rank (empty for one worker).
    workers: dict[int, int] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "attempt": self.attempt,
                "pid": self.pid,
                "agent_pid": self.agent_pid,
                "host": self.host,
                "step": self.step,
                "metrics": self.metrics,
                "last_progress": self.last_progress,
                "started_at": self.started_at,
                "checkpoint": self.checkpoint,
                "workers": {str(rank): step for rank, step in self.workers.items()},
            },
            sort_keys=True,
            allow_nan=False,
        ).encode()

    @classmethod
    def from_json(cls, value: bytes) -> LearnerBeat:
        """The beat in ``value``, or :class:`ValueError` saying why it is none (never anything else).

        A beat larger than :data:`MAX_BEAT_BYTES`, nested deeper than the parser's stack, not an
        object, or without a positive ``attempt`` is refused whole; a bad step, metrics or
        checkpoint is dropped with its reason, so the learner still counts as alive.
        """
        if len(value) > MAX_BEAT_BYTES:
            raise ValueError(f"heartbeat of {len(value)} bytes is over the limit of {MAX_BEAT_BYTES}")
        try:
            raw = json.loads(value)
        except RecursionError as exc:
            raise ValueError("heartbeat nested too deeply") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"heartbeat is not UTF-8: {exc}") from exc
        try:
            return cls._read(raw)
        except RecursionError as exc:  # a value just under the parser's depth, deeper in a reason's repr
            raise ValueError("heartbeat nested too deeply") from exc

    @classmethod
    def _read(cls, raw: object) -> LearnerBeat:
        if not isinstance(raw, dict):
            raise ValueError(f"heartbeat is not a JSON object: {type(raw).__name__}")
        attempt = raw.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_STEP:
            raise ValueError(f"heartbeat attempt {attempt!r:.80} is not a positive integer")
        dropped: list[str] = []
        try:
            step = bound_step(raw.get("step", 0))
        except ValueError as exc:
            step = 0
            dropped.append(str(exc))
        metrics = bound_metrics(raw.get("metrics"))
        checkpoint = raw.get("checkpoint")
        if checkpoint is not None and not isinstance(checkpoint, dict):
            dropped.append(f"checkpoint is not an object: {type(checkpoint).__name__}")
            checkpoint = None
        if checkpoint is not None and not all(isinstance(item, _SCALARS) for item in checkpoint.values()):
            # a checkpoint's fields are scalars: a nested one, 500 levels deep in 1 KiB, once
            # crashed the monitor (its cleaning recursed past the stack), for every tenant
            dropped.append("checkpoint holds a nested value")
            checkpoint = None
        # read as data only (the monitor validates it as a Checkpoint): a NaN in it is null
        checkpoint = finite_or_null(checkpoint)
        host = raw.get("host", "")
        workers = _workers(raw.get("workers"), dropped)
        return cls(
            attempt=attempt,
            pid=_pid(raw.get("pid")),
            agent_pid=_pid(raw.get("agent_pid")),
            host=host[:MAX_HOST_LENGTH] if isinstance(host, str) else "",
            step=step,
            metrics=metrics.metrics,
            last_progress=_instant(raw.get("last_progress")),
            started_at=_instant(raw.get("started_at")),
            checkpoint=checkpoint,
            workers=workers,
            dropped=few_reasons([*dropped, *metrics.dropped]),
        )


#: The largest heartbeat value the monitor reads (a beat holds a step, bounded metrics and a checkpoint).
MAX_BEAT_BYTES = 64 * 1024
#: The longest host name kept from a beat (a DNS name is at most 253 characters).
MAX_HOST_LENGTH = 253


#: The most workers' steps kept from a beat (a learner runs at most this many torchrun workers).
MAX_BEAT_WORKERS = 256


def _workers(raw: object, dropped: list[str]) -> dict[int, int]:
    """The workers' steps by global rank, or what of them is well formed (the rest noted in ``dropped``)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        dropped.append(f"workers is not an object: {type(raw).__name__}")
        return {}
    workers: dict[int, int] = {}
    for rank, step in list(raw.items())[:MAX_BEAT_WORKERS]:
        try:
            if not (isinstance(rank, str) and rank.isdigit() and int(rank) < 2**31):
                raise ValueError(f"worker rank {rank!r:.40} is not a small integer")
            workers[int(rank)] = bound_step(step)
        except ValueError as exc:
            dropped.append(str(exc))
    if len(raw) > MAX_BEAT_WORKERS:
        dropped.append(f"{len(raw) - MAX_BEAT_WORKERS} workers over the limit of {MAX_BEAT_WORKERS}")
    return workers


def _pid(raw: object) -> int | None:
    """A process id, or None for anything that is none (a pid is a positive 32-bit integer)."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 < raw < 2**31:
        return None
    return raw


def _instant(raw: object) -> float:
    """Seconds since the epoch, or 0.0 for anything that is not a finite number."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return 0.0
    try:
        instant = float(raw)
    except OverflowError:
        return 0.0
    return instant if math.isfinite(instant) else 0.0
