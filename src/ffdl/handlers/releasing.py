"""Releasing: once a job halted or ended, stop whatever learner is left, then free its GPUs.

GPUs are freed only after an observed terminal or halted event and only once the learners are
gone, so no GPU is ever used by two jobs' processes (architecture §5).
"""

from __future__ import annotations

from ffdl.core.job import Job
from ffdl.core.reconcile import Action
from ffdl.events import job_commands as cmd
from ffdl.handlers.context import ReactionContext


async def release_gpus(job: Job, action: Action, ctx: ReactionContext) -> None:
    await ctx.launcher.stop(job.job_id, ctx.grace_s(job))
    await ctx.send(job, action, cmd.ReleaseGpus())
