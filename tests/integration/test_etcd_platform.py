"""The whole platform on etcd heartbeats: real learner agents leasing keys, the monitor watching them.

Every test runs the platform in this process (the shared ``api`` fixture, or twice in a row for the
restart) with ``FFDL_HEARTBEATS`` set to an etcd started for the module, a 1 s heartbeat TTL and a
3 s monitor grace, and ends with ``ffdl verify`` finding no violation. Learners are lost only where
a test makes them so: a clean exit, an etcd outage or a platform restart never shows up as
``LearnerLost``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import EtcdHeartbeatStore
from ffdl.cli.serve import api_server
from ffdl.events import job_events as ev
from ffdl.events.envelope import EventData
from ffdl.events.model import LossReason
from ffdl.handlers.messaging import Topics
from ffdl.tools.log_reading import merged_events
from ffdl.tools.sre import verify_log
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings, manifest
from tests.services import EtcdServer, wait_until_async

pytestmark = pytest.mark.integration

TTL_S = 1.0
GRACE_S = 3.0


@pytest.fixture
def settings(tmp_path: Path, etcd_server: EtcdServer) -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        heartbeats=etcd_server.url,
        heartbeat_ttl_s=TTL_S,
        monitor_grace_s=GRACE_S,
        leader_ttl_s=2.0,
    )


@asynccontextmanager
async def running_platform(settings: Settings) -> AsyncIterator[tuple[Platform, Api]]:
    """The platform and its HTTP API in this process, until the block ends (learners keep running)."""
    async with Platform(settings) as platform:
        server = api_server(platform, settings.api, open_api=True)
        serving = asyncio.create_task(server.serve())
        try:
            async with httpx.AsyncClient(base_url=settings.api, timeout=30) as client:
                await wait_until_async(lambda: api_up(client), 30, what="the API")
                app = server.config.app
                assert isinstance(app, FastAPI)
                yield platform, Api(client, app)
        finally:
            server.should_exit = True
            await serving


async def api_up(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def job_events(settings: Settings, job_id: str) -> list[EventData]:
    bus = open_bus(settings.bus_url, settings.partitions)
    await bus.start()
    try:
        topic = Topics.with_prefix(settings.topic_prefix).events
        return [logged.event.data async for logged in merged_events(bus, topic) if logged.event.key == job_id]
    finally:
        await bus.close()


async def losses(settings: Settings, job_id: str) -> list[ev.LearnerLost]:
    return [data for data in await job_events(settings, job_id) if isinstance(data, ev.LearnerLost)]


async def assert_log_clean(settings: Settings) -> None:
    report = await verify_log(settings)
    assert report["violations"] == []


def kill_learner_group(job: dict[str, Any], rank: int) -> None:
    """SIGKILL a learner's agent (its process group) and so its user process: the learner's pid is its
    sandbox's, the agent's child, and the sandbox dies with the agent."""
    pid = job["learners"][rank]["pid"]
    agent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.killpg(os.getpgid(agent), signal.SIGKILL)


def reason_of(job: dict[str, Any], state: str) -> str:
    return str(next(entry["reason"] for entry in job["history"] if entry["state"] == state))


def agent_log(settings: Settings, job_id: str, attempt: int, rank: int) -> str:
    return (settings.work_dir / job_id / "logs" / f"attempt-{attempt}" / f"agent-{rank}.log").read_text()


async def test_happy_path_leases_every_learner_and_revokes_on_exit(
    api: Api, settings: Settings, etcd_server: EtcdServer
) -> None:
    job_id = await api.submit(manifest("happy", args=["--steps", "20", "--delay", "0.02"]))
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert [learner["exit_code"] for learner in job["learners"]] == [0, 0]
    assert all(learner["step"] == 20 for learner in job["learners"])
    assert job["restarts"] == 0
    assert await losses(settings, job_id) == []
    # Both leases were revoked after the exit records were written (the exits were reported, no
    # learner was lost), and the monitor deleted the exit records once the job had moved past them:
    # nothing of the job is left in etcd.
    store = EtcdHeartbeatStore(etcd_server.host, etcd_server.port)
    try:

        async def nothing_left() -> bool:
            return (await store.snapshot(f"/ffdl/jobs/{job_id}/")).values == {}

        await wait_until_async(nothing_left, 5, what="no learner key and no exit record left")
    finally:
        await store.close()
    await assert_log_clean(settings)


async def test_a_learner_killed_with_its_agent_expires_and_restarts_from_its_checkpoint(
    api: Api, settings: Settings
) -> None:
    job_id = await api.submit(manifest("killed", args=["--steps", "80", "--delay", "0.04"]))
    running = await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and j["learners"][0]["step"] >= 12,
        "learner 0 passing step 12",
    )
    kill_learner_group(running, 1)
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert job["restarts"] == 1
    assert reason_of(job, "RESTARTING").startswith("learner 1 lost (expired)")
    lost = await losses(settings, job_id)
    assert [(loss.rank, loss.attempt, loss.reason) for loss in lost] == [(1, 1, LossReason.EXPIRED)]
    resumed = (settings.work_dir / job_id / "logs" / "attempt-2" / "learner-0.log").read_text()
    assert "resumed from step" in resumed and "resumed from step 0" not in resumed
    await assert_log_clean(settings)


async def test_a_learner_that_stops_progressing_is_lost_as_hung_and_restarted(
    api: Api, settings: Settings
) -> None:
    text = manifest(
        "hung", learners=1, args=["--steps", "30", "--delay", "0.02", "--hang-at", "10"], progress_timeout_s=2
    )
    job_id = await api.submit(text)
    job = await api.wait(job_id, "COMPLETED", released=True, timeout_s=60)
    assert reason_of(job, "RESTARTING").startswith("learner 0 lost (hung)")
    lost = await losses(settings, job_id)
    assert [(loss.rank, loss.attempt, loss.reason) for loss in lost] == [(0, 1, LossReason.HUNG)]
    await assert_log_clean(settings)


async def test_etcd_frozen_for_two_ttls_mid_run_fails_and_restarts_nothing(
    api: Api, settings: Settings, etcd_server: EtcdServer
) -> None:
    job_id = await api.submit(manifest("outage", args=["--steps", "100", "--delay", "0.04"]))
    await api.wait_for(
        job_id,
        lambda j: j["state"] == "RUNNING" and j["learners"][0]["step"] >= 10,
        "learner 0 passing step 10",
    )
    etcd_server.pause()
    try:
        await asyncio.sleep(2 * TTL_S)
    finally:
        etcd_server.resume()
    seen_at_thaw = await api.job(job_id)
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert job["restarts"] == 0 and job["attempt"] == 1
    assert await losses(settings, job_id) == []
    # The watch resumed: the monitor reported progress made after the outage, up to the last step.
    assert seen_at_thaw["learners"][0]["step"] < 100
    assert [learner["step"] for learner in job["learners"]] == [100, 100]
    # etcd expired the leases it could not renew while frozen; the agents took new ones.
    for rank in (0, 1):
        assert "heartbeat lease had expired: re-established" in agent_log(settings, job_id, 1, rank)
    await assert_log_clean(settings)


async def test_after_a_platform_restart_learners_get_a_grace_to_re_register(
    settings: Settings, etcd_server: EtcdServer
) -> None:
    """The platform stops; while it is down one learner finishes, one dies, and etcd freezes.

    The frozen etcd expires every lease when it thaws. The restarted monitor comes up before etcd
    is back: the live learners re-register within its grace and are adopted, the dead one is
    reaped after the grace, and the exit that happened while nobody watched is an exit, not a loss.
    """
    async with running_platform(settings) as (_, api):
        survivor = await api.submit(
            manifest("survivor", learners=2, args=["--steps", "250", "--delay", "0.04"])
        )
        victim = await api.submit(manifest("victim", learners=1, args=["--steps", "150", "--delay", "0.04"]))
        finisher = await api.submit(
            manifest("finisher", learners=1, args=["--steps", "40", "--delay", "0.04"])
        )
        for job_id in (survivor, victim, finisher):
            await api.wait_for(
                job_id,
                lambda j: j["state"] == "RUNNING" and j["learners"][0]["step"] >= 5,
                "running past step 5",
            )
        victim_doc = await api.job(victim)
    kill_learner_group(victim_doc, 0)
    finisher_agent_log = settings.work_dir / finisher / "logs" / "attempt-1" / "agent-0.log"
    await wait_until_async(
        lambda: "learner exited" in finisher_agent_log.read_text(), 10, what="the finisher's exit"
    )
    etcd_server.pause()
    try:
        async with running_platform(settings) as (_, api):
            await asyncio.sleep(2 * TTL_S)
            etcd_server.resume()
            docs = {
                job_id: await api.wait(job_id, "COMPLETED", released=True)
                for job_id in (survivor, victim, finisher)
            }
    finally:
        etcd_server.resume()
    assert docs[survivor]["restarts"] == 0, "adopted after re-registering, not reaped"
    for rank in (0, 1):
        assert "heartbeat lease had expired: re-established" in agent_log(settings, survivor, 1, rank)
    assert docs[finisher]["restarts"] == 0 and docs[finisher]["learners"][0]["exit_code"] == 0
    assert await losses(settings, survivor) == [] and await losses(settings, finisher) == []
    assert docs[victim]["restarts"] == 1
    assert reason_of(docs[victim], "RESTARTING").startswith("learner 0 lost (expired)")
    await assert_log_clean(settings)
