"""Reading a whole event log in one order: the partitions merged by event time.

Within a partition the log's order is kept; across partitions events are merged by the time
they occurred (the only order that spans partitions), which is the order ``verify``, ``replay``
and ``export`` need to see a GPU released before another job was given it.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Iterator

from ffdl.events.codec import DecodeError, event_from_json
from ffdl.handlers.ports import Bus
from ffdl.projections.store import LoggedEvent


async def partition_events(bus: Bus, topic: str, partition: int) -> list[LoggedEvent]:
    events = []
    async for record in bus.read(topic, partition):
        try:
            events.append(LoggedEvent(event_from_json(record.value), record.partition, record.offset))
        except DecodeError:
            continue
    return events


async def merged_events(bus: Bus, topic: str) -> AsyncIterator[LoggedEvent]:
    ends = await bus.end_offsets(topic)
    streams = [await partition_events(bus, topic, partition) for partition in sorted(ends)]
    for logged in merge_by_time(streams):
        yield logged


def merge_by_time(streams: list[list[LoggedEvent]]) -> Iterator[LoggedEvent]:
    return heapq.merge(*streams, key=lambda e: (e.event.occurred_at, e.partition, e.offset))
