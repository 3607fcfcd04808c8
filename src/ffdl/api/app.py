"""The HTTP API (FastAPI): writes become commands on the log, reads come from the projections.

* A write returns the log position of the event it caused once the projection has applied it
  (bounded wait), so the writer reads its own write; an illegal request answers 409 with the
  owner's reason. ``GET`` accepts ``?after=PARTITION:OFFSET`` to wait (bounded) for a position.
* Tenancy: with tenants configured every request needs ``Authorization: Bearer TOKEN``; a tenant
  sees and touches only its own jobs (another tenant's job is a 404, never a 403 that would leak
  that it exists); an admin sees all. With no tenant configured the API lets nobody in, unless it
  was started open on purpose (``ffdl up --open``), when every caller acts as the default's admin.
* Nodes: everyone sees the inventory (``/v1/nodes``, ``/v1/cluster``, both folded from the node
  events); only admins cordon, drain and uncordon, which are node commands on the log like a job's.
* Problems answer 4xx with a body that names the field: ``{"detail": [{"field", "message"}]}``.
* ``/events?follow=true`` is Server-Sent Events with ``id:`` = seq, resumable with ``Last-Event-ID``.

The routes live in :mod:`ffdl.api.routes`, one router per resource; what they share (the caller,
the platform, the read-your-writes waits, the manifest body) in :mod:`ffdl.api.dependencies`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ffdl.api.dependencies import PlatformBackend
from ffdl.api.routes import cluster, dashboard, events, health, jobs, logs, nodes
from ffdl.wiring.platform import Platform


def create_app(platform: Platform, *, open_api: bool = False) -> FastAPI:
    """The API of ``platform``: its routers, the problem format for invalid requests and the body limit.

    ``open_api``: with no tenant, every caller is the open default's admin (``ffdl up --open``, the
    demo); without it, no tenant means nobody gets in."""
    app = FastAPI(
        title="ffdl", version="1", summary="Event-sourced multi-tenant deep-learning training platform"
    )
    app.state.backend = PlatformBackend(platform, open_api=open_api)
    app.state.sse_followers = 0
    app.exception_handler(RequestValidationError)(invalid_request)
    app.middleware("http")(limit_body)
    for routes in (jobs, cluster, events, logs, nodes, health, dashboard):
        app.include_router(routes.router)
    return app


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request FastAPI could not validate: 422 naming each field (without where it came from)."""
    problems = [
        {
            "field": ".".join(str(p) for p in error["loc"] if p not in ("query", "path", "body", "header")),
            "message": error["msg"],
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": problems}, status_code=422)


async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Refuse (413) a request whose declared length is over the limit before reading its body."""
    limit = request.app.state.backend.settings.max_request_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        return JSONResponse(
            {"detail": [{"field": "(body)", "message": f"over {limit} bytes"}]}, status_code=413
        )
    return await call_next(request)
