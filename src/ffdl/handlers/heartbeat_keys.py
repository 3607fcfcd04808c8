"""The key layout of learner heartbeats in the heartbeat store (architecture §6), shared by agent and monitor.

``/ffdl/jobs/<job>/learners/<rank>`` is bound to the learner's lease and holds its liveness and
progress as JSON; ``/ffdl/jobs/<job>/exits/<attempt>/<rank>`` holds its exit code, written without
a lease just before the agent revokes its lease, so a clean exit is never mistaken for a loss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

JOBS_PREFIX = "/ffdl/jobs/"


def learner_key(job_id: str, rank: int) -> str:
    return f"{JOBS_PREFIX}{job_id}/learners/{rank}"


def exit_key(job_id: str, attempt: int, rank: int) -> str:
    return f"{JOBS_PREFIX}{job_id}/exits/{attempt}/{rank}"


def encode_exit(exit_code: int) -> bytes:
    """The exit record an agent writes: ``{"exit_code": N}`` (negative N: killed by signal N)."""
    return json.dumps({"exit_code": exit_code}).encode()


def parse_exit(value: bytes) -> int:
    raw = json.loads(value)
    if not isinstance(raw, dict) or not isinstance(raw.get("exit_code"), int):
        raise ValueError('exit record must be {"exit_code": int}')
    return int(raw["exit_code"])


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
    if len(parts) == 3 and parts[1] == "learners" and parts[2].isdigit():
        return ParsedKey("learner", parts[0], int(parts[2]))
    if len(parts) == 4 and parts[1] == "exits" and parts[2].isdigit() and parts[3].isdigit():
        return ParsedKey("exit", parts[0], int(parts[3]), int(parts[2]))
    return None


@dataclass(frozen=True, slots=True)
class LearnerBeat:
    """What an agent publishes under its learner key."""

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
        ).encode()

    @classmethod
    def from_json(cls, value: bytes) -> LearnerBeat:
        raw = json.loads(value)
        return cls(
            attempt=int(raw["attempt"]),
            pid=raw.get("pid"),
            agent_pid=raw.get("agent_pid"),
            host=str(raw.get("host", "")),
            step=int(raw.get("step", 0)),
            metrics={str(k): float(v) for k, v in (raw.get("metrics") or {}).items()},
            last_progress=float(raw.get("last_progress", 0.0)),
            started_at=float(raw.get("started_at", 0.0)),
            checkpoint=raw.get("checkpoint"),
            workers={int(rank): int(step) for rank, step in (raw.get("workers") or {}).items()},
        )
