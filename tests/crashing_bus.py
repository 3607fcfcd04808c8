"""A bus whose member dies between an append and the commit of what caused it: what an owner or a
relay killed there leaves, for the tests of redelivery."""

from __future__ import annotations

from typing import Any

from ffdl.handlers.ports import Bus


class Crash(Exception):
    """The member's process dies."""


class CrashesBeforeCommit:
    """``bus``, whose subscriptions' commits fail once :attr:`appended` is set (a subclass's
    ``publish`` sets it on the append the member dies after); everything else is ``bus``'s."""

    crash = "killed between the append and the commit"

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.appended = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def subscribe(self, group: str, topics: Any, listener: Any = None) -> Any:
        subscription = await self._bus.subscribe(group, topics, listener)
        inner_commit = subscription.commit

        async def commit(offsets: Any) -> None:
            if self.appended:
                raise Crash(self.crash)
            await inner_commit(offsets)

        subscription.commit = commit
        return subscription
