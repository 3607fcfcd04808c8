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
* Bounded input: a request body is counted as it arrives, chunked or not, and refused (413) past
  ``max_request_bytes`` before any route has read it all; routes read bodies only once the caller
  is authenticated; manifests parse off the event loop, one at a time, taking turns among tenants
  and stopped at their deadline, with no YAML aliases; waits, open streams
  and log reads are capped (see :mod:`ffdl.api.dependencies`, :mod:`ffdl.api.followers`).
* What a tenant is shown of reasons names other tenants' jobs as "another tenant's job"
  (:mod:`ffdl.api.redaction`); ``/metrics`` and the details of ``/readyz`` are for admins.
* Every response carries a Content-Security-Policy (this origin's scripts and styles only, never
  framed), ``X-Frame-Options: DENY``, ``nosniff`` and ``Referrer-Policy: no-referrer``; FastAPI's
  CDN-loaded ``/docs`` and ``/redoc`` are off (the document is ``/openapi.json``).

The routes live in :mod:`ffdl.api.routes`, one router per resource; what they share (the caller,
the platform, the read-your-writes waits, the manifest body) in :mod:`ffdl.api.dependencies`.
"""

from __future__ import annotations

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ffdl.api.dependencies import PlatformBackend, field_problems, problem
from ffdl.api.routes import cluster, dashboard, events, health, jobs, logs, nodes
from ffdl.api.strict_json import StrictJSONResponse
from ffdl.wiring.platform import Platform

log = structlog.get_logger(__name__)


def create_app(platform: Platform, *, open_api: bool = False, processes: int = 1) -> FastAPI:
    """The API of ``platform``: its routers, the problem format for invalid requests and the body limit.

    ``open_api``: with no tenant, every caller is the open default's admin (``ffdl up --open``, the
    demo); without it, no tenant means nobody gets in. ``processes``: how many serve the API in all
    (each admits its share of the open streams)."""
    app = FastAPI(
        title="ffdl",
        version="1",
        summary="Event-sourced multi-tenant deep-learning training platform",
        # FastAPI's /docs and /redoc load their scripts from a CDN onto the dashboard's origin: off.
        # The document stays at /openapi.json (and docs/openapi.json) for any viewer to read.
        docs_url=None,
        redoc_url=None,
        default_response_class=StrictJSONResponse,
    )
    app.state.backend = PlatformBackend(platform, open_api=open_api, processes=processes)
    app.exception_handler(RequestValidationError)(invalid_request)
    app.exception_handler(HTTPException)(http_problem)
    app.add_middleware(BodyLimit, limit=platform.settings.max_request_bytes)
    app.add_middleware(SecurityHeaders)
    for routes in (jobs, cluster, events, logs, nodes, health, dashboard):
        app.include_router(routes.router)
    return app


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request FastAPI could not validate: 422 naming each field (without where it came from)."""
    detail = field_problems(exc.errors())
    refused(request, 422, detail)
    return StrictJSONResponse({"detail": detail}, status_code=422)


async def http_problem(request: Request, exc: HTTPException) -> JSONResponse:
    """Every refusal in the problem format: the routes' own already are; the framework's (an unknown
    path, a method not allowed) are given the field ``(request)``. Written as the API writes any JSON
    (Starlette's own response could not encode a problem naming a label key that held a lone
    surrogate: a 500 instead of the 422)."""
    detail = exc.detail if isinstance(exc.detail, list) else [{"field": "(request)", "message": exc.detail}]
    refused(request, exc.status_code, detail)
    return StrictJSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def refused(request: Request, status: int, detail: list[dict[str, str]]) -> None:
    """Log a refusal for the operator: who (the tenant, once authenticated), what and why."""
    log.info(
        "request refused",
        tenant=getattr(request.state, "tenant", None),
        method=request.method,
        path=request.url.path,
        status=status,
        problems=[f"{problem.get('field')}: {problem.get('message')}" for problem in detail],
    )


#: What a browser may do with any response of the API: the dashboard's page runs its own scripts and
#: styles (files under /ui, no inline code: ``style`` set through the DOM is not inline markup), talks
#: to this origin only, is never framed (no clickjacking of halt and cancel), sends no referrer and
#: sniffs no type.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every HTTP response (the page, its scripts, the API's JSON,
    the errors), unless the response set one itself: one place, so no route can forget them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend((name, value) for name, value in SECURITY_HEADERS if name not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit:
    """Refuse (413) a request body over ``limit`` bytes: at once when its declared length is over,
    else as the bytes arrive (a chunked body declares none), before a route has read more than the
    limit. The count is made where the body is received, so no route can forget it.

    After a refusal the server would read the rest of the body to find the next request on the
    connection, for as long as the client cares to send. Up to :data:`DRAIN_FACTOR` times the limit
    is read and dropped, so that a client that sent a little too much reads its 413 in peace; past
    that the 413 closes the connection (such a client may see it reset instead).
    """

    #: How many times the limit a refused body may be in all and still be read to its end.
    DRAIN_FACTOR = 4

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drained = self.limit * self.DRAIN_FACTOR
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > self.limit):
            too_large = self._too_large(close=len(declared) > 18 or int(declared) > drained)
            response = JSONResponse({"detail": too_large.detail}, status_code=413, headers=too_large.headers)
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] != "http.request":
                return message
            received += len(message.get("body", b""))
            if received <= self.limit:
                return message
            while message.get("more_body", False) and received <= drained:
                message = await receive()
                received += len(message.get("body", b""))
            # answered 413 by the route's exception handling
            raise self._too_large(close=message.get("more_body", False))

        await self.app(scope, counted, send)

    def _too_large(self, *, close: bool) -> HTTPException:
        message = f"a request body may have at most {self.limit} bytes"
        return problem(413, message, "(body)", headers={"Connection": "close"} if close else None)
