"""Scale-out on Kafka: jobs flow through several worker processes, and one of them dies with SIGKILL.

Four ``ffdl up`` processes share one broker and one data directory: three run only the ``workers``
role (job owners, reactors and monitors, sharing the partitions through their consumer groups, with
instant learners), one runs ``api,scheduler,projector``. 200 jobs are submitted through the API;
once some have completed, a worker that owns partitions is killed with SIGKILL. Its partitions move
to the survivors after its session times out; they fold the log and carry on from the committed
offsets: every job completes, the projection holds each job's events once, ``ffdl verify`` finds
nothing wrong with the log, and projections rebuilt from Kafka equal the live ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ffdl.tools.sre import rebuild_projections, verify_log
from ffdl.wiring.config import KafkaConfig, NodeConfig, Settings
from tests.services import TansuBroker, free_port, wait_until_async

pytestmark = pytest.mark.integration

JOBS = 200
WORKERS = 3
KILL_AFTER_COMPLETED = 50
JOB = "name: scale\ncommand: 'true'\nlearners: 1\ngpus: 1\n"


@pytest.fixture
def broker() -> Iterator[TansuBroker]:
    server = TansuBroker()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The ``ffdl up`` processes a test starts; any still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def platform_settings(tmp_path: Path, broker: TansuBroker) -> Settings:
    return Settings(
        data_dir=tmp_path / "ffdl",
        api=f"http://127.0.0.1:{free_port()}",
        bus=broker.url,
        topic_prefix=f"scale-{uuid.uuid4().hex[:8]}",
        partitions=8,
        launcher="instant",
        nodes=[NodeConfig(name="node-a", gpus=64)],
        kafka=KafkaConfig(session_timeout_s=3.0, heartbeat_interval_s=0.3),
    )


def environment(settings: Settings) -> dict[str, str]:
    assert settings.nodes is not None
    return {
        **os.environ,
        "FFDL_DATA_DIR": str(settings.data_dir),
        "FFDL_API": settings.api,
        "FFDL_BUS": settings.bus_url,
        "FFDL_TOPIC_PREFIX": settings.topic_prefix,
        "FFDL_PARTITIONS": str(settings.partitions),
        "FFDL_LAUNCHER": settings.launcher,
        "FFDL_NODES": json.dumps([node.model_dump() for node in settings.nodes]),
        "FFDL_KAFKA__SESSION_TIMEOUT_S": str(settings.kafka.session_timeout_s),
        "FFDL_KAFKA__HEARTBEAT_INTERVAL_S": str(settings.kafka.heartbeat_interval_s),
        "FFDL_LOG_FORMAT": "json",
    }


def start(roles: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ffdl.cli", "up", "--open", "--roles", roles],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def owned_partitions(log: Path) -> list[int]:
    """The command partitions a worker last said it owns, from its log."""
    owned: list[int] = []
    for line in log.read_text(errors="replace").splitlines():
        if '"owning partitions"' in line:
            owned = json.loads(line)["partitions"]
    return owned


async def api_ready(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def caught_up(client: httpx.AsyncClient) -> bool:
    """Whether the API's projection has applied every event on the log now (readiness only says it
    caught up with the log's end as it was when the API was first asked)."""
    try:
        response = await client.get("/readyz")
    except httpx.TransportError:
        return False
    return response.status_code == 200 and response.json()["behind"] == {}


async def count_in_state(client: httpx.AsyncClient, state: str) -> int:
    response = await client.get("/v1/jobs", params={"state": state, "limit": 500})
    return len(response.json()["jobs"])


async def test_jobs_complete_across_worker_processes_when_one_is_killed_with_sigkill(
    tmp_path: Path, broker: TansuBroker, processes: list[subprocess.Popen[bytes]]
) -> None:
    settings = platform_settings(tmp_path, broker)
    env = environment(settings)
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    processes.extend(start("workers", env, log) for log in logs)
    processes.append(start("api,scheduler,projector", env, tmp_path / "api.log"))
    workers = processes[:WORKERS]

    async with httpx.AsyncClient(base_url=settings.api, timeout=30) as client:
        await wait_until_async(lambda: api_ready(client), 60, interval_s=0.2, what="the API")
        await wait_until_async(
            lambda: all(owned_partitions(log) for log in logs), 60, interval_s=0.2, what="every worker owning"
        )
        gate = asyncio.Semaphore(20)

        async def submit() -> str:
            async with gate:
                response = await client.post("/v1/jobs", content=JOB)
                assert response.status_code == 201, response.text
                return str(response.json()["job_id"])

        submitting = asyncio.gather(*(submit() for _ in range(JOBS)))

        async def enough_completed() -> bool:
            return await count_in_state(client, "COMPLETED") >= KILL_AFTER_COMPLETED

        await wait_until_async(
            enough_completed, 60, interval_s=0.1, what=f"{KILL_AFTER_COMPLETED} jobs completed"
        )
        victim = workers[0]
        assert owned_partitions(logs[0]), "the worker to kill owns no partition: the kill would prove nothing"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert await count_in_state(client, "COMPLETED") < JOBS, "every job completed before the kill"
        job_ids = await submitting

        async def all_completed_and_projected() -> bool:
            return await count_in_state(client, "COMPLETED") == JOBS and await caught_up(client)

        await wait_until_async(
            all_completed_and_projected, 60, interval_s=0.25, what=f"{JOBS} jobs completed"
        )
        survivors_took_over = sorted(p for log in logs[1:] for p in owned_partitions(log))
        assert survivors_took_over == list(range(settings.partitions))
        for job_id in job_ids:
            job = (await client.get(f"/v1/jobs/{job_id}")).json()
            assert job["state"] == "COMPLETED"
            assert job["placement"] is None, f"{job_id} still holds GPUs"
            events = (await client.get(f"/v1/jobs/{job_id}/events")).json()["events"]
            assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
            assert [event["type"] for event in events].count("JobCompleted") == 1

    report = await verify_log(settings)
    assert report["violations"] == []
    assert report["jobs"] == JOBS
    rebuilt = await rebuild_projections(settings)
    assert rebuilt["identical"] is True
