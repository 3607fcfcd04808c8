"""A log whose reads break off, as when the broker goes away while a role folds its partitions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ffdl.handlers.ports import Bus, BusUnavailable, Record


class BrokenRead:
    """The bus, whose first read (of ``topic``, if named) breaks off after its first record."""

    def __init__(self, bus: Bus, topic: str | None = None) -> None:
        self._bus = bus
        self._topic = topic
        self.breaks_left = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def read(self, topic: str, partition: int, *args: Any) -> AsyncIterator[Record]:
        async for record in self._bus.read(topic, partition, *args):
            yield record
            if self.breaks_left and self._topic in (None, topic):
                self.breaks_left -= 1
                raise BusUnavailable("the broker went away mid-read")
