"""The contract every inventory source passes: the configured nodes and the Kubernetes nodes.

A source is asked for what it sees (:meth:`observe`); the scheduler turns that into node events.
Each adapter is given the same nodes (one of them cordoned at the source) and must report them by
name, with their capacity and the source's own cordon, the same on every call; and what it reports
must record as node events that agree with it afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime

import pytest

from ffdl.adapters.inventory import ConfiguredInventory
from ffdl.adapters.launchers.k8s_client import KubeClient
from ffdl.adapters.launchers.k8s_watch import NodeInventory
from ffdl.core.allocator import Node
from ffdl.core.nodes import NodeRecord, decide_node, evolve_node, inventory_changes, schedulable_inventory
from ffdl.events.envelope import NodeCommand
from ffdl.handlers.ports import InventorySource
from tests.kube import api_server, node_manifest, request_json
from tests.services import wait_until_async

NODES = (
    Node("gpu-a", 8, "A100", 64.0, 262_144),
    Node("gpu-b", 4, "H100", 64.0, 262_144, schedulable=False),
)

SourceFactory = Callable[[Sequence[Node]], AbstractAsyncContextManager[InventorySource]]


@asynccontextmanager
async def configured(nodes: Sequence[Node]) -> AsyncIterator[InventorySource]:
    yield ConfiguredInventory(nodes)


@asynccontextmanager
async def kubernetes(nodes: Sequence[Node]) -> AsyncIterator[InventorySource]:
    async with api_server() as (api, url):
        for node in nodes:
            manifest = node_manifest(node.name, gpus=node.gpus, gpu_type=node.gpu_type)
            manifest["spec"] = {"unschedulable": not node.schedulable}
            await request_json(api, "POST", "/api/v1/nodes", manifest)
        client = KubeClient.at(url)
        source = NodeInventory(client, gpu_type_labels=("ffdl.io/gpu-type",), watch_timeout_s=1)
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(stop))
        try:
            yield source
        finally:
            stop.set()
            await task
            await client.close()


@pytest.fixture(params=["configured", "kubernetes"])
def source_factory(request: pytest.FixtureRequest) -> SourceFactory:
    return {"configured": configured, "kubernetes": kubernetes}[request.param]


async def observed(source: InventorySource) -> dict[str, Node]:
    await wait_until_async(lambda: source.observe() is not None, 10, what="the source has listed its nodes")
    seen = source.observe()
    assert seen is not None
    return dict(seen.nodes)


async def test_a_source_reports_its_nodes_by_name_with_capacity_and_its_own_cordon(
    source_factory: SourceFactory,
) -> None:
    async with source_factory(NODES) as source:
        assert await observed(source) == {node.name: node for node in NODES}


async def test_a_source_reports_the_same_until_something_changes(source_factory: SourceFactory) -> None:
    async with source_factory(NODES) as source:
        await observed(source)
        assert source.observe() == source.observe()


async def test_what_a_source_reports_records_as_node_events_that_agree_with_it(
    source_factory: SourceFactory,
) -> None:
    async with source_factory(NODES) as source:
        await observed(source)
        seen = source.observe()
        assert seen is not None
        records: dict[str, NodeRecord] = {}
        for name, change in inventory_changes(records, seen).items():
            command = NodeCommand(
                command_id=uuid.uuid4(),
                node=name,
                issued_at=datetime.now(UTC),
                producer="test",
                data=change,
            )
            for event in decide_node(records.get(name), command, datetime.now(UTC)):
                records[name] = evolve_node(records.get(name), event)
        assert inventory_changes(records, seen) == {}
        assert schedulable_inventory(records.values()) == list(NODES)
