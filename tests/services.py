"""Real services for tests, started on free loopback ports and stopped afterwards (DESIGN §9).

Each service is a small class around one child process: ``start()`` launches it and returns once it
answers a real request (bounded by a timeout), ``stop()`` ends it (SIGTERM, then SIGKILL) and removes
its files. ``pause()``/``resume()`` freeze and thaw the process (SIGSTOP/SIGCONT) for chaos tests: a
frozen server keeps its sockets open and simply stops answering, which is what a hung or partitioned
server looks like to a client.

The helpers are synchronous so they work from any fixture scope; :func:`wait_until` polls a
predicate with a deadline so tests wait for conditions instead of sleeping and hoping, and
:func:`wait_until_async` does the same without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

ETCD_BINARY = Path("/usr/bin/etcd")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, *, interval_s: float = 0.05, what: str = "condition"
) -> None:
    """Poll ``predicate`` until it is true; raise :class:`TimeoutError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not hold within {timeout_s} s")
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    what: str = "condition",
) -> None:
    """Like :func:`wait_until` for async tests; ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not hold within {timeout_s} s")
        await asyncio.sleep(interval_s)


class EtcdServer:
    """A single-member etcd on loopback with its data in a temporary directory.

    Raft timing is shortened (50 ms heartbeat, 500 ms election timeout) so that etcd accepts leases
    of one second: its minimum TTL is 1.5 election timeouts.
    """

    def __init__(self, *, start_timeout_s: float = 15.0) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._paused = False

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def start(self) -> None:
        if not ETCD_BINARY.exists():
            raise RuntimeError(f"{ETCD_BINARY} is missing: install it with `apt-get install etcd-server`")
        self.port = free_port()
        peer_port = free_port()
        while peer_port == self.port:
            peer_port = free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="ffdl-etcd-"))
        client_url = f"http://{self.host}:{self.port}"
        peer_url = f"http://{self.host}:{peer_port}"
        with (self._workdir / "etcd.log").open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(ETCD_BINARY),
                    "--name=ffdl-test",
                    f"--data-dir={self._workdir / 'data'}",
                    f"--listen-client-urls={client_url}",
                    f"--advertise-client-urls={client_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=ffdl-test={peer_url}",
                    "--heartbeat-interval=50",
                    "--election-timeout=500",
                    "--logger=zap",
                    "--log-level=error",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        try:
            wait_until(self._serves, self._start_timeout_s, interval_s=0.1, what=f"etcd on {client_url}")
        except BaseException:
            self.stop()
            raise

    def _serves(self) -> bool:
        """True once etcd answers /health, which it only does after a quorum read succeeds."""
        assert self._process is not None
        if self._process.poll() is not None:
            assert self._workdir is not None
            log = (self._workdir / "etcd.log").read_text(errors="replace")
            raise RuntimeError(f"etcd exited with {self._process.returncode}: {log[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=1) as response:
                return bool(json.load(response).get("health") == "true")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def pause(self) -> None:
        """Freeze etcd: its sockets stay open, nothing answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            if self._paused:
                process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._paused = False
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
