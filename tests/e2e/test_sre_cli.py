"""The SRE commands on the log of a real run: export, verify, replay, rebuild, import, as an SRE types them.

The platform runs a job with real learner processes on the embedded log; then the ``ffdl`` commands
read that log (the bus, and the file exported from it). The log holds the inventory too (the
scheduler records the configured node as it starts), so the tools answer for the node as well. A
rebuild from the exported file must be byte-for-byte the projection the live projector wrote.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from ffdl.projections.store import Projection
from ffdl.tools.sre import events_topic
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e


class Cli:
    """``ffdl`` run in process, in a worker thread (it runs its own event loop), on the test's log."""

    def __init__(self, settings: Settings) -> None:
        self.env = {"FFDL_DATA_DIR": str(settings.data_dir), "FFDL_PARTITIONS": str(settings.partitions)}
        self.runner = CliRunner()

    async def __call__(self, *args: str) -> Result:
        return await asyncio.to_thread(self.runner.invoke, app, list(args), env=self.env)

    async def json(self, *args: str) -> Any:
        result = await self(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


def dump(path: Path) -> str:
    projection = Projection(path)
    try:
        return projection.dump()
    finally:
        projection.close()


async def caught_up(platform: Platform) -> bool:
    ends = await platform.bus.end_offsets(events_topic(platform.settings))
    applied = await asyncio.to_thread(platform.projection.positions)
    return {p: o for p, o in ends.items() if o} == applied


async def test_the_sre_commands_answer_every_question_from_the_log_of_a_real_run(
    api: Api, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    job_id = await api.submit(manifest("sre", args=["--steps", "20", "--delay", "0.02"]))
    await api.wait(job_id, "COMPLETED", released=True)
    await wait_until_async(lambda: caught_up(platform), 30, what="the projector caught up with the log")
    cli = Cli(settings)
    log = tmp_path / "log.jsonl"

    exported = await cli.json("export", "-o", str(log))
    assert exported["written"] == exported["events"] == len(log.read_text().splitlines()) > 10

    verified = await cli("verify", str(log))
    assert verified.exit_code == 0 and "1 jobs, 1 nodes, 0 violation(s)" in verified.stdout
    from_bus = await cli.json("verify")
    assert (from_bus["events"], from_bus["nodes"], from_bus["undecodable"]) == (exported["events"], 1, 0)

    node = await cli.json("replay", str(log), "--node", "node-a")
    assert (node["state"]["status"], node["state"]["gpus"]) == ("READY", 4)
    assert [row["event"] for row in node["timeline"]] == ["NodeJoined"]
    only_node = tmp_path / "node.jsonl"
    assert (await cli.json("export", "--node", "node-a", "-o", str(only_node)))["written"] == node["events"][
        "in_log"
    ]
    assert {json.loads(line)["node"] for line in only_node.read_text().splitlines()} == {"node-a"}

    replayed = await cli.json("replay", str(log), "--job", job_id)
    assert replayed["state"]["state"] == "COMPLETED"
    assert [row["state"] for row in replayed["timeline"]] == [
        "SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING", "RUNNING", "STORING", "COMPLETED",
    ]  # fmt: skip
    running = next(row["seq"] for row in replayed["timeline"] if row["state"] == "RUNNING")
    at_running = await cli.json("replay", str(log), "--job", job_id, "--until", str(running))
    assert at_running["state"]["state"] == "RUNNING" and at_running["timeline"][-1]["ongoing"]
    diff = await cli.json(
        "replay", str(log), "--job", job_id, "--diff", str(running), str(replayed["point"]["seq"])
    )
    assert {"field": "state", "before": "RUNNING", "after": "COMPLETED"} in diff["changes"]
    table = await cli("replay", str(log), "--job", job_id)
    assert table.exit_code == 0 and "timeline of" in table.stdout and "COMPLETED" in table.stdout

    first, second = tmp_path / "first.sqlite", tmp_path / "second.sqlite"
    rebuilt = await cli.json("replay", str(log), "--rebuild", "--out", str(first))
    assert (rebuilt["jobs"], rebuilt["node_statuses"]) == (1, {"READY": 1})
    await cli.json("replay", str(log), "--rebuild", "--out", str(second))
    live = await asyncio.to_thread(dump, settings.projection_path)
    assert dump(first) == dump(second) == live
    assert (await cli.json("replay", "--rebuild"))["identical"] is True

    other = f"embedded://{tmp_path / 'other'}"
    imported = await cli.json("import", str(log), "--bus", other)
    assert (imported["events"], imported["moved"]) == (exported["events"], 0)
    again = tmp_path / "again.jsonl"
    await cli.json("export", "--bus", other, "-o", str(again))
    assert again.read_text() == log.read_text()
    refused = await cli("import", str(log), "--bus", other)
    assert refused.exit_code == 2 and "already holds" in refused.output


async def test_the_exported_log_of_a_real_run_decides_again_exactly_as_the_platform_decided_it(
    api: Api, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    """The check before an upgrade: today's deciders against the log a running platform wrote."""
    job_id = await api.submit(manifest("again", learners=2, args=["--steps", "20", "--delay", "0.02"]))
    await api.wait(job_id, "COMPLETED", released=True)
    cli = Cli(settings)
    log = tmp_path / "run.events.jsonl"

    exported = await cli.json("export", "--commands", "-o", str(log))
    assert exported["commands"]["path"] == str(tmp_path / "run.commands.jsonl")
    assert exported["commands"]["written"] > 10 and exported["commands"]["dead_lettered"] == []
    sent = [json.loads(line)["type"] for line in (tmp_path / "run.commands.jsonl").read_text().splitlines()]
    assert "AllocateGpus" in sent and "BeginLaunch" not in sent, "the allocation's decision launches the job"

    again = await cli("verify", "--redecide", str(log))
    report = await cli.json("verify", "--redecide", str(log))
    assert again.exit_code == 0, again.output
    assert report["divergences"] == 0 and report["known_changes"] == {}
    assert report["commands"] == exported["commands"]["written"] and report["events"] == exported["written"]
    assert report["matched"] + len(report["undecided"]) == report["commands"]
    assert report["history_without_commands"] == report["skipped"] == 0


async def test_an_export_to_stdout_is_only_data_and_verify_exits_1_on_a_damaged_log(
    api: Api, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    job_id = await api.submit(manifest("damaged", learners=1, args=["--steps", "5", "--delay", "0.01"]))
    await api.wait(job_id, "COMPLETED", released=True)
    cli = Cli(settings)

    piped = await cli(
        "export", "--job", job_id, "--type", "JobSubmitted", "--type", "JobCompleted", "-o", "-"
    )
    assert piped.exit_code == 0, piped.output
    assert [json.loads(line)["type"] for line in piped.stdout.splitlines()] == [
        "JobSubmitted",
        "JobCompleted",
    ]
    assert "exported 2 of" in piped.stderr

    log, damaged = tmp_path / "log.jsonl", tmp_path / "damaged.jsonl"
    await cli.json("export", "--job", job_id, "-o", str(log))
    lines = log.read_text().splitlines()
    missing = json.loads(lines[3])
    damaged.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    result = await cli("verify", str(damaged), "--json")

    assert result.exit_code == 1
    violations = json.loads(result.stdout)["violations"]
    assert violations[0]["kind"] == "seq-gap" and violations[0]["job_id"] == job_id
    assert violations[0]["detail"] == f"expected seq {missing['seq']}, got {missing['seq'] + 1}"
    assert violations[0]["position"] == json.loads(lines[4])["position"]
