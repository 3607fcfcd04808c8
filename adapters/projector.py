"""The projector role: folds the events topic into the SQLite read models, and tells waiters.

It is the one consumer that dead-letters an undecodable event (every other reader just skips
it), so each bad record is parked once. After each applied batch it wakes whoever waits for a
position (read-your-writes) or follows a job (SSE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from ffdl.events.codec import DecodeError, event_from_json
from ffdl.handlers.messaging import Topics, dead_letter
from ffdl.handlers.ports import Bus, Record, TopicPartition
from ffdl.projections.store import LoggedEvent, Projection

log = structlog.get_logger(__name__)


class Projector:
    def __init__(self, bus: Bus, topics: Topics, projection: Projection) -> None:
        self._bus = bus
        self._topics = topics
        self.projection = projection
        self.changed = asyncio.Condition()
        self.applied = 0

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        log.info("projecting partitions", partitions=sorted(tp.partition for tp in partitions))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        return None

    async def process(self, records: Sequence[Record]) -> None:
        batch = []
        for record in records:
            try:
                batch.append(LoggedEvent(event_from_json(record.value), record.partition, record.offset))
            except DecodeError as exc:
                await dead_letter(self._bus, self._topics, record, exc.reason)
        applied = await asyncio.to_thread(self.projection.apply, batch)
        self.applied += applied
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, partition: int, offset: int, timeout_s: float) -> bool:
        """Wait until the event at ``partition:offset`` is applied; False on timeout."""
        async def reached() -> None:
            async with self.changed:
                while not await asyncio.to_thread(self.projection.reached, partition, offset):
                    await self.changed.wait()

        try:
            await asyncio.wait_for(reached(), timeout_s)
        except TimeoutError:
            return False
        return True
