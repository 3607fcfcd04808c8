"""A tenant whose job is preempted for another tenant's is told why, never by whom: the log and an
admin keep the preempting job's id, while every read of acme's (the job, its events, the list,
the time machine, the live job list) shows "another tenant's job" in its place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.redaction import ANOTHER_JOB
from ffdl.wiring.config import SchedulerConfig, Settings
from tests.e2e.test_api_hostile import as_admin, bearer
from tests.harness import Api, fast_settings, manifest

pytestmark = pytest.mark.e2e

LONG = ["--steps", "2000", "--delay", "0.05"]


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl", scheduler=SchedulerConfig(preemption=True, min_runtime_s=0))


async def test_a_preempted_tenant_is_not_told_which_job_preempted_it(api: Api, settings: Settings) -> None:
    registry = TenantRegistry(settings.tenants_path)
    acme, globex, sre = registry.add("acme"), registry.add("globex"), registry.add("sre", admin=True)

    async def submit(token: str, name: str, priority: int, args: list[str]) -> str:
        text = manifest(name, learners=1, gpus=4, args=args, priority=priority)
        response = await api.http.post("/v1/jobs", content=text, headers=bearer(token))
        assert response.status_code == 201, response.text
        return str(response.json()["job_id"])

    async with as_admin(api, sre) as admin:
        victim = await submit(acme, "victim", 0, LONG)
        await admin.wait(victim, "RUNNING")
        urgent = await submit(globex, "urgent", 10, LONG)
        await admin.wait(urgent, "RUNNING")
        truth = await admin.http.get(f"/v1/jobs/{victim}/events")
    reasons = [event["data"].get("reason") for event in truth.json()["events"]]
    assert f"preempted by job {urgent} (priority 10 over 0)" in reasons, reasons  # the log and an admin

    shown = {}
    for path in (
        f"/v1/jobs/{victim}",
        f"/v1/jobs/{victim}/events",
        f"/v1/jobs/{victim}/why",
        "/v1/jobs",
        "/v1/timemachine",
    ):
        response = await api.http.get(path, headers=bearer(acme))
        assert response.status_code == 200, (path, response.text)
        shown[path] = response.text
        assert urgent not in response.text, f"{path} names globex's job to acme"
        assert "globex" not in response.text, f"{path} names globex to acme"
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
