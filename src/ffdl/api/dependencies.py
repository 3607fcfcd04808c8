"""What every route shares, as FastAPI dependencies and the helpers they hand out.

* :data:`Caller` is who calls: the tenant of the bearer token (401 without a valid one once a
  tenant exists); :data:`Admin` the caller if an admin (403 otherwise).
* :data:`Backend` is the platform the app serves, as the routes reach it: reads from the projection
  run off the event loop; ``wait_for`` makes a read wait (bounded) for a log position the reader
  was given by a write; ``send_and_wait`` sends a command and waits (bounded) until the projection
  has applied what it caused, so the writer reads its own write, and answers the owner's rejection
  as 409 with its reason.
* :data:`Manifest` is a job manifest parsed from the request body (JSON or YAML, ours or FfDL's).

The read-your-writes wait is a call, not a dependency, on purpose: a route validates all its
parameters before it waits, and waits before it looks its job up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request

from ffdl.adapters.tenants import OPEN, Principal, TenantRegistry
from ffdl.api.heartbeats import HeartbeatView
from ffdl.api.manifest import ManifestError, parse_manifest
from ffdl.api.metrics import PlatformCollector, registry_for
from ffdl.core.kinds import KINDS
from ffdl.events.codec import AnyCommand
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.wiring.platform import Platform

WRITE_WAIT_S = 10.0
READ_WAIT_MAX_S = 30.0
#: The events by which an owner refuses a command (a job's, a node's); both carry the reason.
REJECTIONS = frozenset({"CommandRejected", "NodeCommandRejected"})

T = TypeVar("T")


def problem(status: int, message: str, field: str = "(request)") -> HTTPException:
    return HTTPException(status, detail=[{"field": field, "message": message}])


async def read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` (a blocking read of the projection or a file) run off the event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class PlatformBackend:
    """The platform one app serves, with what its routes share beyond a request: the tenants, the
    heartbeat snapshot and the metrics registry."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.settings = platform.settings
        self.projection = platform.projection
        self.tenants = TenantRegistry(platform.settings.tenants_path)
        self.heartbeats = HeartbeatView(platform)
        self.collector = PlatformCollector(platform)
        self.registry = registry_for(self.collector, platform.projector.latency)

    async def wait_for(self, token: str | None) -> None:
        """Wait (bounded) until the projection has applied the log position ``token`` (PARTITION:OFFSET)."""
        if not token:
            return
        try:
            position = Position.parse(self.platform.topics.events, token)
        except ValueError as exc:
            raise problem(422, str(exc), "after") from exc
        deadline = time.monotonic() + READ_WAIT_MAX_S
        while not await read(self.projection.reached, position.partition, position.offset):
            if time.monotonic() > deadline:
                raise problem(504, f"the projection has not reached {token} yet", "after")
            await self.platform.projector.wait_for_change(0.05)

    async def visible_job(self, job_id: str, caller: Principal) -> dict[str, Any]:
        """The job's document, if the caller may see it; another tenant's job is a 404 like a missing one."""
        document = await read(self.projection.get, job_id)
        if document is None or not caller.may_see(document["tenant"]):
            raise problem(404, f"no job {job_id}", "job_id")
        return dict(document)

    async def send_and_wait(self, command: AnyCommand, caller: Principal) -> str | None:
        """Send ``command`` for ``caller`` and wait (bounded) until the projection has applied what it
        caused: the log position of its first event, or None if the wait ran out. A rejection answers
        409 with the owner's reason."""
        await self.platform.sender.send(command, principal=caller.on_the_log())
        cause = str(command.command_id)
        deadline = time.monotonic() + WRITE_WAIT_S
        while time.monotonic() < deadline:
            position: str | None = await read(self.projection.position_of_cause, cause)
            if position is not None:
                caused = await read(self._caused_by, command)
                rejected = next((e for e in caused if e["type"] in REJECTIONS), None)
                if rejected is not None:
                    raise problem(409, rejected["data"]["reason"], "state")
                return position
            await self.platform.projector.wait_for_change(0.05)
        return None

    def _caused_by(self, command: AnyCommand) -> list[dict[str, Any]]:
        """The events of the command's job or node that the command caused, as projected."""
        cause = str(command.command_id)
        kind = KINDS.of(command)
        events = self.projection.history(kind, kind.identity(command), 0, 100_000)
        return [e for e in events if e.get("causation_id") == cause]


async def _backend(request: Request) -> PlatformBackend:
    backend: PlatformBackend = request.app.state.backend
    return backend


Backend = Annotated[PlatformBackend, Depends(_backend)]


def principal(request: Request) -> Principal:
    """Who calls: the tenant of the bearer token, or the open default while no tenant exists."""
    tenants: TenantRegistry = request.app.state.backend.tenants
    if tenants.open:
        return OPEN
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    found = tenants.authenticate(token.strip()) if scheme.lower() == "bearer" and token else None
    if found is None:
        raise HTTPException(
            401,
            detail=[{"field": "Authorization", "message": "a valid bearer token is needed"}],
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


Caller = Annotated[Principal, Depends(principal)]


def admin(caller: Caller) -> Principal:
    """The caller, if an admin (SREs): the inventory is the whole platform's, not a tenant's."""
    if not caller.admin:
        raise problem(403, "only an admin may change the inventory", "Authorization")
    return caller


Admin = Annotated[Principal, Depends(admin)]


async def job_manifest(request: Request, backend: Backend) -> JobSpec:
    """The job manifest of the request body: JSON or YAML, our manifest or FfDL's."""
    body = await request.body()
    limit = backend.settings.max_request_bytes
    if len(body) > limit:
        raise problem(413, f"over {limit} bytes", "(body)")
    try:
        return parse_manifest(body)
    except ManifestError as exc:
        raise HTTPException(422, detail=[{"field": f, "message": m} for f, m in exc.problems]) from exc


Manifest = Annotated[JobSpec, Depends(job_manifest)]
