""" "Why is my job pending?" end to end: the scheduler records the reason on the log, the projection
answers ``GET /v1/jobs/{id}/why`` and ``ffdl why`` from it, with the queue position."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ffdl.cli.main import app
from ffdl.wiring.config import Settings
from tests.harness import Api, manifest

pytestmark = pytest.mark.e2e


async def why(api: Api, job_id: str) -> dict[str, Any]:
    response = await api.http.get(f"/v1/jobs/{job_id}/why")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_a_job_that_does_not_fit_says_why_and_where_it_stands(api: Api, settings: Settings) -> None:
    running = await api.submit(
        manifest("holder", learners=1, gpus=4, args=["--steps", "400", "--delay", "0.05"])
    )
    await api.wait(running, "RUNNING")
    waiting = await api.submit(
        manifest("waiter", learners=1, gpus=2, args=["--steps", "2", "--delay", "0.01"])
    )
    await api.wait_for(waiting, lambda job: job["waiting"] is not None, "the scheduler records why it waits")

    answer = await why(api, waiting)
    assert answer["state"] == "QUEUED" and answer["position"] == 1 and answer["queue_length"] == 1
    assert answer["waiting"]["code"] == "capacity"
    assert answer["summary"].startswith(f"{waiting} waits (capacity, position 1 of 1 in the queue)")
    assert answer["tenant_gpus_held"] == 4
    assert answer["tenant_counts_as_gpus"] == 4  # no more CPU or memory per GPU than the nodes have

    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["why", waiting], env={"FFDL_API": settings.api}
    )
    assert result.exit_code == 0, result.output
    assert "waits (capacity" in result.output and "4 GPU(s) held now" in result.output
    as_json = await asyncio.to_thread(
        CliRunner().invoke, app, ["why", waiting, "--json"], env={"FFDL_API": settings.api}
    )
    text = "\n" + as_json.output  # the platform's own log lines may come first
    printed = text[text.index("\n{") + 1 :]
    assert json.loads(printed)["waiting"]["code"] == "capacity"

    await api.http.delete(f"/v1/jobs/{running}")
    await api.wait(waiting, "COMPLETED", released=True)
    done = await why(api, waiting)
    assert done["waiting"] is None and done["summary"].startswith(f"{waiting} is COMPLETED")
    assert (await api.http.get("/v1/jobs/no-such-job/why")).status_code == 404
