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
* ``/events?follow=true`` is Server-Sent Events with ``id:`` = seq, resumable with
  ``Last-Event-ID``. Each follower reads the projection at its own pace (nothing is buffered per
  client), and a follower that goes away is noticed and its stream closed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from ffdl.adapters.tenants import OPEN, Principal, TenantRegistry
from ffdl.api.manifest import ManifestError, parse_manifest
from ffdl.api.metrics import PlatformCollector, registry_for
from ffdl.core.nodes import NodeStatus, decide_node
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand
from ffdl.events.envelope import CommandData, NodeCommand
from ffdl.handlers.heartbeat_keys import JOBS_PREFIX, LearnerBeat, parse_key
from ffdl.handlers.messaging import utcnow
from ffdl.handlers.ports import Position, StoreUnavailable
from ffdl.wiring.platform import Platform

WRITE_WAIT_S = 10.0
READ_WAIT_MAX_S = 30.0
#: The events by which an owner refuses a command (a job's, a node's); both carry the reason.
REJECTIONS = frozenset({"CommandRejected", "NodeCommandRejected"})


def problem(status: int, message: str, field: str = "(request)") -> HTTPException:
    return HTTPException(status, detail=[{"field": field, "message": message}])


def principal(request: Request) -> Principal:
    """Who calls: the tenant of the bearer token, or the open default while no tenant exists."""
    tenants: TenantRegistry = request.app.state.tenants
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


class CordonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=2000, description="why, for the node's history")]
    drain: bool = Field(default=False, description="also halt its jobs with a checkpoint to resume elsewhere")


class UncordonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=2000)] = ""


