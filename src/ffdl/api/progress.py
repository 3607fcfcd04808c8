"""The projection's progress as an API process sees it: who waits for the projection to change is woken
when it does, whichever process folded the change.

The projector may run in another process than the request waiting for it (``--roles api``, or any
of several API workers), so nothing it does in memory can wake that request. Each API process polls
the projection file's version (:meth:`Projection.version`, a read of shared memory) every
:data:`TICK_S` instead, once for all its waiters, and only while someone waits: 500 followers cost
one poll per tick, not 500, and an idle API polls nothing.

A waiter takes the :meth:`ProjectionProgress.version` *before* it reads the projection and passes it
to :meth:`ProjectionProgress.wait_for_change` after: a change committed between its read and its
wait then ends the wait at once instead of being slept through.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

#: Seconds between two looks at the projection's version while someone waits.
TICK_S = 0.02


class ProjectionProgress:
    """``probe`` is the projection file's version now (None when it cannot tell)."""

    def __init__(self, probe: Callable[[], int | None], tick_s: float = TICK_S) -> None:
        self._probe = probe
        self._tick_s = tick_s
        self._seen: int | None = None
        self._changed = asyncio.Event()
        self._waiting = 0
        self._polling: asyncio.Task[None] | None = None

    def version(self) -> int | None:
        """The version to wait past once what it covers has been read: the one the poll saw last while
        it runs (it will notice anything newer), else the file's own."""
        return self._seen if self._polling is not None else self._probe()

    async def wait_for_change(self, since: int | None, timeout_s: float) -> None:
        """Return once the projection has changed past ``since`` (at once if it has already), or after
        ``timeout_s``; waking early by a change that was already read is harmless."""
        if self._polling is None:
            now = self._probe()
            if now is not None and now != since:
                return
            self._polling = asyncio.create_task(self._poll())
            self._seen = since if now is None else now
        elif since != self._seen:
            return
        changed = self._changed
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout_s)
        finally:
            self._waiting -= 1

    async def _poll(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(self._tick_s)
                version = self._probe()
                if version is not None and version != self._seen:
                    self._seen = version
                    self._changed.set()
                    self._changed = asyncio.Event()
        finally:
            self._polling = None
