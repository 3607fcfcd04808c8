"""The read side's view of a job and of a node: one JSON document each, a pure function of its
folded state.

Everything here is deterministic (sorted keys, times from events, never the clock), so a
projection rebuilt from the log is byte-for-byte the live one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ffdl.core.allocator import Node
from ffdl.core.cluster import MILLI_GPUS, Charges, Demand, Gang, HeldJob
from ffdl.core.job import Job
from ffdl.core.nodes import NodeRecord, NodeStatus
from ffdl.events.model import JobSpec
from ffdl.events.reports import strict_dumps

JsonObject = dict[str, Any]


def job_document(job: Job) -> JsonObject:
    spec = job.spec
    return {
        "job_id": job.job_id,
        "tenant": job.tenant,
        "name": spec.name,
        "state": str(job.state),
        "seq": job.seq,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "submitted_at": job.submitted_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "reason": job.reason,
        "failure_code": str(job.failure_code) if job.failure_code else None,
        "spec": spec.model_dump(mode="json"),
        "placement": job.placement.model_dump(mode="json")["learners"] if job.placement else None,
        "learners": [
            {
                "rank": learner.rank,
                "status": str(learner.status),
                "node": learner.node,
                "gpus": list(learner.gpus),
                "pid": learner.pid,
                "host": learner.host,
                "step": learner.step,
                "metrics": dict(learner.metrics),
                "last_progress_at": learner.last_progress_at.isoformat()
                if learner.last_progress_at
                else None,
                "exit_code": learner.exit_code,
                "lost_reason": learner.lost_reason or None,
            }
            for learner in job.learners
        ],
        "checkpoints": [c.model_dump(mode="json") for c in job.checkpoints],
        "latest_checkpoint": job.latest_checkpoint.model_dump(mode="json") if job.latest_checkpoint else None,
        "history": [
            {"state": str(entry.state), "at": entry.at.isoformat(), "reason": entry.reason, "seq": entry.seq}
            for entry in job.history
        ],
        "result": job.result.model_dump(mode="json") if job.result else None,
        "waiting": _waiting(job),
    }


def _waiting(job: Job) -> JsonObject | None:
    """The scheduler's recorded reason why the queued job does not run yet (None if none)."""
    if job.waiting is None:
        return None
    return {
        "code": str(job.waiting.code),
        "detail": job.waiting.detail,
        "waiting_for": list(job.waiting.waiting_for),
        "reserved_nodes": list(job.waiting.reserved_nodes),
        "since": job.waiting_since.isoformat() if job.waiting_since else None,
    }


def node_document(node: NodeRecord) -> JsonObject:
    cordon = node.cordon
    return {
        "name": node.name,
        "status": str(node.status),
        "seq": node.seq,
        **node.spec.model_dump(mode="json"),
        "cordon": {"reason": cordon.reason, "source": str(cordon.source), "drain": cordon.drain}
        if cordon
        else None,
        "reason": node.reason,
        "since": node.since.isoformat(),
    }


def charges_on(nodes: Iterable[JsonObject]) -> Charges:
    """What jobs count against their tenants on the present nodes among ``nodes`` (node documents),
    as the scheduler counts it (:class:`~ffdl.core.cluster.Charges`)."""
    present = {str(status) for status in NodeStatus if status.present}
    return Charges(
        Node(node["name"], node["gpus"], node["gpu_type"], node["cpus"], node["memory_mb"])
        for node in nodes
        if node["status"] in present
    )


def counts_as_gpus(job: JsonObject, charges: Charges) -> float:
    """What a job document's placement counts against its tenant, in GPU-equivalents, as the
    scheduler counts it (every job with a placement holds it): a job asking much CPU or memory per
    GPU counts more than its GPUs, one without GPUs what it takes from gangs; 0 if it holds nothing.
    The demand is read from the stored spec's fields, not validated again: a document stored under
    looser rules than today's must not fail every read of its tenant."""
    placement = job["placement"]
    if placement is None:
        return 0.0
    demand = Demand.of(JobSpec.model_construct(**job["spec"]))  # the defaults for fields it lacks
    gang = Gang(tuple((learner["node"], tuple(learner["gpus"])) for learner in placement))
    return charges.held_charge(HeldJob(job["job_id"], job["tenant"], demand, 0, gang, 0.0)) / MILLI_GPUS


def why_summary(answer: JsonObject) -> str:
    """One sentence for ``ffdl why``: what the job waits for, or where it stands if it waits no more."""
    job_id, state = answer["job_id"], answer["state"]
    if state != "QUEUED":
        return f"{job_id} is {state}: {answer['reason'] or 'no reason recorded'}"
    place = f"position {answer['position']} of {answer['queue_length']} in the queue"
    waiting = answer["waiting"]
    if waiting is None:
        return f"{job_id} is queued ({place}); the scheduler has not weighed it yet"
    text = f"{job_id} waits ({waiting['code']}, {place}): {waiting['detail']}"
    if waiting["waiting_for"]:
        text += f"; waiting for {', '.join(waiting['waiting_for'])}"
    return text


def dumps(document: JsonObject) -> str:
    """A document as the projection stores it: a non-finite number (only an old log's events can
    hold one) is stored as null, so every reader gets JSON a strict parser accepts."""
    return strict_dumps(document, sort_keys=True, separators=(",", ":"))
