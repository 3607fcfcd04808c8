"""The cluster as the scheduler sees it: the present nodes and who holds their GPUs, the queues in
the scheduler's order, and why a job is pending. Jobs of other tenants are shown as 'other' in the
GPU map, and as "another tenant's job" in reasons."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ffdl.adapters.tenants import Principal
from ffdl.api.dependencies import Backend, Caller, PlatformBackend, problem, read
from ffdl.core.nodes import NodeStatus

router = APIRouter()


async def gpu_holders(backend: PlatformBackend, caller: Principal) -> dict[str, dict[str, str]]:
    """Per node, which job holds each GPU (index as text -> job id; another tenant's is 'other')."""
    holders: dict[str, dict[str, str]] = {}
    for job in await read(backend.projection.holdings):
        holder = job["job_id"] if caller.may_see(job["tenant"]) else "other"
        for learner in job["placement"]:
            for gpu in learner["gpus"]:
                holders.setdefault(learner["node"], {})[str(gpu)] = holder
    return holders


@router.get("/v1/jobs/{job_id}/why")
async def why(job_id: str, caller: Caller, backend: Backend, after: str | None = None) -> dict[str, Any]:
    """Why the job is pending: the scheduler's reason, its queue position and what it waits for."""
    await backend.wait_for(after)
    await backend.visible_job(job_id, caller)
    answer = await read(backend.projection.why, job_id)
    if answer is None:  # deleted since it was looked up
        raise problem(404, f"no job {job_id}", "job_id")
    return await backend.redacted(caller, answer)


@router.get("/v1/cluster")
async def cluster(caller: Caller, backend: Backend) -> dict[str, Any]:
    """The present nodes (ready, cordoned or draining), their GPUs and which job holds each (jobs
    of other tenants are shown as 'other')."""
    holders = await gpu_holders(backend, caller)
    nodes: list[dict[str, Any]] = [
        {
            "name": node["name"],
            "status": node["status"],
            "gpu_type": node["gpu_type"],
            "gpus": node["gpus"],
            "cpus": node["cpus"],
            "memory_mb": node["memory_mb"],
            "schedulable": node["status"] == NodeStatus.READY,
            "allocated": holders.get(node["name"], {}),
        }
        for node in await read(backend.projection.nodes)
        if NodeStatus(node["status"]).present
    ]
    total = sum(int(n["gpus"]) for n in nodes)
    used = sum(len(n["allocated"]) for n in nodes)
    return {"nodes": nodes, "gpus_total": total, "gpus_allocated": used}


@router.get("/v1/queues")
async def queues(caller: Caller, backend: Backend) -> dict[str, Any]:
    """Queued jobs per tenant, each with its position in the scheduler's order."""
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for position, job in enumerate(await read(backend.projection.queue), start=1):
        if not caller.may_see(job["tenant"]):
            continue
        by_tenant.setdefault(job["tenant"], []).append(
            {
                "job_id": job["job_id"],
                "position": position,
                "priority": job["spec"]["priority"],
                "learners": job["spec"]["learners"],
                "gpus": job["spec"]["gpus"],
                "reason": job["reason"],
            }
        )
    shown = await backend.redacted(caller, by_tenant)
    return {"queues": shown, "length": sum(len(q) for q in by_tenant.values())}
