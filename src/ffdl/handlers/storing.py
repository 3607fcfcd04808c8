"""Storing: every learner exited 0; record what the job left in its result place, then complete it
and free its GPUs.

The release goes with the completion, in one append: STORING means every learner exited, and what
is left of them (a pod object) is stopped first, so nothing learnt between the completion and the
release would change it (architecture §5: GPUs are freed once the job has ended and its learners
are gone; the owner frees them only for a job ended by then, the completion just before). A lifecycle
saves the hop the reactor took to see the completion before it asked for the release.

The platform records results, it does not move them: the summary counts files and bytes in the
result directory (when it is a local path) and keeps the learners' final metrics.

The result place comes from the job's manifest, so it is measured only where it may be (see
:mod:`ffdl.core.places`): inside the job's own directory or under a configured result root, checked
again here after resolving links (a learner may have made its result directory a link to ``/``).
The walk never follows links, keeps its own stack (however deep the directories) and stops after
:data:`MAX_FILES` entries.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from stat import S_ISDIR, S_ISREG

import structlog

from ffdl.core.job import Job
from ffdl.core.places import is_uri, within
from ffdl.core.reconcile import Action
from ffdl.events import job_commands as cmd
from ffdl.events.model import ResultSummary
from ffdl.events.reports import bound_metrics
from ffdl.handlers.context import ReactionContext

log = structlog.get_logger(__name__)

#: The most directory entries one measurement looks at.
MAX_FILES = 100_000


def _local_place(job: Job, ctx: ReactionContext) -> Path | None:
    """The local directory the job's results are in (None: a URI, or no job directory here)."""
    place = job.spec.result_dir
    job_dir = ctx.job_dir(job.job_id)
    if place is None:
        return job_dir / "results" if job_dir is not None else None
    if is_uri(place):
        return None
    path = Path(place)
    if path.is_absolute():
        return path
    # a relative place is where the learner finds it: under its working directory, ``work/`` of the
    # job's directory (the local launcher's layout), since RESULT_DIR reaches the learner as written
    return job_dir / "work" / path if job_dir is not None else None


def _confined(directory: Path, job: Job, ctx: ReactionContext) -> bool:
    """Whether ``directory``, links resolved, lies in the job's directory or under a result root."""
    job_dir = ctx.job_dir(job.job_id)
    allowed = [root.resolve() for root in ctx.result_roots]
    if job_dir is not None:
        allowed.append(job_dir.resolve())
    return within(directory.resolve(), allowed)


def _measure(directory: Path) -> tuple[int, int]:
    """Regular files and their bytes below ``directory``: links not followed, :data:`MAX_FILES`
    entries (directories too) at most. The walk keeps its own stack: ``os.walk`` recurses, and a
    learner's 1500 nested directories made it raise ``RecursionError`` in the storing reaction. Each
    directory is read as it is walked, not listed whole first: a listing of millions of entries
    (one directory a learner filled) cost the platform's memory before the bound was reached."""
    files = size = seen = 0
    pending = [str(directory)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_FILES:
                        return files, size
                    try:
                        stat = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if S_ISDIR(stat.st_mode):
                        pending.append(entry.path)
                    elif S_ISREG(stat.st_mode):  # a regular file, never what a link points to
                        files += 1
                        size += stat.st_size
        except OSError:
            continue  # gone, unreadable, or a path too long to name
    return files, size


async def store_results(job: Job, action: Action, ctx: ReactionContext) -> None:
    directory = _local_place(job, ctx)
    files = size = 0
    if directory is not None and directory.is_dir():
        if await asyncio.to_thread(_confined, directory, job, ctx):
            files, size = await asyncio.to_thread(_measure, directory)
        else:
            log.warning(
                "result place outside the job's directory and the result roots: not measured",
                job_id=job.job_id,
                result_dir=str(directory),
            )
    metrics: dict[str, float] = {}
    for learner in reversed(job.learners):  # rank 0's metrics win
        metrics.update(dict(learner.metrics))
    shown = str(directory) if directory is not None else job.spec.result_dir
    # each learner's metrics are inside the bounds; all of them together need not be
    bounded = bound_metrics(metrics).metrics
    summary = ResultSummary(result_dir=shown, files=files, size_bytes=size, metrics=bounded)
    await ctx.launcher.stop(job.job_id, ctx.grace_s(job))
    await ctx.send(job, action, cmd.FinishStoring(result=summary), cmd.ReleaseGpus())
