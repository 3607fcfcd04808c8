"""A tenant whose job is preempted for another tenant's is told why, never by whom: the log and an
admin keep the preempting job's id, while every read of acme's (the job, its events, the list,
the time machine, the live job list) shows "another tenant's job" in its place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffdl.api.redaction import ANOTHER_JOB
from ffdl.wiring.config import SchedulerConfig, Settings
from tests.e2e.test_api_hostile import (
    as_admin,
    bearer,
    read_without,
    submit_whole_node,
    two_tenants_and_an_admin,
)
from tests.harness import Api, fast_settings

pytestmark = pytest.mark.e2e

LONG = ["--steps", "2000", "--delay", "0.05"]


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", scheduler=SchedulerConfig(preemption=True, min_runtime_s=0))


async def test_a_preempted_tenant_is_not_told_which_job_preempted_it(api: Api, settings: Settings) -> None:
    acme, globex, sre = two_tenants_and_an_admin(settings)

    async with as_admin(api, sre) as admin:
        victim = await submit_whole_node(api, acme, "victim", 0, LONG)
        await admin.wait(victim, "RUNNING")
        urgent = await submit_whole_node(api, globex, "urgent", 10, LONG)
        await admin.wait(urgent, "RUNNING")
        await admin.wait(victim, "QUEUED")  # requeued, holding nothing
        truth = await admin.http.get(f"/v1/jobs/{victim}/events")
    reasons = [event["data"].get("reason") for event in truth.json()["events"]]
    assert f"preempted by job {urgent} (priority 10 over 0)" in reasons, reasons  # the log and an admin

    paths = [
        f"/v1/jobs/{victim}",
        f"/v1/jobs/{victim}/events",
        f"/v1/jobs/{victim}/why",
        "/v1/jobs",
        "/v1/timemachine",
    ]
    shown = await read_without(api, acme, paths, urgent, "globex")
    # the tenants' table of the time machine, with what each holds and counts as, is acme's alone
    tenants = json.loads(shown["/v1/timemachine"])["tenants"]
    assert [row["tenant"] for row in tenants] == ["acme"], tenants
    why = json.loads(shown[f"/v1/jobs/{victim}/why"])  # requeued: acme holds nothing, globex the node
    assert (why["state"], why["tenant_gpus_held"], why["tenant_counts_as_gpus"]) == ("QUEUED", 0, 0), why
    history = json.loads(shown[f"/v1/jobs/{victim}"])["history"]
    assert f"preempted by {ANOTHER_JOB} (priority 10 over 0)" in [entry["reason"] for entry in history]
    async with api.http.stream(
        "GET", "/v1/jobs:follow", params={"after": 0}, headers=bearer(acme)
    ) as live:  # the dashboard's live list, from the start
        async for line in live.aiter_lines():
            if line.startswith("data:") and victim in line:
                assert urgent not in line and ANOTHER_JOB in line, line
                break
    for job_id in (victim, urgent):
        await api.http.delete(f"/v1/jobs/{job_id}", headers=bearer(sre))