def create_app(platform: Platform, *, open_api: bool = False) -> FastAPI:  # noqa: PLR0915 - one closure per route
    """The API of ``platform``; ``open_api``: with no tenant, every caller is the open default's admin
    (``ffdl up --open``, the demo); without it, no tenant means nobody gets in."""
    settings = platform.settings
    projection = platform.projection
    tenants = TenantRegistry(settings.tenants_path, allow_open=open_api)
    collector = PlatformCollector(platform)
    registry = registry_for(collector, platform.projector.latency)
    app = FastAPI(
        title="ffdl", version="1", summary="Event-sourced multi-tenant deep-learning training platform"
    )
    app.state.sse_followers = 0
    beats = HeartbeatView(platform)
    app.state.tenants = tenants

    async def read(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {
                "field": ".".join(
                    str(p) for p in error["loc"] if p not in ("query", "path", "body", "header")
                ),
                "message": error["msg"],
            }
            for error in exc.errors()
        ]
        return JSONResponse({"detail": problems}, status_code=422)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.max_request_bytes:
            body = {"detail": [{"field": "(body)", "message": f"over {settings.max_request_bytes} bytes"}]}
            return JSONResponse(body, status_code=413)
        response: Response = await call_next(request)
        return response

    async def wait_position(token: str | None) -> None:
        if not token:
            return
        try:
            position = Position.parse(platform.topics.events, token)
        except ValueError as exc:
            raise problem(422, str(exc), "after") from exc
        deadline = time.monotonic() + READ_WAIT_MAX_S
        while not await read(projection.reached, position.partition, position.offset):
            if time.monotonic() > deadline:
                raise problem(504, f"the projection has not reached {token} yet", "after")
            await platform.projector.wait_for_change(0.05)

    async def visible_job(job_id: str, caller: Principal) -> dict[str, Any]:
        document = await read(projection.get, job_id)
        if document is None or not caller.may_see(document["tenant"]):
            raise problem(404, f"no job {job_id}", "job_id")
        return dict(document)

    def caused_by(command: AnyCommand) -> list[dict[str, Any]]:
        """The events of the command's job or node that the command caused, as projected."""
        cause = str(command.command_id)
        if isinstance(command, NodeCommand):
            events = projection.node_history(command.node, 0, 100_000)
        else:
            events = projection.history(command.job_id, 0, 100_000)
        return [e for e in events if e.get("causation_id") == cause]

    async def send_and_wait(command: AnyCommand) -> str | None:
        """Send ``command`` and wait (bounded) until the projection has applied what it caused: the
        log position of its first event, or None if the wait ran out. A rejection answers 409 with
        the owner's reason."""
        await platform.sender.send(command)
        cause = str(command.command_id)
        deadline = time.monotonic() + WRITE_WAIT_S
        while time.monotonic() < deadline:
            position: str | None = await read(projection.position_of_cause, cause)
            if position is not None:
                caused = await read(caused_by, command)
                rejected = next((e for e in caused if e["type"] in REJECTIONS), None)
                if rejected is not None:
                    raise problem(409, rejected["data"]["reason"], "state")
                return position
            await platform.projector.wait_for_change(0.05)
        return None

    async def write_job(job_id: str, tenant: str, data: CommandData) -> dict[str, Any]:
        command = platform.sender.make(job_id, tenant, data)
        position = await send_and_wait(command)
        if position is None:
            return {"job_id": job_id, "state": None, "position": None, "command_id": str(command.command_id)}
        document = await read(projection.get, job_id)
        return {"job_id": job_id, "state": document["state"] if document else None, "position": position}

    @app.post("/v1/jobs", status_code=201)
    async def submit(request: Request, caller: Caller) -> dict[str, Any]:
        """Submit a job: JSON or YAML, our manifest or FfDL's. Answers once the job is on the log."""
        body = await request.body()
        if len(body) > settings.max_request_bytes:
            raise problem(413, f"over {settings.max_request_bytes} bytes", "(body)")
        try:
            spec = parse_manifest(body)
        except ManifestError as exc:
            raise HTTPException(422, detail=[{"field": f, "message": m} for f, m in exc.problems]) from exc
        job_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        return await write_job(job_id, caller.tenant, cmd.SubmitJob(spec=spec))

    @app.get("/v1/jobs", response_model=None)
    async def list_jobs(
        caller: Caller,
        state: Annotated[list[str] | None, Query(description="repeatable")] = None,
        tenant: Annotated[str | None, Query(description="admins only: another tenant's jobs")] = None,
        label: Annotated[str | None, Query(description="KEY=VALUE")] = None,
        submitted_since: Annotated[str | None, Query(description="ISO 8601 time")] = None,
        submitted_until: Annotated[str | None, Query(description="ISO 8601 time")] = None,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        order: Annotated[str, Query(pattern="^(newest|oldest)$")] = "newest",
        after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
    ) -> Response:
        await wait_position(after)
        label_filter = None
        if label is not None:
            key, sep, value = label.partition("=")
            if not sep or not key:
                raise problem(422, "a label filter is KEY=VALUE", "label")
            label_filter = (key, value)
        after_key = None
        if cursor:
            submitted_at, sep, last_id = cursor.partition("|")
            if not sep:
                raise problem(422, "malformed cursor: pass next_cursor back unchanged", "cursor")
            after_key = (submitted_at, last_id)
        if caller.admin:
            scope = tenant
        elif tenant is None or tenant == caller.tenant:
            scope = caller.tenant
        else:
            return JSONResponse({"jobs": [], "next_cursor": None})
        documents = await read(
            projection.list_documents,
            tenant=scope,
            states=[s.upper() for s in state or []],
            label=label_filter,
            submitted_since=submitted_since,
            submitted_until=submitted_until,
            after=after_key,
            limit=limit,
            newest_first=order == "newest",
        )
        next_cursor = None
        if len(documents) == limit:
            last = json.loads(documents[-1])
            next_cursor = f"{last['submitted_at']}|{last['job_id']}"
        # the stored documents are JSON already: pass them on without parsing and re-encoding each
        body = f'{{"jobs":[{",".join(documents)}],"next_cursor":{json.dumps(next_cursor)}}}'
        return Response(body, media_type="application/json")

    @app.get("/v1/jobs/{job_id}", response_model=None)
    async def get_job(job_id: str, caller: Caller, after: str | None = None) -> JSONResponse:
        """The job with learners (placement, heartbeat), attempts, checkpoints, state times and reasons."""
        await wait_position(after)
        document = await visible_job(job_id, caller)
        alive = await beats.of(job_id) if not JobState(document["state"]).terminal else {}
        for learner in document["learners"]:
            learner["heartbeat"] = alive.get(learner["rank"], {"alive": False})
        return JSONResponse(document)

    @app.get("/v1/jobs/{job_id}/why")
    async def why(job_id: str, caller: Caller, after: str | None = None) -> dict[str, Any]:
        """Why the job is pending: the scheduler's reason, its queue position and what it waits for."""
        await wait_position(after)
        await visible_job(job_id, caller)
        answer: dict[str, Any] = await read(projection.why, job_id)
        return answer

    @app.delete("/v1/jobs/{job_id}", status_code=202)
    async def cancel_or_delete(job_id: str, caller: Caller) -> dict[str, Any]:
        """Cancel a live job; delete an ended one from the listings (its events stay on the log)."""
        document = await visible_job(job_id, caller)
        if JobState(document["state"]).terminal:
            return await write_job(job_id, document["tenant"], cmd.DeleteJob())
        return await write_job(job_id, document["tenant"], cmd.CancelJob(reason="cancelled through the API"))

    @app.post("/v1/jobs/{job_id}:halt", status_code=202)
    async def halt(job_id: str, caller: Caller) -> dict[str, Any]:
        document = await visible_job(job_id, caller)
        if document["state"] in ("HALTING", "HALTED"):
            return {"job_id": job_id, "state": document["state"], "position": None}
        return await write_job(job_id, document["tenant"], cmd.HaltJob(reason="halted through the API"))

    @app.post("/v1/jobs/{job_id}:resume", status_code=202)
    async def resume(job_id: str, caller: Caller) -> dict[str, Any]:
        document = await visible_job(job_id, caller)
        return await write_job(job_id, document["tenant"], cmd.ResumeJob())

    @app.get("/v1/jobs/{job_id}/events", response_model=None)
    async def events(
        request: Request,
        job_id: str,
        caller: Caller,
        follow: bool = False,
        after_seq: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any] | StreamingResponse:
        """The job's history; with ``follow=true`` a resumable Server-Sent Events stream."""
        await visible_job(job_id, caller)
        if not follow:
            return {"events": await read(projection.history, job_id, after_seq, 100_000)}
        last = request.headers.get("last-event-id", "")
        start = int(last) if last.isdigit() else after_seq
        return StreamingResponse(
            follow_events(request, job_id, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def follow_events(request: Request, job_id: str, after_seq: int) -> AsyncIterator[bytes]:
        app.state.sse_followers += 1
        seq = after_seq
        try:
            while not await request.is_disconnected():
                batch = await read(projection.history, job_id, seq, 200)
                for event in batch:
                    seq = event["seq"]
                    yield f"id: {seq}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                if batch:
                    continue
                document = await read(projection.get, job_id)
                if document is None or (
                    JobState(document["state"]).terminal and document["placement"] is None
                ):
                    return
                yield b": keep-alive\n\n"
                await platform.projector.wait_for_change(1.0)
        finally:
            app.state.sse_followers -= 1

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse)
    async def logs(
        job_id: str,
        caller: Caller,
        rank: Annotated[int, Query(ge=0)] = 0,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
        follow: bool = False,
    ) -> Response:
        """A learner's log (the local launcher's files); ``follow=true`` streams new lines until it ends."""
        document = await visible_job(job_id, caller)
        chosen = attempt or max(document["attempt"], 1)
        path = settings.work_dir / job_id / "logs" / f"attempt-{chosen}" / f"learner-{rank}.log"
        if not path.is_file():
            raise problem(404, f"no log for learner {rank} of attempt {chosen}", "rank")
        if not follow:
            return PlainTextResponse("".join(await read(_tail, path, tail)))
        return StreamingResponse(follow_log(job_id, path, tail), media_type="text/plain")

    async def follow_log(job_id: str, path: Path, tail: int) -> AsyncIterator[bytes]:
        lines = await read(_tail, path, tail)
        yield "".join(lines).encode()
        offset = await read(lambda: path.stat().st_size)
        while True:
            chunk = await read(_read_from, path, offset)
            offset += len(chunk)
            if chunk:
                yield chunk
                continue
            document = await read(projection.get, job_id)
            if document is None or JobState(document["state"]).terminal:
                return
            await asyncio.sleep(0.25)

    async def gpu_holders(caller: Principal) -> dict[str, dict[str, str]]:
        """Per node, which job holds each GPU (index as text -> job id; another tenant's is 'other')."""
        holders: dict[str, dict[str, str]] = {}
        for job in await read(projection.holdings):
            holder = job["job_id"] if caller.may_see(job["tenant"]) else "other"
            for learner in job["placement"]:
                for gpu in learner["gpus"]:
                    holders.setdefault(learner["node"], {})[str(gpu)] = holder
        return holders

    async def known_node(name: str) -> dict[str, Any]:
        document: dict[str, Any] | None = await read(projection.node, name)
        if document is None:
            raise problem(404, f"no node {name}", "name")
        return document

    @app.get("/v1/cluster")
    async def cluster(caller: Caller) -> dict[str, Any]:
        """The present nodes (ready, cordoned or draining), their GPUs and which job holds each (jobs
        of other tenants are shown as 'other')."""
        holders = await gpu_holders(caller)
        nodes: list[dict[str, Any]] = [
            {
                "name": node["name"],
                "status": node["status"],
                "gpu_type": node["gpu_type"],
                "gpus": node["gpus"],
                "cpus": node["cpus"],
                "memory_mb": node["memory_mb"],
                "schedulable": node["status"] == NodeStatus.READY,
                "allocated": holders.get(node["name"], {}),
            }
            for node in await read(projection.nodes)
            if NodeStatus(node["status"]).present
        ]
        total = sum(int(n["gpus"]) for n in nodes)
        used = sum(len(n["allocated"]) for n in nodes)
        return {"nodes": nodes, "gpus_total": total, "gpus_allocated": used}

    @app.get("/v1/nodes")
    async def list_nodes(
        caller: Caller,
        status: Annotated[
            list[str] | None, Query(description="repeatable: READY, CORDONED, DRAINING, LOST, REMOVED")
        ] = None,
        after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
    ) -> dict[str, Any]:
        """Every node the inventory ever had, removed ones too, with its status and cordon."""
        await wait_position(after)
        wanted = {s.upper() for s in status or []}
        unknown = sorted(wanted - set(NodeStatus))
        if unknown:
            raise problem(
                422, f"no node status {', '.join(unknown)}; known: {', '.join(NodeStatus)}", "status"
            )
        nodes = await read(projection.nodes)
        return {"nodes": [n for n in nodes if not wanted or n["status"] in wanted]}

    @app.get("/v1/nodes/{name}")
    async def get_node(
        name: str,
        caller: Caller,
        history: Annotated[bool, Query(description="include the node's events")] = False,
        after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
    ) -> dict[str, Any]:
        """The node, which job holds each of its GPUs (another tenant's as 'other') and, with
        ``history=true``, its events."""
        await wait_position(after)
        document = await known_node(name)
        document["allocated"] = (await gpu_holders(caller)).get(name, {})
        if history:
            document["history"] = await read(projection.node_history, name, 0, 100_000)
        return document

    async def write_node(
        name: str, data: nd.CordonNode | nd.UncordonNode, response: Response
    ) -> dict[str, Any]:
        """Send an operator's node command; answer with the node after it and the position of the
        event it caused, or (202) with the node as it was and the command's id if that event is not
        projected within the wait. A command the node decider says changes nothing (cordoning a
        node cordoned so already, uncordoning an open one) is not sent: the node as it is, no position."""
        document = await known_node(name)
        command = platform.sender.make_for_node(name, data)
        record = await read(projection.node_record, name)
        if record is not None and not decide_node(record, command, utcnow()):
            return {**document, "position": None}
        position = await send_and_wait(command)
        document = await known_node(name)
        if position is None:
            response.status_code = 202
            return {**document, "position": None, "command_id": str(command.command_id)}
        return {**document, "position": position}

    @app.post("/v1/nodes/{name}:cordon")
    async def cordon(
        name: str, caller: Admin, body: Annotated[CordonRequest, Body()], response: Response
    ) -> dict[str, Any]:
        """Admins: place nothing new on the node; with ``drain`` also halt its jobs with a checkpoint
        and requeue them to resume elsewhere. An operator's cordon replaces the inventory's; cordoning
        an operator-cordoned node again only ever adds ``drain``."""
        return await write_node(name, nd.CordonNode(reason=body.reason, drain=body.drain), response)

    @app.post("/v1/nodes/{name}:uncordon")
    async def uncordon(
        name: str,
        caller: Admin,
        response: Response,
        body: Annotated[UncordonRequest | None, Body()] = None,
    ) -> dict[str, Any]:
        """Admins: lift an operator's cordon or drain (one the inventory put there is lifted at its
        source: 409). A node that is not cordoned is answered as it is, with no position."""
        reason = body.reason if body is not None else ""
        return await write_node(name, nd.UncordonNode(reason=reason), response)

    @app.get("/v1/queues")
    async def queues(caller: Caller) -> dict[str, Any]:
        """Queued jobs per tenant, each with its position in the scheduler's order."""
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        for position, job in enumerate(await read(projection.queue), start=1):
            if not caller.may_see(job["tenant"]):
                continue
            by_tenant.setdefault(job["tenant"], []).append(
                {
                    "job_id": job["job_id"],
                    "position": position,
                    "priority": job["spec"]["priority"],
                    "learners": job["spec"]["learners"],
                    "gpus": job["spec"]["gpus"],
                    "reason": job["reason"],
                }
            )
        return {"queues": by_tenant, "length": sum(len(q) for q in by_tenant.values())}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process serves requests."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: the event log answers and the projection has caught up with it."""
        try:
            ends = await asyncio.wait_for(platform.bus.end_offsets(platform.topics.events), 2.0)
        except (TimeoutError, ConnectionError) as exc:
            return JSONResponse({"ready": False, "reason": f"event log unreachable: {exc}"}, status_code=503)
        applied = await read(projection.positions)
        behind = {str(p): end - applied.get(p, 0) for p, end in ends.items() if end > applied.get(p, 0)}
        if behind:
            return JSONResponse(
                {"ready": False, "reason": "projection catching up", "behind": behind}, status_code=503
            )
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics."""
        try:
            collector.log_ends = await asyncio.wait_for(platform.bus.end_offsets(platform.topics.events), 2.0)
        except (TimeoutError, ConnectionError):
            collector.log_ends = {}
        body = await read(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


class HeartbeatView:
    """Learners' heartbeats as the API shows them: one snapshot of the store shared by all requests
    for ``max_age_s``, so a busy status API adds one store read per interval, not one per request."""

    def __init__(self, platform: Platform, max_age_s: float = 0.5) -> None:
        self._store = platform.heartbeats
        self._max_age_s = max_age_s
        self._taken_at = float("-inf")
        self._by_job: dict[str, dict[int, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    async def of(self, job_id: str) -> dict[int, dict[str, Any]]:
        async with self._lock:
            if time.monotonic() - self._taken_at > self._max_age_s:
                await self._refresh()
        return self._by_job.get(job_id, {})

    async def _refresh(self) -> None:
        try:
            snapshot = await asyncio.wait_for(self._store.snapshot(JOBS_PREFIX), 1.0)
        except (StoreUnavailable, TimeoutError):
            self._by_job = {}
            return
        now = time.time()
        by_job: dict[str, dict[int, dict[str, Any]]] = {}
        for key, value in snapshot.values.items():
            parsed = parse_key(key)
            if parsed is None or parsed.kind != "learner":
                continue
            beat = LearnerBeat.from_json(value)
            by_job.setdefault(parsed.job_id, {})[parsed.rank] = {
                "alive": True,
                "attempt": beat.attempt,
                "last_progress_age_s": round(max(0.0, now - beat.last_progress), 3),
            }
        self._by_job, self._taken_at = by_job, time.monotonic()


def _tail(path: Path, lines: int) -> list[str]:
    with path.open(errors="replace") as handle:
        return handle.readlines()[-lines:]


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(1 << 16)
