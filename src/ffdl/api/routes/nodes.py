"""The inventory: everyone lists and shows nodes (folded from the node events); only admins cordon,
drain and uncordon, which are node commands on the log like a job's, answered by the node's owner.

The request bodies of cordon and uncordon are read by dependencies on :data:`Admin`: a caller who
is not an admin is refused before a byte of its body is parsed. Their schemas are documented in
the OpenAPI document as the bodies FastAPI would otherwise have read first."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ffdl.adapters.tenants import Principal
from ffdl.api.dependencies import Admin, Backend, Caller, PlatformBackend, json_body, problem, read
from ffdl.api.routes.cluster import gpu_holders
from ffdl.core.kinds import NODES
from ffdl.core.nodes import NodeStatus
from ffdl.events import nodes as nd

router = APIRouter()


class CordonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=2000, description="why, for the node's history")]
    drain: bool = Field(default=False, description="also halt its jobs with a checkpoint to resume elsewhere")


class UncordonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=2000)] = ""


async def cordon_request(caller: Admin, request: Request) -> CordonRequest:
    return await json_body(request, CordonRequest)


async def uncordon_request(caller: Admin, request: Request) -> UncordonRequest:
    return await json_body(request, UncordonRequest)


def documented_body(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads ``model`` in a dependency (JSON)."""
    schema = {"content": {"application/json": {"schema": model.model_json_schema()}}, "required": required}
    return {"requestBody": schema}


async def known_node(backend: PlatformBackend, name: str) -> dict[str, Any]:
    document: dict[str, Any] | None = await read(backend.projection.node, name)
    if document is None:
        raise problem(404, f"no node {name}", "name")
    return document


@router.get("/v1/nodes")
async def list_nodes(
    caller: Caller,
    backend: Backend,
    status: Annotated[
        list[str] | None, Query(description="repeatable: READY, CORDONED, DRAINING, LOST, REMOVED")
    ] = None,
    after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
) -> dict[str, Any]:
    """Every node the inventory ever had, removed ones too, with its status and cordon."""
    await backend.wait_for(after)
    wanted = {s.upper() for s in status or []}
    unknown = sorted(wanted - set(NodeStatus))
    if unknown:
        raise problem(422, f"no node status {', '.join(unknown)}; known: {', '.join(NodeStatus)}", "status")
    nodes = await read(backend.projection.nodes)
    return {"nodes": [n for n in nodes if not wanted or n["status"] in wanted]}


@router.get("/v1/nodes/{name}")
async def get_node(
    name: str,
    caller: Caller,
    backend: Backend,
    history: Annotated[bool, Query(description="include the node's events")] = False,
    after: Annotated[str | None, Query(description="PARTITION:OFFSET to wait for")] = None,
) -> dict[str, Any]:
    """The node, which job holds each of its GPUs (another tenant's as 'other') and, with
    ``history=true``, its events."""
    await backend.wait_for(after)
    document = await known_node(backend, name)
    document["allocated"] = (await gpu_holders(backend, caller)).get(name, {})
    if history:
        document["history"] = await read(backend.projection.history, NODES, name, 0, 100_000)
    return document


async def write_node(
    backend: PlatformBackend,
    caller: Principal,
    name: str,
    data: nd.CordonNode | nd.UncordonNode,
    response: Response,
) -> dict[str, Any]:
    """Send an operator's node command and answer with the node after it and the position of the
    event it caused; the node's owner decides it, and its refusal answers 409 with the reason.

    A command that changes nothing (cordoning a node cordoned so already, uncordoning an open one)
    causes no event: once its owner has decided it, it answers at once with the node as it is,
    ``position: null`` and ``changed: false``. One still undecided when the wait runs out answers
    202 with the node as it is and the command's id."""
    await known_node(
        backend, name
    )  # the owner answers nothing for an unknown node: it dead-letters the command
    command = backend.platform.sender.make(NODES.address(name), data)
    written = await backend.send_and_wait(command, caller)
    document = await known_node(backend, name)
    if not written.decided:
        response.status_code = 202
        return {**document, "position": None, "command_id": written.command_id}
    return {**document, "position": written.position, "changed": written.changed}


@router.post("/v1/nodes/{name}:cordon", openapi_extra=documented_body(CordonRequest, required=True))
async def cordon(
    name: str,
    caller: Admin,
    backend: Backend,
    body: Annotated[CordonRequest, Depends(cordon_request)],
    response: Response,
) -> dict[str, Any]:
    """Admins: place nothing new on the node; with ``drain`` also halt its jobs with a checkpoint
    and requeue them to resume elsewhere. An operator's cordon replaces the inventory's; cordoning
    an operator-cordoned node again only ever adds ``drain`` (else it changes nothing: ``changed: false``)."""
    return await write_node(
        backend, caller, name, nd.CordonNode(reason=body.reason, drain=body.drain), response
    )


@router.post("/v1/nodes/{name}:uncordon", openapi_extra=documented_body(UncordonRequest, required=False))
async def uncordon(
    name: str,
    caller: Admin,
    backend: Backend,
    response: Response,
    body: Annotated[UncordonRequest, Depends(uncordon_request)],
) -> dict[str, Any]:
    """Admins: lift an operator's cordon or drain (one the inventory put there is lifted at its
    source: 409). Uncordoning a node that is not cordoned changes nothing: ``changed: false``."""
    return await write_node(backend, caller, name, nd.UncordonNode(reason=body.reason), response)
