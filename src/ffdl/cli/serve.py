"""``ffdl up``: the platform's roles and its HTTP API in one event loop, until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from urllib.parse import urlparse

import structlog
import uvicorn

from ffdl.adapters.tenants import TenantRegistry
from ffdl.api.app import create_app
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import ALL_ROLES, Platform

log = structlog.get_logger(__name__)


def api_server(platform: Platform, api_url: str) -> uvicorn.Server:
    address = urlparse(api_url)
    config = uvicorn.Config(
        create_app(platform),
        host=address.hostname or "127.0.0.1",
        port=address.port or 8080,
        log_level="warning",
        lifespan="off",
    )
    return uvicorn.Server(config)


async def serve(settings: Settings, roles: frozenset[str] | None = None) -> None:
    roles = roles or ALL_ROLES
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Platform(settings, roles) as platform:
        server = api_server(platform, settings.api) if "api" in roles else None
        task = asyncio.create_task(server.serve()) if server else None
        print(f"ffdl is up: roles {','.join(sorted(roles))}")
        if server:
            print(f"  API       {settings.api}")
            if TenantRegistry(settings.tenants_path).open:
                print(
                    "  tenants   none configured: the API is OPEN to anyone who reaches it "
                    "(add one with `ffdl tenants add NAME`)"
                )
        print(f"  event log {settings.bus_url}")
        print(f"  data dir  {settings.data_dir.resolve()}")
        await stop.wait()
        if server and task:
            server.should_exit = True
            await task
