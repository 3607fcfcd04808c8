"""The inventory through the HTTP API: nodes recorded on the log by the scheduler, listed and shown
from the projection, cordoned, drained and uncordoned by admins, with jobs following.

The platform runs embedded with three configured nodes: ``node-a`` (4 GPUs, the only one a 4-GPU
learner fits), ``node-b`` (2 GPUs) and ``node-c`` (1 GPU, ``schedulable: false``: cordoned by its
inventory, the configuration).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.app import create_app
from ffdl.wiring.config import NodeConfig, Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e

NODES = [
    NodeConfig(name="node-a", gpus=4),
    NodeConfig(name="node-b", gpus=2),
    NodeConfig(name="node-c", gpus=1, schedulable=False),
]
CONFIGURED = {"node-a": "READY", "node-b": "READY", "node-c": "CORDONED"}
QUICK = ["--steps", "8", "--delay", "0.02"]
LONG = ["--steps", "400", "--delay", "0.05"]


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", nodes=NODES)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def statuses(http: httpx.AsyncClient, headers: dict[str, str] | None = None) -> dict[str, str]:
    response = await http.get("/v1/nodes", headers=headers)
    assert response.status_code == 200, response.text
    return {node["name"]: node["status"] for node in response.json()["nodes"]}


async def wait_statuses(
    http: httpx.AsyncClient, expected: dict[str, str], headers: dict[str, str] | None = None
) -> None:
    async def reached() -> bool:
        return await statuses(http, headers) == expected

    await wait_until_async(reached, 30, interval_s=0.1, what=f"node statuses {expected}")


async def node(http: httpx.AsyncClient, name: str, **params: Any) -> dict[str, Any]:
    response = await http.get(f"/v1/nodes/{name}", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_the_configured_nodes_are_recorded_and_listed_with_their_status(api: Api) -> None:
    await wait_statuses(api.http, CONFIGURED)
    listing = (await api.http.get("/v1/nodes")).json()["nodes"]
    node_a = next(n for n in listing if n["name"] == "node-a")
    assert (node_a["gpus"], node_a["gpu_type"], node_a["cordon"]) == (4, "simulated", None)
    node_c = next(n for n in listing if n["name"] == "node-c")
    assert node_c["cordon"]["source"] == "inventory" and not node_c["cordon"]["drain"]

    ready = (await api.http.get("/v1/nodes", params={"status": "ready"})).json()["nodes"]
    assert [n["name"] for n in ready] == ["node-a", "node-b"]
    bad = await api.http.get("/v1/nodes", params={"status": "HAPPY"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "status"

    detail = await node(api.http, "node-a", history="true")
    assert detail["allocated"] == {} and [e["type"] for e in detail["history"]] == ["NodeJoined"]
    assert "history" not in await node(api.http, "node-a")
    unknown = await api.http.get("/v1/nodes/node-z")
    assert unknown.status_code == 404 and "node-z" in unknown.json()["detail"][0]["message"]

    cluster = (await api.http.get("/v1/cluster")).json()
    assert {n["name"]: (n["status"], n["schedulable"]) for n in cluster["nodes"]} == {
        "node-a": ("READY", True),
        "node-b": ("READY", True),
        "node-c": ("CORDONED", False),
    }
    assert cluster["gpus_total"] == 7 and cluster["gpus_allocated"] == 0
    metrics = (await api.http.get("/metrics")).text
    assert 'ffdl_nodes{status="READY"} 2.0' in metrics and 'ffdl_nodes{status="CORDONED"} 1.0' in metrics
    assert 'ffdl_nodes{status="REMOVED"} 0.0' in metrics and 'ffdl_gpus{status="total"} 7.0' in metrics


async def test_a_job_that_only_fits_a_cordoned_node_waits_until_an_admin_uncordons_it(api: Api) -> None:
    await wait_statuses(api.http, CONFIGURED)
    response = await api.http.post("/v1/nodes/node-a:cordon", json={"reason": "fan replacement"})
    assert response.status_code == 200, response.text
    cordoned = response.json()
    assert cordoned["status"] == "CORDONED" and cordoned["position"] is not None
    assert cordoned["cordon"] == {"reason": "fan replacement", "source": "operator", "drain": False}
    assert cordoned["changed"] is True
    # the owner decides the repeat to nothing: no event, answered as soon as the owner has decided it
    started = time.monotonic()
    again = await api.http.post("/v1/nodes/node-a:cordon", json={"reason": "still the fan"})
    assert time.monotonic() - started < 5  # a hang guard: the write's whole wait is 10 s
    assert again.status_code == 200, again.text
    assert again.json()["position"] is None and again.json()["changed"] is False
    assert "command_id" not in again.json() and again.json()["cordon"]["reason"] == "fan replacement"

    job_id = await api.submit(manifest("big", learners=1, gpus=4, args=QUICK))
    waiting = await api.wait_for(job_id, lambda j: j["waiting"] is not None, "the scheduler records why")
    assert waiting["state"] == "QUEUED" and waiting["placement"] is None

    response = await api.http.post("/v1/nodes/node-a:uncordon", json={"reason": "fan replaced"})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "READY" and response.json()["cordon"] is None
    again = await api.http.post("/v1/nodes/node-a:uncordon")
    assert again.status_code == 200 and again.json()["changed"] is False, again.text
    done = await api.wait(job_id, "COMPLETED", released=True)
    assert done["learners"][0]["node"] == "node-a"
    history = (await node(api.http, "node-a", history="true"))["history"]
    assert [e["type"] for e in history] == ["NodeJoined", "NodeCordoned", "NodeUncordoned"]
    assert history[1]["data"]["reason"] == "fan replacement"


async def test_draining_a_node_moves_its_running_job_to_another_from_its_checkpoint(api: Api) -> None:
    await wait_statuses(api.http, CONFIGURED)
    job_id = await api.submit(manifest("mover", learners=1, gpus=2, args=LONG))
    running = await api.wait_for(
        job_id, lambda j: j["state"] == "RUNNING" and j["latest_checkpoint"] is not None, "a checkpoint"
    )
    drained = running["learners"][0]["node"]
    other = next(name for name in ("node-a", "node-b") if name != drained)
    assert (await node(api.http, drained))["allocated"] == {"0": job_id, "1": job_id}

    response = await api.http.post(f"/v1/nodes/{drained}:cordon", json={"reason": "kernel", "drain": True})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "DRAINING"
    moved = await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and j["attempt"] == 2 and j["learners"][0]["node"] == other,
        f"the job to resume on {other}",
    )
    halting = [h["reason"] for h in moved["history"] if h["state"] == "HALTING"]
    assert len(halting) == 1 and halting[0].startswith(f"node {drained} is being drained")

    async def resumed_from_its_checkpoint() -> bool:
        log = await api.http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 2})
        return log.status_code == 200 and "resumed from step" in log.text

    await wait_until_async(resumed_from_its_checkpoint, 10, interval_s=0.1, what="attempt 2 to resume")
    assert (await node(api.http, drained))["allocated"] == {}
    await api.http.delete(f"/v1/jobs/{job_id}")


async def test_only_admins_change_the_inventory_and_an_inventory_cordon_is_lifted_at_its_source(
    api: Api, settings: Settings
) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, sre = registry.add("acme"), registry.add("sre", admin=True)
    await wait_statuses(api.http, CONFIGURED, bearer(acme))
    assert (await api.http.get("/v1/nodes")).status_code == 401
    refused = await api.http.post("/v1/nodes/node-a:cordon", json={"reason": "mine"}, headers=bearer(acme))
    assert refused.status_code == 403
    refused = await api.http.post("/v1/nodes/node-a:uncordon", headers=bearer(acme))
    assert refused.status_code == 403

    unknown = await api.http.post("/v1/nodes/node-z:cordon", json={"reason": "x"}, headers=bearer(sre))
    assert unknown.status_code == 404
    empty = await api.http.post("/v1/nodes/node-a:cordon", json={"reason": ""}, headers=bearer(sre))
    assert empty.status_code == 422 and empty.json()["detail"][0]["field"] == "reason"

    lifted = await api.http.post("/v1/nodes/node-c:uncordon", json={"reason": "why not"}, headers=bearer(sre))
    assert lifted.status_code == 409
    message = lifted.json()["detail"][0]["message"]
    assert "cordoned by its inventory" in message and "unschedulable in the configuration" in message
    assert (await statuses(api.http, bearer(sre)))["node-c"] == "CORDONED"
    history = await api.http.get("/v1/nodes/node-c", params={"history": "true"}, headers=bearer(sre))
    assert history.json()["history"][-1]["type"] == "NodeCommandRejected"


async def test_a_node_taken_out_of_the_configuration_is_removed_and_cannot_be_cordoned(
    settings: Settings,
) -> None:
    async with Platform(settings) as first, _client(first) as http:
        await wait_statuses(http, CONFIGURED)
    fewer = settings.model_copy(update={"nodes": [NODES[0], NODES[2]]})
    async with Platform(fewer) as second, _client(second) as http:
        await wait_statuses(http, {**CONFIGURED, "node-b": "REMOVED"})
        removed = (await http.get("/v1/nodes", params={"status": "REMOVED"})).json()["nodes"]
        assert [n["name"] for n in removed] == ["node-b"]
        assert "no longer in the configuration" in removed[0]["reason"]
        refused = await http.post("/v1/nodes/node-b:cordon", json={"reason": "too late"})
        assert refused.status_code == 409
        assert "removed" in refused.json()["detail"][0]["message"]
        cluster = (await http.get("/v1/cluster")).json()
        assert [n["name"] for n in cluster["nodes"]] == ["node-a", "node-c"]
        assert cluster["gpus_total"] == 5


def _client(platform: Platform) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(platform, open_api=True))
    return httpx.AsyncClient(transport=transport, base_url="http://ffdl", timeout=30)
