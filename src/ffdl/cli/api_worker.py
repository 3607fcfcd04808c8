"""One API worker process of ``ffdl up`` (see :mod:`ffdl.cli.serve`): ``python -m ffdl.cli.api_worker FD``.

It serves the API on the listening socket FD it inherited, with a platform of its own running the
``api`` role, until SIGINT/SIGTERM. Its parent writes the settings to its stdin and keeps the pipe
open: the end of stdin means the parent died without stopping it (killed, crashed), and the worker
exits at once, as if it had died with it: no request is served past the platform's death, and a
platform started again finds the port free. Every request is authenticated and redacted exactly as
in a single process: the app is the same.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import sys

import structlog

from ffdl.cli.serve import api_server
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging
from ffdl.wiring.platform import Platform

log = structlog.get_logger(__name__)

#: The exit status of a worker whose parent died (nobody reads it, but a process tree view shows it).
PARENT_GONE_EXIT = 70


async def serve_worker(
    settings: Settings, listening: socket.socket, *, open_api: bool, processes: int
) -> None:
    """Serve the API on ``listening`` until SIGINT/SIGTERM; exit at once at the end of stdin."""
    loop = asyncio.get_running_loop()

    def parent_gone() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            log.warning("the platform process is gone; exiting", pid=os.getpid())
            os._exit(PARENT_GONE_EXIT)

    # watched from the start: the platform's start may wait for the event log as long as it takes
    loop.add_reader(sys.stdin.fileno(), parent_gone)
    async with Platform(settings, frozenset({"api"})) as platform:
        server = api_server(platform, settings.api, open_api=open_api, processes=processes)

        def stop() -> None:
            server.should_exit = True

        # uvicorn takes SIGINT/SIGTERM while it serves and raises them again once stopped: then here
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        await server.serve(sockets=[listening])


def main() -> None:
    settings, open_api, processes = pickle.load(sys.stdin.buffer)
    configure_logging(settings.log_format, settings.log_level)
    listening = socket.socket(fileno=int(sys.argv[1]))
    asyncio.run(serve_worker(settings, listening, open_api=open_api, processes=processes))


if __name__ == "__main__":
    main()
