"""A stand-in for the learner agent's report channel in tests that run a learner without an agent:
a unix socket server that keeps every line sent to it, in order, as a learner's agent would get them."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any


class ReportSink:
    """Listens at ``path`` until closed; :meth:`reports` are the JSON lines received so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines: list[bytes] = []
        self._lock = threading.Condition()
        self._finished = 0
        self._open: list[socket.socket] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._open.append(connection)
                self._lock.notify_all()
            reader = threading.Thread(target=self._read, args=(connection,), daemon=True)
            self._threads.append(reader)
            reader.start()

    def _read(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            for line in stream:
                with self._lock:
                    self._lines.append(line)
        with self._lock:
            self._finished += 1
            self._lock.notify_all()

    def reports(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(line) for line in self._lines]

    def drain(self, connections: int = 1, timeout_s: float = 10.0) -> None:
        """Wait until ``connections`` connections were read to their end (their writers closed them)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._finished >= connections, timeout_s):
                raise TimeoutError(f"{self._finished} of {connections} report connections ended")

    def cut(self) -> None:
        """Close every connection from this end (once one was made), as an agent that drops them does."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._open, 10.0):
                raise TimeoutError("no report connection to cut")
            connections, self._open = self._open, []
        for connection in connections:
            connection.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
