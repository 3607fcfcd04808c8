"""MQTT against a real Mosquitto: retained status per job out, learner telemetry in."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomqtt
import pytest

from ffdl.handlers.notifier import status_topic
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings, manifest
from tests.services import MosquittoServer, wait_until_async

pytestmark = pytest.mark.integration

QUICK = ["--steps", "8", "--delay", "0.02"]


@pytest.fixture(scope="module")
def mosquitto() -> Iterator[MosquittoServer]:
    server = MosquittoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def settings(tmp_path: Path, mosquitto: MosquittoServer) -> Settings:
    return fast_settings(tmp_path / "ffdl", mqtt=mosquitto.url)


@pytest.fixture
async def platform(settings: Settings) -> AsyncIterator[Platform]:
    async with Platform(settings) as running:
        yield running


def mosquitto_sub(server: MosquittoServer, topic: str, wait_s: int = 5) -> subprocess.CompletedProcess[str]:
    """Read one message with Mosquitto's own client (one we did not write)."""
    return subprocess.run(
        [
            "mosquitto_sub",
            "-h",
            server.host,
            "-p",
            str(server.port),
            "-t",
            topic,
            "-C",
            "1",
            "-W",
            str(wait_s),
            "-q",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=wait_s + 5,
        check=False,
    )


async def test_every_transition_is_published_and_the_last_status_is_retained(
    api: Api, mosquitto: MosquittoServer
) -> None:
    states: list[str] = []
    async with aiomqtt.Client(mosquitto.host, mosquitto.port) as client:
        await client.subscribe("ffdl/default/jobs/+/status", qos=1)
        job_id = await api.submit(manifest("mqtt", learners=1, args=QUICK))

        async def collect() -> None:
            async for message in client.messages:
                status = json.loads(message.payload)  # type: ignore[arg-type]
                if status["job_id"] == job_id:
                    states.append(status["state"])
                    if status["state"] == "COMPLETED":
                        return

        await asyncio.wait_for(collect(), 60)
    assert (
        states
        == ["SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING", "RUNNING", "STORING", "COMPLETED"][
            -len(states) :
        ]
    )
    assert states[-1] == "COMPLETED" and len(states) >= 5
    read = await asyncio.to_thread(mosquitto_sub, mosquitto, status_topic("default", job_id))
    assert read.returncode == 0, read.stderr
    retained = json.loads(read.stdout)
    assert (
        retained["state"] == "COMPLETED" and retained["tenant"] == "default" and retained["job_id"] == job_id
    )


async def test_deleting_a_job_clears_its_retained_status(api: Api, mosquitto: MosquittoServer) -> None:
    job_id = await api.submit(manifest("mqtt-gone", learners=1, args=QUICK))
    await api.wait(job_id, "COMPLETED", released=True)
    topic = status_topic("default", job_id)

    async def retained_completed() -> bool:
        read = await asyncio.to_thread(mosquitto_sub, mosquitto, topic, 1)
        return read.returncode == 0 and json.loads(read.stdout)["state"] == "COMPLETED"

    await wait_until_async(retained_completed, 15, what="the retained COMPLETED status")
    assert (await api.http.post(f"/v1/jobs/{job_id}:delete")).status_code == 202

    async def cleared() -> bool:
        return (await asyncio.to_thread(mosquitto_sub, mosquitto, topic, 1)).returncode != 0

    await wait_until_async(cleared, 15, what="the retained status to be cleared")


async def test_learner_telemetry_over_mqtt_is_progress(api: Api, mosquitto: MosquittoServer) -> None:
    quiet = f"{sys.executable} -c 'import time; time.sleep(120)'"
    job_id = await api.submit(f'name: quiet\nlearners: 1\ngpus: 1\ncommand: "{quiet}"\n')
    await api.wait(job_id, "RUNNING")
    payload = json.dumps({"attempt": 1, "step": 7, "metrics": {"loss": 0.5}})
    await asyncio.to_thread(
        subprocess.run,
        [
            "mosquitto_pub",
            "-h",
            mosquitto.host,
            "-p",
            str(mosquitto.port),
            "-q",
            "1",
            "-t",
            f"ffdl/default/jobs/{job_id}/learners/0/progress",
            "-m",
            payload,
        ],
        check=True,
        timeout=10,
    )
    job = await api.wait_for(job_id, lambda j: j["learners"][0]["step"] == 7, "step 7 from MQTT")
    assert job["learners"][0]["metrics"] == {"loss": 0.5}
    foreign = json.dumps({"attempt": 1, "step": 99})
    await asyncio.to_thread(
        subprocess.run,
        [
            "mosquitto_pub",
            "-h",
            mosquitto.host,
            "-p",
            str(mosquitto.port),
            "-q",
            "1",
            "-t",
            f"ffdl/intruder/jobs/{job_id}/learners/0/progress",
            "-m",
            foreign,
        ],
        check=True,
        timeout=10,
    )
    history = await api.wait_for(job_id, lambda j: True, "read")
    await api.http.delete(f"/v1/jobs/{job_id}")
    events = (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    assert history["learners"][0]["step"] != 99
    assert all(e["data"].get("step") != 99 for e in events)


def mosquitto_pub(server: MosquittoServer, topic: str, payload: str, *, retain: bool = False) -> None:
    retained = ["-r"] if retain else []
    where = ["-h", server.host, "-p", str(server.port)]
    subprocess.run(
        ["mosquitto_pub", *where, "-q", "1", *retained, "-t", topic, "-m", payload], check=True, timeout=10
    )


async def test_retained_poison_telemetry_leaves_the_bridge_running(
    api: Api, mosquitto: MosquittoServer
) -> None:
    quiet = f"{sys.executable} -c 'import time; time.sleep(120)'"
    job_id = await api.submit(f'name: poisoned\nlearners: 1\ngpus: 1\ncommand: "{quiet}"\n')
    await api.wait(job_id, "RUNNING")
    # Retained, so the broker hands them to the bridge again on every subscribe (a reconnect too).
    progress = f"ffdl/default/jobs/{job_id}/learners/0/progress"
    poison = {
        f"ffdl//jobs/{job_id}/learners/0/progress": '{"attempt": 1, "step": 1}',  # empty tenant
        f"ffdl/default/jobs/{job_id}/learners/²/progress": '{"attempt": 1, "step": 1}',  # no rank
        progress: '{"attempt": 1, "step": 1, "metrics": {"loss": NaN}}',  # not a finite number
        f"ffdl/default/jobs/node:{job_id}/learners/0/progress": '{"attempt": 1, "step": 1}',  # a node key
        f"ffdl/default/jobs/{job_id}/learners/1/progress": "\xff not JSON",
    }
    try:
        for topic, payload in poison.items():
            await asyncio.to_thread(mosquitto_pub, mosquitto, topic, payload, retain=True)
        honest = json.dumps({"attempt": 1, "step": 11})
        await asyncio.to_thread(
            mosquitto_pub, mosquitto, f"ffdl/default/jobs/{job_id}/learners/0/progress", honest
        )
        job = await api.wait_for(job_id, lambda j: j["learners"][0]["step"] == 11, "step 11 after the poison")
        assert job["learners"][0]["metrics"] == {}
    finally:
        for topic in poison:  # an empty retained message clears the retained one
            await asyncio.to_thread(mosquitto_pub, mosquitto, topic, "", retain=True)
