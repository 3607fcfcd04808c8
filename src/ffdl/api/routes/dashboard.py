"""The dashboard: a page served at ``/`` with its static files, and the reads only it needs.

The page is plain ES modules and vendored libraries under ``api/dashboard/static`` (no build step);
it talks to the API like any client, with the tenant's bearer token it keeps in the tab's session
storage. Its own reads follow the API's tenancy: a tenant sees its jobs, others' GPUs as 'other'.

* ``/v1/whoami``: who the token is (and whether the platform runs open), for the sign-in.
* ``/v1/jobs:follow``: Server-Sent Events of the jobs that change, as their documents, so the job
  list stays live without polling; ``id:`` is a cursor over the projection's changes.
* ``/v1/cluster:follow``: Server-Sent Events that say the cluster changed (a job or a node did),
  so the cluster page reads its picture again when there is something new, a cordon included.
* ``/v1/timemachine?at=TIME``: the cluster as it was at TIME, folded from the events (as the
  projection keeps them) with the fold of ``ffdl replay --cluster``, with the utilisation over the
  log's span and the tenants' shares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import FileResponse, StreamingResponse

from ffdl.adapters.tenants import Principal
from ffdl.api.dependencies import (
    MAX_OFFSET,
    Backend,
    Caller,
    PlatformBackend,
    event_id,
    principal,
    problem,
    read,
)
from ffdl.api.followers import KEEP_ALIVE_S
from ffdl.events.reports import strict_dumps
from ffdl.projections.store import KeptLogChanged
from ffdl.projections.timemachine import hide_others, kept_picture, tenant_rows

#: of how many distinct moments one tenant's time-machine requests may wait for, or be in, a fold
FOLDS_WAITING_PER_TENANT = 2

router = APIRouter()

STATIC = Path(__file__).resolve().parent.parent / "dashboard" / "static"
#: Jobs per Server-Sent Event batch of the job list, at most.
FOLLOW_BATCH = 500


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/ui/{name:path}", include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    """A file of the page (its modules, styles and vendored libraries); nothing outside them."""
    if "\0" in name:  # no path holds one, and resolving one raises
        raise problem(404, f"no file {name!r}", "name")
    path = (STATIC / name).resolve()
    if not path.is_relative_to(STATIC) or not path.is_file():
        raise problem(404, f"no file {name}", "name")
    return FileResponse(path, headers={"Cache-Control": "no-cache"})


@router.get("/v1/whoami")
async def whoami(request: Request, backend: Backend) -> dict[str, Any]:
    """Whether the platform runs open (no tenants) and, for a valid token, its tenant and whether an
    admin (``tenant`` None without one: the page asks for a token without a failed request)."""
    try:
        caller = await principal(request)
    except HTTPException:
        return {"tenant": None, "admin": False, "open": False}
    return {"tenant": caller.tenant, "admin": caller.admin, "open": backend.tenants.open}


@router.get("/v1/jobs:follow", response_model=None)
async def follow_jobs(
    request: Request,
    caller: Caller,
    backend: Backend,
    after: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = -1,
    last_event_id: Annotated[str | None, Header(description="the id: of the last event read")] = None,
) -> StreamingResponse:
    """Server-Sent Events (``event: jobs``) of the caller's jobs as they change: ``{"jobs": [...],
    "gone": [...]}`` (``gone``: the caller's jobs deleted from the listings). From now on by default;
    resumable with ``Last-Event-ID`` or ``after``."""
    start = event_id(last_event_id, "Last-Event-ID") if last_event_id else after
    if start < 0:
        start = await read(backend.projection.last_change)
    backend.followers.admit(caller.tenant)
    return backend.followers.stream(
        caller.tenant,
        _job_changes(request, backend, caller, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _job_changes(
    request: Request, backend: PlatformBackend, caller: Principal, cursor: int
) -> AsyncIterator[bytes]:
    yield f"id: {cursor}\nevent: ready\ndata: {{}}\n\n".encode()
    while not await request.is_disconnected():
        version = backend.progress.version()
        scope = None if caller.admin else caller.tenant
        cursor_after, mine, gone = await read(backend.projection.changed_jobs, cursor, FOLLOW_BATCH, scope)
        if cursor_after == cursor:
            yield b": keep-alive\n\n"
            await backend.progress.wait_for_change(version, KEEP_ALIVE_S)
            continue
        cursor = cursor_after
        mine_gone = [job_id for job_id, tenant in gone.items() if caller.may_see(tenant)]
        if mine or mine_gone:
            data = await read(_changes_payload, backend, caller, mine, mine_gone)
            yield f"id: {cursor}\nevent: jobs\ndata: {data}\n\n".encode()


def _changes_payload(
    backend: PlatformBackend, caller: Principal, documents: list[tuple[str, str]], gone: list[str]
) -> str:
    """A batch of changes as ``caller`` may see it, as JSON (blocking: for a worker thread, so that
    a big document changing often is not walked on the event loop, and once for all the followers
    of a tenant: :meth:`PlatformBackend.shown_document`)."""
    jobs = ",".join(backend.shown_document(caller, job_id, stored) for job_id, stored in documents)
    return f'{{"jobs":[{jobs}],"gone":{strict_dumps(gone)}}}'


@router.get("/v1/cluster:follow", response_model=None)
async def follow_cluster(request: Request, caller: Caller, backend: Backend) -> StreamingResponse:
    """Server-Sent Events (``event: cluster``, no data) each time a job or a node changed, from now
    on: the page then reads ``/v1/timemachine``, which answers as the caller may see it. The signal
    tells a tenant no more than that GPU map does."""
    backend.followers.admit(caller.tenant)
    return backend.followers.stream(
        caller.tenant,
        _cluster_changes(request, backend),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _cluster_changes(request: Request, backend: PlatformBackend) -> AsyncIterator[bytes]:
    seen = await read(backend.projection.cluster_change)
    yield b"event: ready\ndata: {}\n\n"
    while not await request.is_disconnected():
        version = backend.progress.version()
        now = await read(backend.projection.cluster_change)
        if now == seen:
            yield b": keep-alive\n\n"
            await backend.progress.wait_for_change(version, KEEP_ALIVE_S)
            continue
        seen = now
        yield b"event: cluster\ndata: {}\n\n"


@router.get("/v1/timemachine")
async def timemachine(
    caller: Caller,
    backend: Backend,
    at: Annotated[str | None, Query(description="ISO 8601 time; default: the end of the log")] = None,
) -> dict[str, Any]:
    """The cluster at ``at`` folded from the log: nodes with who held each GPU (another tenant's as
    'other'), the queue, every job's state, the tenants' quotas and shares, the utilisation over the
    log's span, and the events either side of the moment to step to."""
    moment: datetime | None = None
    if at:  # an instant without an offset is UTC, as the SRE tools read it
        try:
            moment = datetime.fromisoformat(at)
        except ValueError as exc:
            raise problem(422, f"not an ISO 8601 time: {at!r}", "at") from exc
        moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    def fold() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        # the kept log and the present are the API's, changed in place: one thread at a time, even
        # one whose request was cancelled meanwhile (the asyncio lock is then free, not the thread)
        with backend.fold_lock:
            try:
                # the log's new events folded on; a past moment from the last copy kept before it
                return kept_picture(backend.kept_log, backend.at_end, moment)
            except KeptLogChanged as exc:  # replaced again while it was read afresh
                rebuilt = "the projection is being rebuilt: ask again"
                raise problem(503, rebuilt, headers={"Retry-After": "1"}) from exc

    # A fold of a past moment folds thousands of events (it once folded the whole log): callers take
    # turns, so that any tenant asking again and again costs the API one fold's CPU at a time, not
    # one per request, and the same moment of an unchanged log is folded once. A tenant has folds
    # of at most a few moments waiting (another moment is refused with 429): one asking for a new
    # moment each time, many at once, kept every other tenant's time machine waiting behind a queue
    # of its folds. What is kept is the whole picture; each caller is shown its own view of it below.
    waiting = backend.folds_waiting.setdefault(caller.tenant, Counter())
    if moment not in waiting and len(waiting) >= FOLDS_WAITING_PER_TENANT:
        raise problem(
            429,
            f"time-machine folds of {len(waiting)} other moments are under way for tenant "
            f"{caller.tenant}: ask again when one has answered",
            headers={"Retry-After": "1"},
        )
    waiting[moment] += 1
    try:
        async with backend.folding:
            version = backend.projection.version()  # None: not known now, so nothing kept is trusted
            key = (version, moment)
            if version is not None and backend.folded is not None and backend.folded[0] == key:
                picture, series = backend.folded[1]
            else:
                picture, series = await read(fold)
                backend.folded = (key, (picture, series))
    finally:
        waiting[moment] -= 1
        if not waiting[moment]:
            del waiting[moment]
        if not waiting:
            backend.folds_waiting.pop(caller.tenant, None)
    tenants = tenant_rows(picture, backend.settings.scheduler_policy().tenancy)
    seen = hide_others(picture, caller.may_see)
    seen["tenants"] = [row for row in tenants if caller.may_see(row["tenant"])]
    seen["utilisation"] = [
        {
            "at": point["at"],
            "gpus": point["gpus"],
            "mine": sum(n for t, n in point["held"].items() if caller.may_see(t)),
            "other": sum(n for t, n in point["held"].items() if not caller.may_see(t)),
        }
        for point in series
    ]
    return await backend.redacted(caller, seen)
