"""Halting: ask every learner to stop (SIGTERM: a learner checkpoints and exits; SIGKILL after the grace).

The job becomes HALTED when the monitor has seen every learner exit or vanish, so a halt never
loses the learners' last checkpoint to a race.
"""

from __future__ import annotations

from ffdl.core.job import Job
from ffdl.core.reconcile import Action
from ffdl.handlers.context import ReactionContext


async def stop_learners(job: Job, action: Action, ctx: ReactionContext) -> None:
    await ctx.launcher.stop(job.job_id, ctx.grace_s(job))
