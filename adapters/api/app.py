"""The HTTP API (FastAPI): writes become commands on the log, reads come from the projections.

A write returns the log position of the event it caused, once the projection has applied it
(bounded wait), so the writer reads its own write; an illegal request answers 409 with the
owner's reason. ``GET`` accepts ``?after=PARTITION:OFFSET`` to wait (bounded) for a position.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import structlog
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ffdl.adapters.api.metrics import PlatformCollector, registry_for
from ffdl.adapters.manifest import ManifestError, parse_manifest
from ffdl.adapters.platform import Platform
from ffdl.events import commands as cmd
from ffdl.events.envelope import CommandData
from ffdl.handlers.ports import Position

log = structlog.get_logger(__name__)

WRITE_WAIT_S = 10.0
READ_WAIT_MAX_S = 30.0
MAX_BODY_BYTES = 256 * 1024
TENANT = "default"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


def _problem(status: int, message: str, field: str | None = None) -> HTTPException:
    detail: dict[str, Any] = {"message": message}
    if field is not None:
        detail["field"] = field
    return HTTPException(status, detail=detail)


def create_app(platform: Platform) -> FastAPI:
    app = FastAPI(title="ffdl", version="1", summary="Event-sourced deep-learning training platform")
    projection = platform.projection
    registry = registry_for(PlatformCollector(platform))

    async def read(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def wait_position(token: str | None) -> None:
        if not token:
            return
        try:
            position = Position.parse(platform.topics.events, token)
        except ValueError as exc:
            raise _problem(400, str(exc), "after") from exc
        deadline = asyncio.get_running_loop().time() + READ_WAIT_MAX_S
        while not await read(projection.reached, position.partition, position.offset):
            if asyncio.get_running_loop().time() > deadline:
                raise _problem(504, f"projection has not reached {token} yet", "after")
            await asyncio.sleep(0.02)

    async def job_or_404(job_id: str) -> dict[str, Any]:
        document = await read(projection.get, job_id)
        if document is None or document["tenant"] != TENANT:
            raise _problem(404, f"no job {job_id}")
        return dict(document)

    async def send_and_wait(job_id: str, data: CommandData) -> dict[str, Any]:
        command = platform.sender.make(job_id, TENANT, data)
        await platform.sender.send(command)
        deadline = asyncio.get_running_loop().time() + WRITE_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            position = await read(projection.position_of_cause, str(command.command_id))
            if position is not None:
                events = await read(projection.history, job_id, 0, 100_000)
                caused = [e for e in events if e.get("causation_id") == str(command.command_id)]
                rejected = next((e for e in caused if e["type"] == "CommandRejected"), None)
                if rejected is not None:
                    raise _problem(409, rejected["data"]["reason"])
                document = await read(projection.get, job_id)
                return {"job_id": job_id, "state": document["state"] if document else None, "position": position}
            await asyncio.sleep(0.02)
        return {"job_id": job_id, "state": None, "position": None, "command_id": str(command.command_id)}

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return JSONResponse({"detail": {"message": f"body over {MAX_BODY_BYTES} bytes"}}, status_code=413)
        response: Response = await call_next(request)
        return response

    @app.post("/v1/jobs", status_code=201)
    async def submit(request: Request) -> dict[str, Any]:
        """Submit a job: JSON or YAML, our manifest or FfDL's."""
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise _problem(413, f"body over {MAX_BODY_BYTES} bytes")
        try:
            spec = parse_manifest(body)
        except ManifestError as exc:
            raise HTTPException(422, detail=[{"field": f, "message": m} for f, m in exc.problems]) from exc
        job_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        return await send_and_wait(job_id, cmd.SubmitJob(spec=spec))

    @app.get("/v1/jobs")
    async def list_jobs(
        state: Annotated[list[str] | None, Query()] = None,
        label: Annotated[str | None, Query(description="KEY=VALUE")] = None,
        submitted_since: str | None = None,
        submitted_until: str | None = None,
        cursor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        order: Annotated[str, Query(pattern="^(newest|oldest)$")] = "newest",
        after: str | None = None,
    ) -> dict[str, Any]:
        await wait_position(after)
        label_filter = None
        if label is not None:
            key, sep, value = label.partition("=")
            if not sep:
                raise _problem(422, "label filter must be KEY=VALUE", "label")
            label_filter = (key, value)
        after_key = None
        if cursor:
            submitted_at, sep, job_id = cursor.partition("|")
            if not sep:
                raise _problem(422, "malformed cursor", "cursor")
            after_key = (submitted_at, job_id)
        jobs = await read(
            projection.list_jobs, tenant=TENANT, states=[s.upper() for s in state or []], label=label_filter,
            submitted_since=submitted_since, submitted_until=submitted_until, after=after_key, limit=limit,
            newest_first=order == "newest",
        )
        next_cursor = f"{jobs[-1]['submitted_at']}|{jobs[-1]['job_id']}" if len(jobs) == limit else None
        return {"jobs": jobs, "next_cursor": next_cursor}

    @app.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str, after: str | None = None) -> dict[str, Any]:
        await wait_position(after)
        return await job_or_404(job_id)

    @app.delete("/v1/jobs/{job_id}", status_code=202)
    async def cancel(job_id: str) -> dict[str, Any]:
        document = await job_or_404(job_id)
        if document["state"] == "CANCELLED":
            return {"job_id": job_id, "state": "CANCELLED", "position": None}
        return await send_and_wait(job_id, cmd.CancelJob(reason="cancelled through the API"))

    @app.post("/v1/jobs/{job_id}:halt", status_code=202)
    async def halt(job_id: str) -> dict[str, Any]:
        document = await job_or_404(job_id)
        if document["state"] in ("HALTING", "HALTED"):
            return {"job_id": job_id, "state": document["state"], "position": None}
        return await send_and_wait(job_id, cmd.HaltJob(reason="halted through the API"))

    @app.post("/v1/jobs/{job_id}:resume", status_code=202)
    async def resume(job_id: str) -> dict[str, Any]:
        await job_or_404(job_id)
        return await send_and_wait(job_id, cmd.ResumeJob())

    @app.get("/v1/jobs/{job_id}/events", response_model=None)
    async def events(
        request: Request,
        job_id: str,
        follow: bool = False,
        after_seq: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any] | StreamingResponse:
        await job_or_404(job_id)
        if not follow:
            return {"events": await read(projection.history, job_id, after_seq, 100_000)}
        last = request.headers.get("last-event-id")
        start = int(last) if last and last.isdigit() else after_seq
        return StreamingResponse(_follow(job_id, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _follow(job_id: str, after_seq: int) -> AsyncIterator[bytes]:
        seq = after_seq
        while True:
            batch = await read(projection.history, job_id, seq, 500)
            for event in batch:
                seq = event["seq"]
                yield f"id: {seq}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            if not batch:
                document = await read(projection.get, job_id)
                if document is None or (document["state"] in TERMINAL and document["placement"] is None):
                    return
                yield b": keep-alive\n\n"
                await asyncio.sleep(0.25)

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse)
    async def logs(
        job_id: str, rank: Annotated[int, Query(ge=0)] = 0, attempt: Annotated[int | None, Query(ge=1)] = None,
        tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
    ) -> str:
        document = await job_or_404(job_id)
        chosen = attempt or document["attempt"]
        path = platform.settings.work_dir / job_id / "logs" / f"attempt-{chosen}" / f"learner-{rank}.log"
        if not path.is_file():
            raise _problem(404, f"no log for learner {rank} of attempt {chosen}")
        lines = await read(_tail, path, tail)
        return "".join(lines)

    @app.get("/v1/cluster")
    async def cluster() -> dict[str, Any]:
        holdings = await read(projection.holdings)
        by_slot = {
            (learner["node"], gpu): job["job_id"]
            for job in holdings for learner in job["placement"] for gpu in learner["gpus"]
        }
        nodes: list[dict[str, Any]] = [
            {
                "name": node.name, "gpu_type": node.gpu_type, "gpus": node.gpus, "cpus": node.cpus,
                "memory_mb": node.memory_mb, "schedulable": node.schedulable,
                "allocated": {str(gpu): by_slot[(node.name, gpu)] for gpu in range(node.gpus)
                              if (node.name, gpu) in by_slot},
            }
            for node in platform.settings.inventory()
        ]
        total = sum(n["gpus"] for n in nodes)
        used = sum(len(n["allocated"]) for n in nodes)
        return {"nodes": nodes, "gpus_total": total, "gpus_allocated": used}

    @app.get("/v1/queues")
    async def queues() -> dict[str, Any]:
        queued = await read(projection.queue)
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        for position, job in enumerate(queued, start=1):
            by_tenant.setdefault(job["tenant"], []).append(
                {"job_id": job["job_id"], "position": position, "priority": job["spec"]["priority"],
                 "learners": job["spec"]["learners"], "gpus": job["spec"]["gpus"], "reason": job["reason"]}
            )
        return {"queues": by_tenant, "length": len(queued)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        try:
            ends = await asyncio.wait_for(platform.bus.end_offsets(platform.topics.events), 2.0)
        except (TimeoutError, ConnectionError) as exc:
            return JSONResponse({"ready": False, "reason": f"event log unreachable: {exc}"}, status_code=503)
        applied = await read(projection.positions)
        behind = {p: end - applied.get(p, 0) for p, end in ends.items() if end > applied.get(p, 0)}
        if behind:
            return JSONResponse({"ready": False, "reason": "projection catching up", "behind": behind},
                                status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await read(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


def _tail(path: Path, lines: int) -> list[str]:
    with path.open(errors="replace") as handle:
        return handle.readlines()[-lines:]
