"""Jobs: submit, list, show, cancel, delete, halt and resume.

A write answers with the log position of the event it caused once the projection has applied it;
one its owner decided to nothing (halting a halting job, deleting a deleted one) answers 200 with
the job as it is, ``position: null`` and ``changed: false``; one undecided when the wait ran out
answers (still 201/202) with the command's id; an illegal one answers 409 with the owner's reason,
and one its owner dead-letters the refusal with the dead letter's reason (403, 404, 413: see
:meth:`~ffdl.api.dependencies.PlatformBackend.dead_lettered`).
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from ffdl.adapters.tenants import Principal
from ffdl.api.dependencies import Backend, Caller, Manifest, PlatformBackend, problem, read
from ffdl.api.strict_json import StrictJSONResponse
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.core.tenancy import priority_problem
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import CommandData
from ffdl.events.model import label_problems
from ffdl.events.reports import loads_finite, strict_dumps

router = APIRouter()


async def write_job(
    backend: PlatformBackend,
    caller: Principal,
    job_id: str,
    tenant: str,
    data: CommandData,
    response: Response,
) -> dict[str, Any]:
    command = backend.platform.sender.make(JOBS.address(job_id, tenant), data)
    written = await backend.send_and_wait(command, caller)
    if not written.decided:
        return {"job_id": job_id, "state": None, "position": None, "command_id": written.command_id}
    if not written.changed:
        response.status_code = 200
    document = await read(backend.projection.get, job_id)
    state = document["state"] if document else None
    return {"job_id": job_id, "state": state, "position": written.position, "changed": written.changed}


@router.post("/v1/jobs", status_code=201)
async def submit(caller: Caller, spec: Manifest, backend: Backend, response: Response) -> dict[str, Any]:
    """Submit a job: JSON or YAML, our manifest or FfDL's. Answers once the job is on the log. A
    tenant's job may not have a priority above its ceiling (403 naming ``priority``)."""
    if not caller.admin:
        ceiling = backend.tenants.max_priority(caller.tenant)
        if above := priority_problem(caller.tenant, spec.priority, ceiling):
            raise problem(403, above, "priority")
    job_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
    return await write_job(backend, caller, job_id, caller.tenant, cmd.SubmitJob(spec=spec), response)


def _in_utc(moment: datetime | None) -> datetime | None:
    """The instant in UTC (a time without an offset is UTC). One that UTC cannot write (a time at
    the edge of year 1 or 9999 with an offset) is refused here, naming its field, not in the query."""
    if moment is None:
        return None
    try:
        return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("not a time UTC can write (years 1 to 9999)") from exc


UtcTime = Annotated[
    datetime | None, AfterValidator(_in_utc), Query(description="ISO 8601 time (no offset: UTC)")
]


@router.get("/v1/jobs", response_model=None)
async def list_jobs(
    caller: Caller,
    backend: Backend,
    state: Annotated[list[str] | None, Query(description="repeatable")] = None,
    tenant: Annotated[str | None, Query(description="admins only: another tenant's jobs")] = None,
    label: Annotated[str | None, Query(description="KEY=VALUE")] = None,
    submitted_since: UtcTime = None,
    submitted_until: UtcTime = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    order: Annotated[str, Query(pattern="^(newest|oldest)$")] = "newest",
    after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
) -> Response:
    await backend.wait_for(after)
    label_filter = None
    if label is not None:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise problem(422, "a label filter is KEY=VALUE", "label")
        if problems := label_problems({key: value}):  # a NUL in the key once made a 500
            raise problem(422, f"a label filter is KEY=VALUE of a label: {problems[0][1]}", "label")
        label_filter = (key, value)
    after_key = None
    if cursor:
        submitted_at, sep, last_id = cursor.partition("|")
        if not sep:
            raise problem(422, "malformed cursor: pass next_cursor back unchanged", "cursor")
        after_key = (submitted_at, last_id)
    if caller.admin:
        scope = tenant
    elif tenant is None or tenant == caller.tenant:
        scope = caller.tenant
    else:
        return JSONResponse({"jobs": [], "next_cursor": None})
    documents = await read(
        backend.projection.list_documents,
        tenant=scope,
        states=[s.upper() for s in state or []],
        label=label_filter,
        submitted_since=submitted_since,
        submitted_until=submitted_until,
        after=after_key,
        limit=limit,
        newest_first=order == "newest",
    )
    page = _within_page_bytes(documents)
    next_cursor = None
    if len(page) < len(documents) or len(documents) == limit:
        last = json.loads(page[-1])
        next_cursor = f"{last['submitted_at']}|{last['job_id']}"
    shown = await read(_as_shown, backend, caller, page)
    body = f'{{"jobs":[{",".join(shown)}],"next_cursor":{json.dumps(next_cursor)}}}'
    return Response(body, media_type="application/json")


