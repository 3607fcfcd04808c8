"""The projector role: folds the events topic into the SQLite read models.

It is the one consumer that dead-letters an undecodable event (every other reader just skips
it), so each bad record is parked once. Who waits for a position (read-your-writes) or follows a
job (SSE) learns of its progress from the projection file, in whichever process it waits
(:mod:`ffdl.api.progress`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog
from prometheus_client import Histogram

from ffdl.events.codec import DecodeError
from ffdl.handlers.messaging import Topics, dead_letter
from ffdl.handlers.ports import Bus, Record, TopicPartition
from ffdl.handlers.runtime import UNREACHABLE, where
from ffdl.projections.store import LoggedEvent, Projection

log = structlog.get_logger(__name__)


class Projector:
    """``clock`` is the wall clock (seconds) the event-to-projection latency is measured on: the
    events' times are written on it."""

    def __init__(
        self, bus: Bus, topics: Topics, projection: Projection, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._bus = bus
        self._topics = topics
        self._clock = clock
        self.projection = projection
        self.applied = 0
        # Decoded by process(), applied by flush(): the projector is a FetchProcessor.
        self._pending: list[LoggedEvent] = []
        self._pending_records: dict[tuple[int, int], Record] = {}
        self.latency = Histogram(
            "ffdl_event_to_projection_seconds",
            "Time from an event's occurrence to its projection being applied",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=None,
        )

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        # A fetch cut short by a failure left its records uncommitted: they come again.
        self._pending, self._pending_records = [], {}
        log.info("projecting partitions", partitions=sorted(tp.partition for tp in partitions))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        return None

    async def process(self, records: Sequence[Record]) -> None:
        """Decode one partition's records; they are applied with the rest of the fetch by :meth:`flush`."""
        for record in records:
            try:
                self._pending.append(LoggedEvent.of_record(record.value, record.partition, record.offset))
                self._pending_records[(record.partition, record.offset)] = record
            except DecodeError as exc:
                await dead_letter(self._bus, self._topics, record, exc.reason)

    async def flush(self) -> None:
        """Apply a whole fetch, every partition of it, in one transaction (one commit, one fsync)."""
        batch, records = self._pending, self._pending_records
        self._pending, self._pending_records = [], {}
        if not batch:
            return
        try:
            applied = await asyncio.to_thread(self.projection.apply, batch)
        except UNREACHABLE:
            raise
        except Exception:  # one event of the batch is poison: the batch was rolled back
            log.exception("projecting a batch failed; projecting its events one by one")
            applied = await self._one_by_one(batch, records)
        self.applied += applied
        now = self._clock()
        for logged in batch:
            self.latency.observe(max(0.0, now - logged.event.occurred_at.timestamp()))

    async def _one_by_one(self, batch: list[LoggedEvent], records: dict[tuple[int, int], Record]) -> int:
        """Apply each event on its own; one that fails is dead-lettered with the reason (the
        projection's position moves past it with the next one), so it never blocks the partition."""
        applied = 0
        for logged in batch:
            try:
                applied += await asyncio.to_thread(self.projection.apply, [logged])
            except UNREACHABLE:
                raise
            except Exception as exc:
                record = records[(logged.partition, logged.offset)]
                log.exception("event dead-lettered: projecting it failed", **where(record))
                await dead_letter(self._bus, self._topics, record, f"internal error: {exc!r}")
        return applied
