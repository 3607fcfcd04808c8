"""A job's events: its history, or with ``follow=true`` Server-Sent Events.

The stream's ``id:`` is the event's seq, so a client resumes with ``Last-Event-ID``. Each follower
reads the projection at its own pace (nothing is buffered per client), and a follower that goes
away is noticed and its stream closed; the open streams are capped in all and per tenant
(:mod:`ffdl.api.followers`). A tenant sees the events' reasons redacted like the job's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ffdl.adapters.tenants import Principal
from ffdl.api.dependencies import MAX_OFFSET, Backend, Caller, PlatformBackend, event_id, read
from ffdl.api.followers import KEEP_ALIVE_S
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events.reports import strict_dumps

router = APIRouter()

#: Events a follower reads at a time.
FOLLOW_BATCH = 200
#: The most events one page of a job's history holds: a tenant can grow its own job's history
#: without end (refused commands are events), and 30,000 in one answer took 2.9 s and 16 MB.
EVENTS_PAGE_MAX = 5000


@router.get("/v1/jobs/{job_id}/events", response_model=None)
async def events(
    request: Request,
    job_id: str,
    caller: Caller,
    backend: Backend,
    follow: bool = False,
    after_seq: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=EVENTS_PAGE_MAX)] = EVENTS_PAGE_MAX,
) -> dict[str, Any] | StreamingResponse:
    """The job's history after ``after_seq``, at most ``limit`` events a page (``next_after_seq``:
    where the next page starts, None at the end); with ``follow=true`` a resumable Server-Sent
    Events stream."""
    await backend.visible_job(job_id, caller)
    if not follow:
        history = await read(backend.projection.history, JOBS, job_id, after_seq, limit + 1)
        more = len(history) > limit
        shown = await backend.redacted(caller, history[:limit])
        return {"events": shown, "next_after_seq": shown[-1]["seq"] if more else None}
    start = after_seq
    if last := request.headers.get("last-event-id", ""):
        start = event_id(last, "Last-Event-ID")
    backend.followers.admit(caller.tenant)
    return backend.followers.stream(
        caller.tenant,
        follow_events(request, backend, caller, job_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def follow_events(
    request: Request, backend: PlatformBackend, caller: Principal, job_id: str, after_seq: int
) -> AsyncIterator[bytes]:
    """The job's events after ``after_seq`` as they are projected, until the job has ended and
    released its GPUs or the client has gone."""
    seq = after_seq
    while not await request.is_disconnected():
        version = backend.progress.version()
        # Whether the job has ended is read before its events, with nothing awaited between: read
        # after (the events yielded first, which awaits), it could see events projected meanwhile,
        # and the stream ended without them (a follower missed the job's last two events).
        document = backend.projection.get(job_id)
        ended = document is None or (JobState(document["state"]).terminal and document["placement"] is None)
        # read on the loop, like a job by its id (see read()): one job's rows by key, at most a batch
        batch = backend.projection.history(JOBS, job_id, seq, FOLLOW_BATCH)
        for event in await backend.redacted(caller, batch):
            seq = event["seq"]
            yield f"id: {seq}\nevent: {event['type']}\ndata: {strict_dumps(event)}\n\n".encode()
        if len(batch) == FOLLOW_BATCH:
            continue  # more to read now
        if ended:
            return
        if not batch:
            yield b": keep-alive\n\n"
        await backend.progress.wait_for_change(version, KEEP_ALIVE_S)