#: About the most bytes of documents one page of ``GET /v1/jobs`` holds: beyond, it ends early and
#: ``next_cursor`` goes on (a job's document can be a megabyte: its labels, its learners).
PAGE_BYTES = 4 * 1024 * 1024


def _within_page_bytes(documents: list[str]) -> list[str]:
    """The first ``documents`` (at least one) that together stay within :data:`PAGE_BYTES`."""
    size = 0
    for count, document in enumerate(documents):
        size += len(document)
        if count and size > PAGE_BYTES:
            return documents[:count]
    return documents


def _as_shown(backend: PlatformBackend, caller: Principal, documents: list[str]) -> list[str]:
    """The stored documents as ``caller`` may see them, as JSON (blocking: for a worker thread)."""
    if not caller.admin:  # a tenant's documents are parsed: their reasons may name other tenants' jobs
        shown = backend.redacted_now(caller, [loads_finite(document) for document in documents])
        return [strict_dumps(document) for document in shown]
    # an admin's are JSON already: passed on without parsing and re-encoding each, unless one stored
    # by an older platform holds a non-finite number's token
    return [strict_dumps(loads_finite(d)) if _NON_FINITE.search(d) else d for d in documents]


#: The tokens Python's ``json`` writes for non-finite numbers (also inside strings: then a document
#: is re-encoded that needed none, which is harmless).
_NON_FINITE = re.compile(r"NaN|Infinity")


@router.get("/v1/jobs/{job_id}", response_model=None)
async def get_job(job_id: str, caller: Caller, backend: Backend, after: str | None = None) -> JSONResponse:
    """The job with learners (placement, heartbeat), attempts, checkpoints, state times and reasons."""
    await backend.wait_for(after)
    document = await backend.visible_job(job_id, caller)
    alive = await backend.heartbeats.of(job_id) if not JobState(document["state"]).terminal else {}
    for learner in document["learners"]:
        learner["heartbeat"] = alive.get(learner["rank"], {"alive": False})
    return StrictJSONResponse(await backend.redacted(caller, document))


@router.delete("/v1/jobs/{job_id}", status_code=202, responses={409: {"description": "the job has ended"}})
async def cancel(job_id: str, caller: Caller, backend: Backend, response: Response) -> dict[str, Any]:
    """Cancel a live job: its learners stop and its GPUs are freed. A job that has ended has nothing
    left to cancel (409): removing it from the listings is ``POST /v1/jobs/{id}:delete``, a separate
    call, so that cancelling twice never makes a job disappear."""
    document = await backend.visible_job(job_id, caller)
    state = JobState(document["state"])
    if state.terminal:
        raise problem(
            409,
            f"{job_id} has ended ({state}): there is nothing to cancel; "
            f"`ffdl delete {job_id}` (POST /v1/jobs/{job_id}:delete) removes it from the listings",
            "state",
        )
    return await write_job(
        backend,
        caller,
        job_id,
        document["tenant"],
        cmd.CancelJob(reason="cancelled through the API"),
        response,
    )


@router.post("/v1/jobs/{job_id}:delete", status_code=202, responses={409: {"description": "the job is live"}})
async def delete(job_id: str, caller: Caller, backend: Backend, response: Response) -> dict[str, Any]:
    """Remove an ended job from the listings (its events stay on the log, ``ffdl replay`` reads them).
    A live job is refused (409): cancel it first."""
    document = await backend.visible_job(job_id, caller)
    return await write_job(backend, caller, job_id, document["tenant"], cmd.DeleteJob(), response)


@router.post("/v1/jobs/{job_id}:halt", status_code=202)
async def halt(job_id: str, caller: Caller, backend: Backend, response: Response) -> dict[str, Any]:
    """Halt a job: its learners checkpoint and stop; it resumes later from that checkpoint. The job's
    owner decides: halting a job halted already, or halting already on request, changes nothing (200,
    ``changed: false``); halting one that halts for a preemption keeps it from queueing again."""
    document = await backend.visible_job(job_id, caller)
    return await write_job(
        backend, caller, job_id, document["tenant"], cmd.HaltJob(reason="halted through the API"), response
    )


@router.post("/v1/jobs/{job_id}:resume", status_code=202)
async def resume(job_id: str, caller: Caller, backend: Backend, response: Response) -> dict[str, Any]:
    """Resume a halted job from its last checkpoint (the job's owner refuses other states: 409)."""
    document = await backend.visible_job(job_id, caller)
    return await write_job(backend, caller, job_id, document["tenant"], cmd.ResumeJob(), response)
