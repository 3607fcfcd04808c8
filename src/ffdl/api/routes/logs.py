"""A learner's log, as the local launcher writes it under the work directory; followed until the job ends.

A log may be larger than the API's memory: its tail is read backwards from the end of the file,
block by block, until it holds ``tail`` lines or :data:`TAIL_MAX_BYTES` bytes, and a follower then
reads on from that end. Followers hold a stream slot (:mod:`ffdl.api.followers`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import PlainTextResponse

from ffdl.api.dependencies import Backend, Caller, PlatformBackend, problem, read
from ffdl.core.states import JobState

router = APIRouter()

#: The most bytes a tail holds: a log of a few huge lines is cut to its last bytes.
TAIL_MAX_BYTES = 1 << 20
_BLOCK = 1 << 16


@router.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse)
async def logs(
    job_id: str,
    caller: Caller,
    backend: Backend,
    rank: Annotated[int, Query(ge=0, le=1023)] = 0,
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    tail: Annotated[int, Query(ge=1, le=100_000, description=f"lines, at most {TAIL_MAX_BYTES} bytes")] = 200,
    follow: bool = False,
) -> Response:
    """A learner's last ``tail`` lines (the local launcher's files); ``follow=true`` streams new
    lines until the job ends."""
    document = await backend.visible_job(job_id, caller)
    chosen = attempt or max(document["attempt"], 1)
    job_dir = backend.settings.job_dir(job_id)
    path = job_dir / "logs" / f"attempt-{chosen}" / f"learner-{rank}.log" if job_dir is not None else None
    if path is None or not await read(path.is_file):
        raise problem(404, f"no log for learner {rank} of attempt {chosen}", "rank")
    text, end = await read(tail_of, path, tail)
    if not follow:
        return PlainTextResponse(text.decode(errors="replace"))
    backend.followers.admit(caller.tenant)
    return backend.followers.stream(caller.tenant, follow_log(backend, job_id, path, text, end), "text/plain")


async def follow_log(
    backend: PlatformBackend, job_id: str, path: Path, tail: bytes, offset: int
) -> AsyncIterator[bytes]:
    yield tail
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


def tail_of(path: Path, lines: int, max_bytes: int = TAIL_MAX_BYTES) -> tuple[bytes, int]:
    """The file's last ``lines`` lines (at most its last ``max_bytes`` bytes), read backwards from
    its end, and the offset of that end."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        start, newlines, blocks = end, 0, []
        while start > 0 and end - start < max_bytes and newlines <= lines:
            size = min(_BLOCK, start, max_bytes - (end - start))
            start -= size
            handle.seek(start)
            block = handle.read(size)
            blocks.append(block)
            newlines += block.count(b"\n")
    text = b"".join(reversed(blocks))
    before = len(text) - 1 if text.endswith(b"\n") else len(text)  # a final newline ends the last line
    for _ in range(lines):
        before = text.rfind(b"\n", 0, before)
        if before < 0:
            return text, end
    return text[before + 1 :], end


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(1 << 16)
