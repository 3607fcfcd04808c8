"""``ffdl up``: the platform's roles and its HTTP API in one event loop, until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from urllib.parse import urlparse

import structlog
import uvicorn

from ffdl.adapters.tenants import TenantError, TenantRegistry
from ffdl.api.app import create_app
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import ALL_ROLES, Platform

log = structlog.get_logger(__name__)


def api_server(platform: Platform, api_url: str, *, open_api: bool = False) -> uvicorn.Server:
    address = urlparse(api_url)
    config = uvicorn.Config(
        create_app(platform, open_api=open_api),
        host=address.hostname or "127.0.0.1",
        port=address.port or 8080,
        log_level="warning",
        lifespan="off",
    )
    return uvicorn.Server(config)


async def serve(settings: Settings, roles: frozenset[str] | None = None, *, open_api: bool = False) -> None:
    """Run ``roles`` until SIGINT/SIGTERM. The API is served only with tenants, or with none when
    ``open_api`` (``--open``) says so: raises :class:`TenantError` before anything starts otherwise."""
    roles = roles or ALL_ROLES
    tenants = TenantRegistry(settings.tenants_path, allow_open=open_api)
    if "api" in roles and (problem := tenants.unservable()):
        raise TenantError(f"refusing to serve the API: {problem}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Platform(settings, roles) as platform:
        server = api_server(platform, settings.api, open_api=open_api) if "api" in roles else None
        task = asyncio.create_task(server.serve()) if server else None
        print(f"ffdl is up: roles {','.join(sorted(roles))}")
        if server:
            print(f"  API       {settings.api}")
            if tenants.open:
                print(
                    f"WARNING: --open and no tenant: the API at {settings.api} is OPEN, every caller acts "
                    "as an admin (add one with `ffdl tenants add NAME --admin` to close it)",
                    file=sys.stderr,
                )
        print(f"  event log {settings.bus_url}")
        print(f"  data dir  {settings.data_dir.resolve()}")
        await stop.wait()
        if server and task:
            server.should_exit = True
            await task
