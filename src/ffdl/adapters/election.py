"""Leader election: which adapter a URL names, and the embedded default on lock files.

* ``file:///ABS/DIR``: :class:`FileElection`, for processes on one machine sharing a data dir;
* ``etcd://HOST:PORT``: :class:`~ffdl.adapters.election_etcd.EtcdElection`, leases in etcd.

The file election: whoever holds ``leader-<role>.lock`` leads; each new leader increments
``leader-<role>.token`` under the lock, so tokens only grow. The lock dies with its process, so a
killed leader is replaced as soon as another process campaigns.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from urllib.parse import urlsplit

from ffdl.adapters.election_etcd import EtcdElection
from ffdl.adapters.heartbeats.etcd_auth import EtcdCredentials
from ffdl.handlers.ports import Election

_ACCEPTED = "file:///ABSOLUTE/DIR or etcd://HOST:PORT"


def open_election(url: str, ttl_s: float, credentials: EtcdCredentials | None = None) -> Election:
    """The election that ``url`` names; ``ttl_s`` is the leader lease of an etcd election, which logs
    in with ``credentials`` when etcd's auth is on."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"election URL {url!r} takes no query or fragment; use {_ACCEPTED}")
    if parts.scheme == "file" and not parts.netloc and parts.path.startswith("/"):
        return FileElection(Path(parts.path))
    if parts.scheme == "etcd" and parts.path in ("", "/"):
        try:
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise ValueError(f"election URL {url!r} has a bad port; use {_ACCEPTED}") from error
        if host and port:
            return EtcdElection(host, port, ttl_s, credentials=credentials)
    raise ValueError(f"unsupported election URL {url!r}; use {_ACCEPTED}")


#: How often a candidate retries the lock; polling (not a blocking flock in a thread) keeps a
#: campaign cancellable, so a platform that stops while it is a candidate stops at once.
LOCK_POLL_INTERVAL_S = 0.1


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class FileElection:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, tuple[int, int]] = {}

    def _token_path(self, role: str) -> Path:
        return self._dir / f"leader-{role}.token"

    async def campaign(self, role: str) -> int:
        if role in self._held:
            return self._held[role][1]
        fd = os.open(self._dir / f"leader-{role}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                if _try_lock(fd):
                    break
                await asyncio.sleep(LOCK_POLL_INTERVAL_S)
        except BaseException:
            os.close(fd)
            raise
        token = (await self.current_token(role) or 0) + 1
        path = self._token_path(role)
        path.with_suffix(".tmp").write_text(str(token))
        path.with_suffix(".tmp").replace(path)
        self._held[role] = (fd, token)
        return token

    async def current_token(self, role: str) -> int | None:
        try:
            return int(self._token_path(role).read_text())
        except (FileNotFoundError, ValueError):
            return None

    async def is_leader(self, role: str, token: int) -> bool:
        held = self._held.get(role)
        return held is not None and held[1] == token and await self.current_token(role) == token

    async def resign(self, role: str) -> None:
        held = self._held.pop(role, None)
        if held is not None:
            fcntl.flock(held[0], fcntl.LOCK_UN)
            os.close(held[0])

    async def close(self) -> None:
        for role in list(self._held):
            await self.resign(role)
