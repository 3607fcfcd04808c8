"""``ffdl up`` serves the API only with tenants, or open on purpose (``--open``, with a warning); a
running API whose tenants file goes missing or breaks lets nobody in rather than everyone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.app import create_app
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import Platform
from tests.harness import fast_settings, learner_variables
from tests.services import wait_until

pytestmark = pytest.mark.e2e

START_S = 30.0


def environment(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "FFDL_DATA_DIR": str(settings.data_dir),
        "FFDL_API": settings.api,
        "FFDL_NODES": '[{"name": "node-a", "gpus": 1}]',
        **learner_variables(settings),
    }


def up(settings: Settings, *options: str) -> subprocess.CompletedProcess[str]:
    """``ffdl up`` that is expected to refuse to start: it must end by itself."""
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli", "up", *options],
        env=environment(settings),
        capture_output=True,
        text=True,
        timeout=START_S,
        check=False,
    )


def test_up_refuses_to_serve_the_api_without_tenants(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path / "ffdl")
    refused = up(settings)
    assert refused.returncode == 2
    assert "refusing to serve the API" in refused.stderr and "--open" in refused.stderr
    assert not settings.projection_path.exists()  # it refused before starting anything


def test_up_refuses_an_unreadable_tenants_file_even_with_open(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path / "ffdl")
    settings.data_dir.mkdir()
    settings.tenants_path.write_text("{broken")
    refused = up(settings, "--open")
    assert refused.returncode == 2
    assert "never runs open" in " ".join(refused.stderr.split())


def test_up_open_serves_the_api_and_warns_that_it_is_open(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path / "ffdl")
    process = subprocess.Popen(
        [sys.executable, "-m", "ffdl.cli", "up", "--open"],
        env=environment(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: healthy(settings.api), START_S, what="the API")
        assert httpx.get(f"{settings.api}/v1/jobs").status_code == 200  # open: no token needed
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=START_S)
    assert "WARNING: --open and no tenant" in errors and "OPEN" in errors


def healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
async def platform(settings: Settings) -> AsyncIterator[Platform]:
    async with Platform(settings, frozenset({"api", "projector"})) as running:
        yield running


@pytest.mark.parametrize("open_api", [False, True])
async def test_a_tenants_file_removed_or_broken_while_serving_lets_nobody_in(
    platform: Platform, settings: Settings, open_api: bool
) -> None:
    token = TenantRegistry(settings.tenants_path).add("acme", admin=True)
    transport = httpx.ASGITransport(app=create_app(platform, open_api=open_api))
    async with httpx.AsyncClient(transport=transport, base_url="http://ffdl") as http:
        assert (await http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})).status_code == 200
        settings.tenants_path.write_text("{broken")
        assert (await http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})).status_code == 401
        assert (await http.get("/v1/jobs")).status_code == 401
        settings.tenants_path.unlink()
        expected = 200 if open_api else 401  # open only where it was started open on purpose
        assert (await http.get("/v1/jobs")).status_code == expected
