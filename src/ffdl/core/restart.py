"""The restart policy: how long to wait before relaunching a gang, and when to give up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Exponential backoff: ``base_s * factor ** restarts_so_far``, capped at ``max_backoff_s``.

    The number of restarts a job may take is its manifest's ``max_restarts``; this policy only
    spaces them out so a crash-looping learner does not hammer the cluster.
    """

    base_s: float = 1.0
    factor: float = 2.0
    max_backoff_s: float = 60.0

    def backoff(self, restarts_so_far: int) -> float:
        return float(min(self.max_backoff_s, self.base_s * self.factor**restarts_so_far))
