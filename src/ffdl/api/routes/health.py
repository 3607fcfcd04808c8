"""Liveness, readiness (the event log answers and the projection has caught up) and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ffdl.api.dependencies import Backend, read

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(backend: Backend) -> JSONResponse:
    """Readiness: the event log answers and the projection has caught up with it."""
    platform = backend.platform
    try:
        ends = await asyncio.wait_for(platform.bus.end_offsets(platform.topics.events), 2.0)
    except (TimeoutError, ConnectionError) as exc:
        return JSONResponse({"ready": False, "reason": f"event log unreachable: {exc}"}, status_code=503)
    applied = await read(backend.projection.positions)
    behind = {str(p): end - applied.get(p, 0) for p, end in ends.items() if end > applied.get(p, 0)}
    if behind:
        return JSONResponse(
            {"ready": False, "reason": "projection catching up", "behind": behind}, status_code=503
        )
    return JSONResponse({"ready": True})


@router.get("/metrics")
async def metrics(backend: Backend) -> Response:
    """Prometheus metrics."""
    platform = backend.platform
    try:
        backend.collector.log_ends = await asyncio.wait_for(
            platform.bus.end_offsets(platform.topics.events), 2.0
        )
    except (TimeoutError, ConnectionError):
        backend.collector.log_ends = {}
    body = await read(generate_latest, backend.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
