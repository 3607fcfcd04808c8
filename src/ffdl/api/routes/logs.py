"""A learner's log, as the local launcher writes it under the work directory; followed until the job ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from ffdl.api.dependencies import Backend, Caller, PlatformBackend, problem, read
from ffdl.core.states import JobState

router = APIRouter()


@router.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse)
async def logs(
    job_id: str,
    caller: Caller,
    backend: Backend,
    rank: Annotated[int, Query(ge=0)] = 0,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
    follow: bool = False,
) -> Response:
    """A learner's log (the local launcher's files); ``follow=true`` streams new lines until it ends."""
    document = await backend.visible_job(job_id, caller)
    chosen = attempt or max(document["attempt"], 1)
    path = backend.settings.work_dir / job_id / "logs" / f"attempt-{chosen}" / f"learner-{rank}.log"
    if not path.is_file():
        raise problem(404, f"no log for learner {rank} of attempt {chosen}", "rank")
    if not follow:
        return PlainTextResponse("".join(await read(_tail, path, tail)))
    return StreamingResponse(follow_log(backend, job_id, path, tail), media_type="text/plain")


async def follow_log(backend: PlatformBackend, job_id: str, path: Path, tail: int) -> AsyncIterator[bytes]:
    lines = await read(_tail, path, tail)
    yield "".join(lines).encode()
    offset = await read(lambda: path.stat().st_size)
    while True:
        chunk = await read(_read_from, path, offset)
        offset += len(chunk)
        if chunk:
            yield chunk
            continue
        document = await read(backend.projection.get, job_id)
        if document is None or JobState(document["state"]).terminal:
            return
        await asyncio.sleep(0.25)


def _tail(path: Path, lines: int) -> list[str]:
    with path.open(errors="replace") as handle:
        return handle.readlines()[-lines:]


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(1 << 16)
