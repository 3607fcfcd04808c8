"""A job's events: its history, or with ``follow=true`` Server-Sent Events.

The stream's ``id:`` is the event's seq, so a client resumes with ``Last-Event-ID``. Each follower
reads the projection at its own pace (nothing is buffered per client), and a follower that goes
away is noticed and its stream closed; ``app.state.sse_followers`` counts the open streams.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ffdl.api.dependencies import Backend, Caller, PlatformBackend, read
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState

router = APIRouter()


@router.get("/v1/jobs/{job_id}/events", response_model=None)
async def events(
    request: Request,
    job_id: str,
    caller: Caller,
    backend: Backend,
    follow: bool = False,
    after_seq: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any] | StreamingResponse:
    """The job's history; with ``follow=true`` a resumable Server-Sent Events stream."""
    await backend.visible_job(job_id, caller)
    if not follow:
        return {"events": await read(backend.projection.history, JOBS, job_id, after_seq, 100_000)}
    last = request.headers.get("last-event-id", "")
    start = int(last) if last.isdigit() else after_seq
    return StreamingResponse(
        follow_events(request, backend, job_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def follow_events(
    request: Request, backend: PlatformBackend, job_id: str, after_seq: int
) -> AsyncIterator[bytes]:
    """The job's events after ``after_seq`` as they are projected, until the job has ended and
    released its GPUs or the client has gone."""
    state = request.app.state
    state.sse_followers += 1
    seq = after_seq
    try:
        while not await request.is_disconnected():
            batch = await read(backend.projection.history, JOBS, job_id, seq, 200)
            for event in batch:
                seq = event["seq"]
                yield f"id: {seq}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            if batch:
                continue
            document = await read(backend.projection.get, job_id)
            if document is None or (JobState(document["state"]).terminal and document["placement"] is None):
                return
            yield b": keep-alive\n\n"
            await backend.platform.projector.wait_for_change(1.0)
    finally:
        state.sse_followers -= 1
