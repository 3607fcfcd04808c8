"""The platform process killed with SIGKILL mid-job and started again: nothing is lost or stuck."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ffdl.tools.sre import rebuild_projections, verify_log
from tests.harness import TERMINAL, fast_settings, learner_variables, manifest
from tests.services import wait_until_async

pytestmark = pytest.mark.e2e


def start_platform(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ffdl.cli", "up", "--open"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def api_up(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_platform_killed_mid_job_adopts_live_learners_and_finishes(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path / "ffdl", monitor_grace_s=4.0)
    env = {
        **os.environ,
        "FFDL_DATA_DIR": str(settings.data_dir),
        "FFDL_API": settings.api,
        "FFDL_HEARTBEAT_TTL_S": "1",
        "FFDL_MONITOR_GRACE_S": "4",
        "FFDL_STOP_GRACE_S": "3",
        "FFDL_RESTART_BACKOFF_BASE_S": "0.2",
        "FFDL_PARTITIONS": "4",
        "FFDL_NODES": '[{"name": "node-a", "gpus": 4}]',
        "FFDL_LOG_FORMAT": "json",
        **learner_variables(settings),
    }
    log = tmp_path / "platform.log"
    first = start_platform(env, log)
    try:
        async with httpx.AsyncClient(base_url=settings.api, timeout=30) as client:
            await wait_until_async(lambda: api_up(client), 30, what="the API")
            survivor = (
                await client.post(
                    "/v1/jobs",
                    content=manifest("survivor", learners=2, args=["--steps", "120", "--delay", "0.05"]),
                    headers={"Content-Type": "application/yaml"},
                )
            ).json()["job_id"]
            victim = (
                await client.post(
                    "/v1/jobs",
                    content=manifest("victim", learners=1, args=["--steps", "120", "--delay", "0.05"]),
                    headers={"Content-Type": "application/yaml"},
                )
            ).json()["job_id"]

            async def both_running() -> bool:
                jobs = [(await client.get(f"/v1/jobs/{j}")).json() for j in (survivor, victim)]
                return all(j["state"] == "RUNNING" and j["learners"][0]["step"] >= 10 for j in jobs)

            await wait_until_async(both_running, 60, what="both jobs running")
            victim_doc = (await client.get(f"/v1/jobs/{victim}")).json()
            survivor_doc = (await client.get(f"/v1/jobs/{survivor}")).json()
            first.send_signal(signal.SIGKILL)
            first.wait()
            # While the platform is down one learner dies too: its job must restart, not hang.
            os.kill(victim_doc["learners"][0]["pid"], signal.SIGKILL)
            survivor_pids = [learner["pid"] for learner in survivor_doc["learners"]]
            assert all(os.path.exists(f"/proc/{pid}") for pid in survivor_pids), (  # noqa: ASYNC240
                "learners outlive the platform"
            )

            second = start_platform(env, log)
            try:
                await wait_until_async(lambda: api_up(client), 30, what="the API after restart")

                async def ended() -> bool:
                    jobs = [(await client.get(f"/v1/jobs/{j}")).json() for j in (survivor, victim)]
                    return all(j["state"] in TERMINAL and j["placement"] is None for j in jobs)

                await wait_until_async(ended, 90, interval_s=0.2, what="both jobs ended")
                survivor_doc = (await client.get(f"/v1/jobs/{survivor}")).json()
                victim_doc = (await client.get(f"/v1/jobs/{victim}")).json()
            finally:
                second.send_signal(signal.SIGTERM)
                await asyncio.to_thread(second.wait, 30)
    finally:
        if first.poll() is None:
            first.kill()
    assert survivor_doc["state"] == "COMPLETED" and survivor_doc["restarts"] == 0, "adopted, not restarted"
    assert victim_doc["state"] == "COMPLETED" and victim_doc["restarts"] == 1
    lost = next(e for e in victim_doc["history"] if e["state"] == "RESTARTING")
    assert "exited with code -9" in lost["reason"] or "lost (expired)" in lost["reason"]
    report = await verify_log(settings)
    assert report["violations"] == []
    rebuilt = await rebuild_projections(settings)
    assert rebuilt["identical"] is True
