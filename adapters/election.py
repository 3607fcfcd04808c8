"""Leader election for the embedded default: an exclusive file lock per role and a token counter.

Whoever holds ``leader-<role>.lock`` leads; each new leader increments ``leader-<role>.token``
under the lock, so tokens only grow. The lock dies with its process, so a killed leader is
replaced as soon as another process campaigns.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path


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
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
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
