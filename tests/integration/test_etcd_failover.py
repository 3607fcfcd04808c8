"""The scheduler's leader killed with SIGKILL during a burst of submissions, a candidate waiting.

Three ``ffdl up`` processes share one event log (the embedded log in a shared data dir, or a
Kafka-protocol broker) and one etcd: the workers with the API, and two scheduler processes, one
leading, one campaigning. The
leader is killed mid-burst. The candidate must lead within the lease TTL, every job must still
run to the end, and the log must hold no GPU held twice and no stale fencing token.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aetcd
import httpx
import pytest

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election_etcd import leader_key
from ffdl.core.invariants import InvariantChecker
from ffdl.handlers.messaging import Topics
from ffdl.handlers.owner import SCHEDULER_ROLE
from ffdl.tools.log_reading import merged_events
from ffdl.tools.sre import verify_log
from ffdl.wiring.config import Settings
from tests.harness import TERMINAL, fast_settings, learner_variables, manifest
from tests.services import EtcdServer, TansuBroker, wait_until_async

pytestmark = pytest.mark.integration

LEADER_TTL_S = 2.0
SLACK_S = 3.0  # six processes share two CPUs: the takeover measured up to 2.45 s under load
JOBS = 8
KILL_AFTER = 3


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """A fresh etcd per test, not per module: each test must start with no leader, and a killed
    leader's election key outlives it until its lease expires."""
    server = EtcdServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["embedded", "kafka"])
def bus_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The log the processes share: None for the embedded one in their data dir, or a broker's URL."""
    if request.param == "embedded":
        yield None
        return
    broker = TansuBroker()
    broker.start()
    yield broker.url
    broker.stop()


class Processes:
    """``ffdl up`` processes started by a test; whatever is still running at the end is stopped."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self._env = env
        self._logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def up(self, name: str, roles: str) -> subprocess.Popen[bytes]:
        with (self._logs / f"{name}.log").open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "ffdl.cli", "up", "--open", "--roles", roles],
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        return (self._logs / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def leader(client: aetcd.Client) -> tuple[str, int] | None:
    """Who leads the scheduler (its identity, ``host-pid``) and its fencing token."""
    held = await client.get(leader_key(SCHEDULER_ROLE).encode())
    return None if held is None else (bytes(held.value).decode(), int(held.create_revision))


async def led_by(client: aetcd.Client, process: subprocess.Popen[bytes]) -> bool:
    held = await leader(client)
    return held is not None and held[0].endswith(f"-{process.pid}")


async def test_killing_the_scheduler_leader_mid_burst_hands_over_within_the_ttl_and_loses_nothing(
    tmp_path: Path, etcd_server: EtcdServer, bus_url: str | None
) -> None:
    settings: Settings = fast_settings(
        tmp_path / "ffdl", heartbeats=etcd_server.url, leader_ttl_s=LEADER_TTL_S, bus=bus_url
    )
    env = {
        **os.environ,
        "FFDL_BUS": settings.bus_url,
        "FFDL_DATA_DIR": str(settings.data_dir),
        "FFDL_API": settings.api,
        "FFDL_HEARTBEATS": etcd_server.url,
        "FFDL_HEARTBEAT_TTL_S": "1",
        "FFDL_LEADER_TTL_S": str(LEADER_TTL_S),
        "FFDL_MONITOR_GRACE_S": "3",
        "FFDL_STOP_GRACE_S": "3",
        "FFDL_RESTART_BACKOFF_BASE_S": "0.2",
        "FFDL_PARTITIONS": str(settings.partitions),
        "FFDL_NODES": json.dumps([{"name": "node-a", "gpus": 4}]),
        "FFDL_LOG_FORMAT": "json",
        **learner_variables(settings),
        # Short Kafka sessions: tansu holds a group join for about half the session timeout.
        "FFDL_KAFKA__SESSION_TIMEOUT_S": "2",
        "FFDL_KAFKA__HEARTBEAT_INTERVAL_S": "0.2",
    }
    processes = Processes(env, tmp_path)
    client = aetcd.Client(etcd_server.host, etcd_server.port, timeout=2)
    try:
        processes.up("workers", "api,workers,projector")
        first = processes.up("scheduler-1", "scheduler")
        await wait_until_async(lambda: led_by(client, first), 30, what="the first scheduler leading")
        held = await leader(client)
        assert held is not None
        first_token = held[1]
        second = processes.up("scheduler-2", "scheduler")
        await wait_until_async(lambda: "ffdl is up" in processes.log("scheduler-2"), 30, what="the candidate")
        async with httpx.AsyncClient(base_url=settings.api, timeout=30) as http:
            await wait_until_async(lambda: api_up(http), 30, what="the API")
            job_ids: list[str] = []
            killed_at = 0.0
            for index in range(JOBS):
                if index == KILL_AFTER:
                    first.send_signal(signal.SIGKILL)
                    killed_at = time.monotonic()
                text = manifest(f"burst-{index}", learners=1, args=["--steps", "8", "--delay", "0.02"])
                response = await http.post(
                    "/v1/jobs", content=text, headers={"Content-Type": "application/yaml"}
                )
                assert response.status_code == 201, response.text
                job_ids.append(response.json()["job_id"])

            await wait_until_async(
                lambda: led_by(client, second), LEADER_TTL_S + SLACK_S, what="the takeover"
            )
            took_over_s = time.monotonic() - killed_at
            held = await leader(client)
            assert held is not None and held[1] > first_token
            assert took_over_s <= LEADER_TTL_S + SLACK_S

            async def all_ended() -> bool:
                jobs = [(await http.get(f"/v1/jobs/{job_id}")).json() for job_id in job_ids]
                return all(job["state"] in TERMINAL and job["placement"] is None for job in jobs)

            await wait_until_async(all_ended, 60, interval_s=0.2, what="every job ended")
            states = [(await http.get(f"/v1/jobs/{job_id}")).json()["state"] for job_id in job_ids]
        assert states == ["COMPLETED"] * JOBS
    finally:
        await client.close()
        processes.stop_all()

    report = await verify_log(settings)
    assert report["violations"] == []
    assert report["jobs"] == JOBS
    assert await fencing_violations_across_jobs(settings) == []


async def api_up(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def fencing_violations_across_jobs(settings: Settings) -> list[str]:
    """The checker fed with each event's partition, so that it compares tokens across jobs too."""
    bus = open_bus(settings.bus_url, settings.partitions)
    await bus.start()
    checker = InvariantChecker()
    try:
        async for logged in merged_events(bus, Topics.with_prefix(settings.topic_prefix).events):
            checker.feed(logged.event, logged.position, partition=logged.partition)
    finally:
        await bus.close()
    return [f"{v.kind} {v.job_id} {v.detail}" for v in checker.finish()]
