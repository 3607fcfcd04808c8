"""Liveness, readiness (the event log answers and this replica's projection has caught up; its
details for admins) and Prometheus metrics (admins only: they name every tenant and its queue)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ffdl.api.dependencies import Admin, Backend, principal, read

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, backend: Backend) -> JSONResponse:
    """Readiness: the event log answers, and this replica's projection has caught up with the log's
    end as it was when the replica was first asked (at its start). Once caught up it stays ready
    while the log answers: under a steady stream of writes a projection is always a little behind
    the end of the moment, which must not take the replica out of service.

    Anyone (a probe) reads ``{"ready": ...}`` and the status; an admin also reads why not and
    ``behind``, how many events of each partition it has yet to apply now (how busy the platform is,
    the log's address when it is unreachable: not a tenant's business, nor an anonymous caller's)."""
    platform = backend.platform
    try:
        ends = await asyncio.wait_for(platform.bus.end_offsets(platform.topics.events), 2.0)
    except (TimeoutError, ConnectionError) as exc:
        details: dict[str, Any] = {"reason": f"event log unreachable: {exc}"}
        return await _readiness(request, False, details)
    applied = await read(backend.projection.positions)
    behind = {str(p): end - applied.get(p, 0) for p, end in ends.items() if end > applied.get(p, 0)}
    if not backend.readiness.caught_up(ends, applied):
        return await _readiness(request, False, {"reason": "projection catching up", "behind": behind})
    return await _readiness(request, True, {"behind": behind})


async def _readiness(request: Request, ready: bool, details: dict[str, Any]) -> JSONResponse:
    """The answer to ``/readyz``: 200 or 503, with ``details`` for an admin only."""
    try:
        caller = await principal(request)
    except HTTPException:
        caller = None
    shown = {"ready": ready, **details} if caller is not None and caller.admin else {"ready": ready}
    return JSONResponse(shown, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(caller: Admin, backend: Backend) -> Response:
    """Prometheus metrics, for admins (scrape with an admin's bearer token)."""
    platform = backend.platform
    try:
        backend.collector.log_ends = await asyncio.wait_for(
            platform.bus.end_offsets(platform.topics.events), 2.0
        )
    except (TimeoutError, ConnectionError):
        backend.collector.log_ends = {}
    body = await read(generate_latest, backend.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
