"""Buses that fail as an owner or a relay meets them after a crash: a member that dies between an
append and the commit of what caused it, and a commands topic that cannot be read back (for the
tests of redelivery)."""

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


class CommandsUnreadable:
    """``bus``, but reading the commands topic fails with a broker error that is no
    ``ConnectionError`` nor ``TimeoutError``: a check of what the commands topic holds cannot be
    made."""

    def __init__(self, bus: Bus, commands: str) -> None:
        self._bus = bus
        self._commands = commands

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    def read(self, topic: str, partition: int, start: int = 0, end: int | None = None) -> Any:
        if topic == self._commands:
            raise RuntimeError("the broker refused the read")
        return self._bus.read(topic, partition, start, end)
