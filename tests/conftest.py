"""Shared fixtures: the whole platform on embedded backends, real learner processes, real HTTP.

Tests override ``settings`` to point the platform at real services (Kafka, etcd, Mosquitto).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import settings

from ffdl import native
from ffdl.adapters.bus import open_bus
from ffdl.cli.serve import api_server
from ffdl.handlers.ports import Bus
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings
from tests.services import EtcdServer, TansuBroker

# No example is failed for its time (Hypothesis' default: 200 ms): a loaded CI machine's pause of a
# test process is no defect of the code under test. Time is measured by the benchmarks.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure() -> None:
    """The tests' learner programs (``tests/learners``) are on the import path of every platform the
    tests start, in this process or as ``python -m ffdl.cli up``: an operator's import path is what
    every sandbox reads. The working directory Python puts first under ``-m`` is not (it is where
    the platform was started from: ``/root`` would show root's keys to every learner)."""
    root = str(Path(__file__).parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``interpreted`` patches or subclasses what the planner's compiled modules call
    directly (``ffdl.native``): where they are compiled in this process, it runs in a pytest of its
    own on the sources, and passes or fails as that does. In place, its patch would not take, and it
    would pass whatever the planner did."""
    if pyfuncitem.get_closest_marker("interpreted") is None or not native.active():
        return None
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", pyfuncitem.nodeid],
        cwd=pyfuncitem.config.rootpath,
        env={**os.environ, native.SWITCH: "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    if ran.returncode != 0:
        said = ran.stdout[-6000:] + ran.stderr[-2000:]
        pytest.fail(f"on the sources ({native.SWITCH}=0):\n{said}", pytrace=False)
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``long`` (minutes each) first: the suite runs in two processes that each take
    whole files in turn (``make test``), and one that starts the longest file last finishes minutes
    after the other has run out of work."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[Bus]:
    """An embedded log of one partition, started, in the test's directory."""
    log = open_bus(f"embedded://{tmp_path}", 1)
    await log.start()
    yield log
    await log.close()


@pytest.fixture
async def settings(tmp_path: Path) -> Settings:
    return fast_settings(tmp_path / "ffdl")


@pytest.fixture
async def platform(settings: Settings) -> AsyncIterator[Platform]:
    async with Platform(settings) as running:
        yield running


@pytest.fixture
async def api(platform: Platform) -> AsyncIterator[Api]:
    server = api_server(platform, platform.settings.api, open_api=True)
    serving = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=platform.settings.api, timeout=30) as client:
        for _ in range(200):
            try:
                if (await client.get("/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        yield Api(client, server.config.app)
    server.should_exit = True
    await serving


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd per test module (chaos tests freeze or kill it: no module sees another's)."""
    server = EtcdServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def broker() -> Iterator[TansuBroker]:
    """A real Kafka-protocol broker (tansu) per test module; each test names topics of its own."""
    server = TansuBroker()
    server.start()
    yield server
    server.stop()
