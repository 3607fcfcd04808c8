"""The progress of a learner's local workers, each kept apart (architecture §6a).

Under ``launcher: torchrun`` one learner runs ``nproc_per_node`` worker processes, and each reports
through :mod:`ffdl.learner` with its ``LOCAL_RANK`` (the report's ``local_rank``). Mixing their
reports into one learner's (the step of whichever reported last) would make the learner's step jump
back and forth. Each worker's step is kept under its global rank (``node_rank * nproc_per_node +
local_rank``, as torchrun numbers it), and the learner's step is the *lowest* among the workers
that report: data-parallel workers move in lock step, and a checkpoint or a restart can only count
on what every one of them reached. Metrics keep their latest value whichever worker sent them
(a learner's metrics are usually its rank 0's: the others often report none).
"""

from __future__ import annotations

from collections.abc import Mapping

LOCAL_WORLD_SIZE_VARIABLE = "LOCAL_WORLD_SIZE"


class WorkerSteps:
    """Each local worker's latest step; see the module docstring."""

    def __init__(self, node_rank: int, workers: int) -> None:
        self._node_rank = node_rank
        self._workers = max(workers, 1)
        self._steps: dict[int, int] = {}

    @classmethod
    def from_environment(cls, environment: Mapping[str, str], node_rank: int) -> WorkerSteps:
        workers = environment.get(LOCAL_WORLD_SIZE_VARIABLE, "")
        return cls(node_rank, int(workers) if workers.isdigit() else 1)

    def report(self, local_rank: object, step: int) -> int:
        """Note ``step`` of the worker ``local_rank`` (None or out of range: the learner's only
        worker, local rank 0); the learner's step now."""
        local = local_rank if isinstance(local_rank, int) and 0 <= local_rank < self._workers else 0
        self._steps[local] = step
        return min(self._steps.values())

    @property
    def by_rank(self) -> dict[int, int]:
        """Each reporting worker's step by its global rank (empty for a learner of one worker)."""
        if self._workers == 1:
            return {}
        return {self._node_rank * self._workers + local: step for local, step in sorted(self._steps.items())}
