"""Storing: every learner exited 0; record what the job left in its result place, then complete it.

The platform records results, it does not move them: the summary counts files and bytes in the
result directory (when it is a local path) and keeps the learners' final metrics.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ffdl.core.job import Job
from ffdl.core.reconcile import Action
from ffdl.events import job_commands as cmd
from ffdl.events.model import ResultSummary
from ffdl.handlers.context import ReactionContext


def _measure(directory: Path) -> tuple[int, int]:
    files = [p for p in directory.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


async def store_results(job: Job, action: Action, ctx: ReactionContext) -> None:
    directory = Path(job.spec.result_dir) if job.spec.result_dir else ctx.result_dir(job.job_id)
    files = size = 0
    if directory is not None and directory.is_dir():
        files, size = await asyncio.to_thread(_measure, directory)
    metrics: dict[str, float] = {}
    for learner in reversed(job.learners):  # rank 0's metrics win
        metrics.update(dict(learner.metrics))
    summary = ResultSummary(
        result_dir=str(directory) if directory else None, files=files, size_bytes=size, metrics=metrics
    )
    await ctx.send(job, action, cmd.FinishStoring(result=summary))
