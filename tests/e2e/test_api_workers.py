"""``ffdl up`` with several API worker processes: they share the API's port, a follower in a worker is
woken by the projector's progress in another process, a worker that dies is started again, and none
outlives the platform, whether it is stopped (SIGTERM) or killed (SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest

from ffdl.wiring.config import Settings
from tests.harness import fast_settings, learner_variables, manifest
from tests.services import wait_until, wait_until_async

pytestmark = pytest.mark.e2e

WORKERS = 2
START_S = 30.0
#: The longest a follower may take to show an event once the write that caused it was answered (the
#: projection had applied it then): a tick of the progress poll and a read, far below the 1 s a
#: follower would sleep between looks if nothing woke it.
PROMPT_S = 0.3


def environment(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "FFDL_DATA_DIR": str(settings.data_dir),
        "FFDL_API": settings.api,
        "FFDL_API_WORKERS": str(WORKERS),
        # cordoned: a job waits in the queue, to be halted and resumed at will
        "FFDL_NODES": '[{"name": "node-a", "gpus": 1, "schedulable": false}]',
        **learner_variables(settings),
    }


@contextmanager
def platform_process(settings: Settings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ffdl.cli", "up", "--open"],
            env=environment(settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def workers_of(parent: int) -> set[int]:
    """The API worker processes whose parent is ``parent``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"ffdl.cli.api_worker" in command:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl")


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=settings.api, timeout=30) as http:
        yield http


async def serving(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_workers_share_the_port_and_stop_with_the_platform(
    settings: Settings, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    with platform_process(settings, tmp_path / "platform.log") as platform:
        await wait_until_async(lambda: serving(client), START_S, what="the API")
        wait_until(lambda: len(workers_of(platform.pid)) == WORKERS, START_S, what="both workers")
        workers = workers_of(platform.pid)
        answers = await asyncio.gather(*(client.get("/v1/jobs") for _ in range(20)))
        assert {answer.status_code for answer in answers} == {200}

        platform.send_signal(signal.SIGTERM)
        assert platform.wait(30) == 0
        assert not any(alive(pid) for pid in workers)


async def test_workers_stop_when_the_platform_is_killed_and_its_port_is_free_again(
    settings: Settings, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    log = tmp_path / "platform.log"
    with platform_process(settings, log) as first:
        await wait_until_async(lambda: serving(client), START_S, what="the API")
        wait_until(lambda: len(workers_of(first.pid)) == WORKERS, START_S, what="both workers")
        workers = workers_of(first.pid)
        first.kill()
        first.wait()
        wait_until(lambda: not any(alive(pid) for pid in workers), 10, what="the orphaned workers to stop")
    with platform_process(settings, log) as second:
        await wait_until_async(lambda: serving(client), START_S, what="the API started again")
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0


async def test_a_worker_that_dies_is_started_again(
    settings: Settings, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    with platform_process(settings, tmp_path / "platform.log") as platform:
        await wait_until_async(lambda: serving(client), START_S, what="the API")
        wait_until(lambda: len(workers_of(platform.pid)) == WORKERS, START_S, what="both workers")
        victim = min(workers_of(platform.pid))
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(workers_of(platform.pid) - {victim}) == WORKERS, START_S, what="a new worker")
        assert (await client.get("/v1/jobs")).status_code == 200
        platform.send_signal(signal.SIGTERM)
        assert platform.wait(30) == 0


async def test_a_follower_sees_each_event_promptly_though_the_projector_runs_in_another_process(
    settings: Settings, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    with platform_process(settings, tmp_path / "platform.log") as platform:
        await wait_until_async(lambda: serving(client), START_S, what="the API")
        submitted = await client.post("/v1/jobs", content=manifest("waits", learners=1, gpus=1))
        job_id = submitted.json()["job_id"]
        shown: dict[str, float] = {}

        async def follow() -> None:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true"}) as events:
                async for line in events.aiter_lines():
                    if line.startswith("data: "):
                        shown[json.loads(line[6:])["position"]] = time.monotonic()

        follower = asyncio.create_task(follow())
        delays = []
        for action in ("halt", "resume") * 3:
            await asyncio.sleep(0.2)  # the follower is back asleep, waiting for the next change
            position = (await client.post(f"/v1/jobs/{job_id}:{action}")).json()["position"]
            answered = time.monotonic()
            streamed = partial(operator.contains, shown, position)
            await wait_until_async(streamed, 5, what=f"the {action} streamed")
            delays.append(shown[position] - answered)
        follower.cancel()
        assert max(delays) < PROMPT_S, delays
        platform.send_signal(signal.SIGTERM)
        assert platform.wait(30) == 0
