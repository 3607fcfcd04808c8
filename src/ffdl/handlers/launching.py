"""Launching: start an attempt's learners, relaunch after a failure.

The owner begins an attempt in the same decision that gives the job its GPUs, so a launch needs no
command of ours; a relaunch asks for the next attempt with ``BeginLaunch`` once the backoff is over,
and so does a job that an older owner left in SCHEDULED (allocated, not yet launching).
"""

from __future__ import annotations

import asyncio

import structlog

from ffdl.core.job import Job
from ffdl.core.reconcile import Action
from ffdl.events import job_commands as cmd
from ffdl.events.job_events import within_reason
from ffdl.events.model import LossReason
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.exit_records import saved_on_the_way_out
from ffdl.handlers.ports import LaunchRequest

log = structlog.get_logger(__name__)


async def begin_launch(job: Job, action: Action, ctx: ReactionContext) -> None:
    await ctx.send(job, action, cmd.BeginLaunch(attempt=action.attempt))


async def launch(job: Job, action: Action, ctx: ReactionContext) -> None:
    assert job.placement is not None  # LAUNCHING always holds a placement
    request = LaunchRequest(
        job_id=job.job_id,
        tenant=job.tenant,
        attempt=job.attempt,
        spec=job.spec,
        placement=job.placement,
        resume_from=job.resume_from,
        env=ctx.learner_env,
    )
    try:
        _check_resume_point(job, ctx)
        await ctx.launcher.launch(request)
    except Exception as exc:
        log.exception("launch failed", job_id=job.job_id, tenant=job.tenant, attempt=job.attempt)
        lost = cmd.ReportLearnerLost(
            rank=0,
            attempt=job.attempt,
            reason=LossReason.VANISHED,
            detail=within_reason(f"launch failed: {exc}"),
        )
        await ctx.send(job, action, lost)
        return
    log.info("learners launched", job_id=job.job_id, attempt=job.attempt, learners=job.spec.learners)


def _check_resume_point(job: Job, ctx: ReactionContext) -> None:
    """Refuse (ValueError) to launch from a checkpoint outside the job's checkpoint place.

    Today's owner never resumes from one (it records none), but an older platform believed any
    checkpoint a learner reported, and its ``JobLaunching`` may name one another tenant planted.
    The launch then fails, and the restart that follows starts from the latest checkpoint inside.
    """
    if job.resume_from is None or ctx.checkpoints is None:
        return
    refusal = ctx.checkpoints.problem(job.job_id, job.resume_from.uri)
    if refusal:
        raise ValueError(f"resume point {job.resume_from.uri!r:.300} refused: {refusal}")


async def relaunch(job: Job, action: Action, ctx: ReactionContext) -> None:
    """Stop the failed gang, wait out the backoff, then ask for the next attempt.

    The ranks that outlived the failed one may save a checkpoint on their way out (a SIGTERM
    handler, the agent's final scan), and a program that resumes from its newest file loads that
    one, so the attempt must name it. The monitor reports it, but as another producer: its report
    and this ``BeginLaunch`` have no fixed order on the job's partition, and the owner decides the
    resume point when the ``BeginLaunch`` comes. So the relaunch reads the stopped ranks' exit
    records and sends the checkpoints they name in the same append, before the ``BeginLaunch``
    (:mod:`ffdl.handlers.exit_records`)."""
    await ctx.launcher.stop(job.job_id, ctx.grace_s(job))
    log.info("relaunching after backoff", job_id=job.job_id, attempt=action.attempt, backoff_s=action.delay_s)
    await asyncio.sleep(action.delay_s)
    stopped = action.attempt - 1
    saved = (
        await saved_on_the_way_out(ctx.heartbeats, job.job_id, stopped, range(job.spec.learners))
        if ctx.heartbeats is not None and stopped >= 1
        else []
    )
    reports = [
        (f"checkpoint/{checkpoint.rank}", cmd.ReportCheckpoint(checkpoint=checkpoint))
        for checkpoint in saved or ()
    ]
    await ctx.send_parts(job, action, [*reports, ("", cmd.BeginLaunch(attempt=action.attempt))])
