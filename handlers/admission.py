"""Admission: a submitted job queues if its gang could ever fit the cluster, else it is rejected.

FfDL queued whatever it was given, so a job asking for more GPUs than any node has waited
forever; here it fails at once with the reason.
"""

from __future__ import annotations

from ffdl.core.allocator import could_ever_fit
from ffdl.core.job import Job
from ffdl.core.reconcile import Action
from ffdl.events import commands as cmd
from ffdl.events.model import ErrorCode
from ffdl.handlers.context import ReactionContext


async def admit(job: Job, action: Action, ctx: ReactionContext) -> None:
    nodes = list(ctx.inventory())
    if could_ever_fit(job.spec, nodes):
        await ctx.send(job, action, cmd.AdmitJob())
        return
    spec = job.spec
    largest = max((n.gpus for n in nodes if spec.gpu_type in (None, n.gpu_type)), default=0)
    gpu_type = f" of type {spec.gpu_type}" if spec.gpu_type else ""
    reason = (
        f"{spec.learners} learner(s) x {spec.gpus} GPU(s){gpu_type} with {spec.cpus} CPUs and "
        f"{spec.memory_mb} MB each can never fit this cluster ({len(nodes)} node(s), "
        f"at most {largest} matching GPUs on one node)"
    )
    await ctx.send(job, action, cmd.RejectJob(code=ErrorCode.UNSCHEDULABLE, reason=reason))
