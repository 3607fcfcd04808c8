"""``ffdl nodes`` as an operator types it, against the API of a running platform: list, show,
cordon, drain and uncordon, and the inventory's own cordon refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from ffdl.wiring.config import NodeConfig, Settings
from tests.harness import Api, Cli, fast_settings
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    nodes = [NodeConfig(name="node-a", gpus=4), NodeConfig(name="node-c", gpus=1, schedulable=False)]
    return fast_settings(tmp_path / "ffdl", nodes=nodes)


async def recorded(api: Api) -> bool:
    nodes = (await api.http.get("/v1/nodes")).json()["nodes"]
    return [(n["name"], n["status"]) for n in nodes] == [("node-a", "READY"), ("node-c", "CORDONED")]


async def test_an_operator_cordons_drains_and_uncordons_a_node_from_the_command_line(
    api: Api, settings: Settings
) -> None:
    await wait_until_async(lambda: recorded(api), 30, interval_s=0.1, what="the configured nodes")
    cli = Cli(settings)

    listed = await cli.json("nodes", "list")
    assert [(n["name"], n["status"]) for n in listed] == [("node-a", "READY"), ("node-c", "CORDONED")]
    table = await cli("nodes", "list")
    assert table.exit_code == 0 and "node-a" in table.output and "cordon by inventory" in table.output

    cordoned = await cli("nodes", "cordon", "node-a", "--reason", "bad fan")
    assert cordoned.exit_code == 0, cordoned.output
    assert "node-a: CORDONED (cordon by operator: bad fan)" in cordoned.output
    drained = await cli.json("nodes", "drain", "node-a", "--reason", "kernel update")
    assert drained["status"] == "DRAINING" and drained["cordon"]["drain"] is True

    shown = await cli("nodes", "show", "node-a")
    assert shown.exit_code == 0 and "events of node-a" in shown.output and "NodeCordoned" in shown.output
    detail = await cli.json("nodes", "show", "node-a")
    assert [e["type"] for e in detail["history"]] == ["NodeJoined", "NodeCordoned", "NodeCordoned"]
    assert detail["allocated"] == {}

    lifted = await cli("nodes", "uncordon", "node-a", "--reason", "fan replaced")
    assert lifted.exit_code == 0 and "node-a: READY" in lifted.output
    again = await cli("nodes", "uncordon", "node-a")
    assert again.exit_code == 0 and "node-a: READY (nothing changed)" in again.output
    refused = await cli("nodes", "uncordon", "node-c")
    assert refused.exit_code == 2 and "error: node node-c is cordoned" in refused.output
    assert "cordoned by its inventory" in " ".join(refused.output.split())  # as the terminal wrapped it
    unknown = await cli("nodes", "show", "node-z")
    assert unknown.exit_code == 2 and "error: " in unknown.output and "node-z" in unknown.output
