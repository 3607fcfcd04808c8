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
from ffdl.events.model import Checkpoint, LossReason
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.heartbeat_keys import exit_key, exits_prefix, parse_exit, recorded_checkpoint
from ffdl.handlers.ports import LaunchRequest, StoreUnavailable

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
            rank=0, attempt=job.attempt, reason=LossReason.VANISHED, detail=f"launch failed: {exc}"
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
    records (each names the last checkpoint its agent knew of) and sends those checkpoints in the
    same append, before the ``BeginLaunch``; the owner records each that is new and inside the job's
    checkpoint place, as it does the monitor's. A record already deleted was spent by the monitor,
    which deletes one only once the reports queued before are sent, so its checkpoint is on the
    log already. A store that does not answer leaves only the monitor's reports, as before."""
    await ctx.launcher.stop(job.job_id, ctx.grace_s(job))
    log.info("relaunching after backoff", job_id=job.job_id, attempt=action.attempt, backoff_s=action.delay_s)
    await asyncio.sleep(action.delay_s)
    saved = await _saved_on_the_way_out(job, action.attempt - 1, ctx)
    reports = [
        (f"checkpoint/{checkpoint.rank}", cmd.ReportCheckpoint(checkpoint=checkpoint)) for checkpoint in saved
    ]
    await ctx.send_parts(job, action, [*reports, ("", cmd.BeginLaunch(attempt=action.attempt))])


async def _saved_on_the_way_out(job: Job, attempt: int, ctx: ReactionContext) -> list[Checkpoint]:
    """The checkpoints the exit records of ``attempt``'s learners name, by rank (hostile input: only
    the job's ranks, each record bounded and checked as the monitor checks it)."""
    if ctx.heartbeats is None or attempt < 1:
        return []
    try:
        snapshot = await ctx.heartbeats.snapshot(exits_prefix(job.job_id, attempt))
    except (StoreUnavailable, TimeoutError) as exc:
        log.warning(
            "exit records unreadable: relaunching with the checkpoints reported so far",
            job_id=job.job_id,
            attempt=attempt,
            error=str(exc) or type(exc).__name__,
        )
        return []
    saved: list[Checkpoint] = []
    for rank in range(job.spec.learners):
        value = snapshot.values.get(exit_key(job.job_id, attempt, rank))
        if value is None:
            continue
        try:
            named = parse_exit(value).checkpoint
            if named:
                saved.append(recorded_checkpoint(named, rank, attempt))
        except ValueError as exc:
            log.warning(
                "unreadable exit record", job_id=job.job_id, attempt=attempt, rank=rank, error=str(exc)
            )
    return saved
