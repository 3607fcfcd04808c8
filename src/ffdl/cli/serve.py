"""``ffdl up``: the platform's roles and its HTTP API, until SIGINT/SIGTERM.

The API is served by ``settings.api_processes`` processes. With one, it runs in the platform's own
event loop. With more, this process binds the API's socket and starts that many API workers
(:mod:`ffdl.cli.api_worker`), each accepting on the one socket with its own platform of the ``api``
role (a reader of the projection file, a sender of commands), while the other roles run here. The
kernel hands each connection to a worker that is waiting in ``accept``, so an idle worker takes the
next one. Workers are supervised like roles: one that exits unasked is started again after a
backoff. Stopping sends each SIGTERM (SIGKILL after :data:`WORKER_STOP_S`); a worker whose parent
died unasked reads the end of its stdin, a pipe only the parent holds, and exits at once: none
outlives it, nor serves for a platform that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import signal
import socket
import sys
from functools import partial
from urllib.parse import urlparse

import structlog
import uvicorn

from ffdl.adapters.tenants import TenantError, TenantRegistry
from ffdl.api.app import create_app
from ffdl.cli.guarded_http import guarded_protocol
from ffdl.handlers.aio import Backoff, supervise
from ffdl.wiring.config import Settings
from ffdl.wiring.platform import ALL_ROLES, HEALTHY_RUN_S, RETRY_MAX_S, Platform

log = structlog.get_logger(__name__)

#: Seconds an API request may still run once the server is told to stop (an open stream's, mostly).
GRACEFUL_SHUTDOWN_S = 5
#: Seconds a worker has to stop after SIGTERM before it is killed.
WORKER_STOP_S = GRACEFUL_SHUTDOWN_S + 10.0


def api_server(
    platform: Platform, api_url: str, *, open_api: bool = False, processes: int = 1
) -> uvicorn.Server:
    """The API of ``platform`` served at ``api_url``; ``processes``: how many serve it in all.

    Its HTTP protocol closes connections that take over ``api_header_timeout_s`` to send a request's
    headers and keeps at most ``api_max_connections`` open (:mod:`ffdl.cli.guarded_http`)."""
    address = urlparse(api_url)
    settings = platform.settings
    config = uvicorn.Config(
        create_app(platform, open_api=open_api, processes=processes),
        host=address.hostname or "127.0.0.1",
        port=address.port or 8080,
        http=guarded_protocol(settings.api_header_timeout_s, settings.api_max_connections),
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return uvicorn.Server(config)


def bind_api(api_url: str) -> socket.socket:
    """The API's listening socket, for workers to accept on."""
    address = urlparse(api_url)
    host = address.hostname or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, address.port or 8080), family=family, backlog=2048)


class ApiWorkers:
    """``count`` API worker processes accepting on ``listening``, each restarted if it exits unasked."""

    def __init__(self, settings: Settings, listening: socket.socket, count: int, *, open_api: bool) -> None:
        self._settings = settings
        self._listening = listening
        self._count = count
        self._open_api = open_api

    async def run(self, stop: asyncio.Event) -> None:
        """Run every worker until ``stop``; returns once all have exited."""
        async with asyncio.TaskGroup() as workers:
            for index in range(self._count):
                supervised = supervise(
                    f"api-{index}",
                    partial(self._run_one, index, stop),
                    stop,
                    backoff=Backoff(0.5, RETRY_MAX_S),
                    healthy_after_s=HEALTHY_RUN_S,
                )
                workers.create_task(supervised)

    async def _run_one(self, index: int, stop: asyncio.Event) -> None:
        fd = self._listening.fileno()
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ffdl.cli.api_worker",
            str(fd),
            stdin=asyncio.subprocess.PIPE,
            pass_fds=(fd,),
        )
        assert worker.stdin is not None
        # what the worker serves with; then the pipe stays open: its end is this process's end
        worker.stdin.write(pickle.dumps((self._settings, self._open_api, self._count)))
        await worker.stdin.drain()
        stopping = asyncio.create_task(stop.wait())
        exited = asyncio.create_task(worker.wait())
        await asyncio.wait({stopping, exited}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not exited.done():
            worker.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(exited), WORKER_STOP_S)
            except TimeoutError:
                log.warning("API worker did not stop; killing it", worker=index, pid=worker.pid)
                worker.kill()
                await exited
        worker.stdin.close()
        if not stop.is_set():
            raise RuntimeError(f"API worker {index} (pid {worker.pid}) exited with status {exited.result()}")


async def serve(settings: Settings, roles: frozenset[str] | None = None, *, open_api: bool = False) -> None:
    """Run ``roles`` until SIGINT/SIGTERM. The API is served only with tenants, or with none when
    ``open_api`` (``--open``) says so: raises :class:`TenantError` before anything starts otherwise."""
    roles = roles or ALL_ROLES
    if "workers" in roles and settings.launcher == "local" and settings.sandbox == "off":
        print(
            "WARNING: FFDL_SANDBOX=off (--no-sandbox): tenant code runs UNCONFINED on this machine: every "
            "learner sees the host's files and processes and other jobs' learners (docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
    elif "workers" in roles and settings.launcher == "local" and settings.sandbox_network == "host":
        print(
            "WARNING: FFDL_SANDBOX_NETWORK=host: learners share this machine's network: they reach every "
            "port of its loopback interface, other jobs' rendezvous ports included (docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
    tenants = TenantRegistry(settings.tenants_path, allow_open=open_api)
    if "api" in roles and (problem := tenants.unservable()):
        raise TenantError(f"refusing to serve the API: {problem}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    workers = settings.api_processes if "api" in roles else 0
    here = roles - {"api"} if workers > 1 else roles
    async with contextlib.AsyncExitStack() as running:
        platform = await running.enter_async_context(Platform(settings, here)) if here else None
        server: uvicorn.Server | None = None
        serving: asyncio.Task[None] | None = None
        if platform is not None and "api" in here:
            server = api_server(platform, settings.api, open_api=open_api)
            serving = asyncio.create_task(server.serve())
        elif "api" in roles:
            listening = running.enter_context(bind_api(settings.api))
            pool = ApiWorkers(settings, listening, workers, open_api=open_api)
            serving = asyncio.create_task(pool.run(stop))
        print(f"ffdl is up: roles {','.join(sorted(roles))}")
        if "api" in roles:
            print(f"  API       {settings.api}" + (f" ({workers} worker processes)" if workers > 1 else ""))
            if tenants.open:
                print(
                    f"WARNING: --open and no tenant: the API at {settings.api} is OPEN, every caller acts "
                    "as an admin (add one with `ffdl tenants add NAME --admin` to close it)",
                    file=sys.stderr,
                )
        print(f"  event log {settings.bus_url}")
        print(f"  data dir  {settings.data_dir.resolve()}")
        await stop.wait()
        if server is not None:
            server.should_exit = True
        if serving is not None:
            await serving
