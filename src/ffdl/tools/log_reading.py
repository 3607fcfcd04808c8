"""Reading a whole event log in one order: the partitions merged by event time.

Within a partition the log's order is kept; across partitions events are merged by the time
they occurred (the only order that spans partitions), which is the order ``verify``, ``replay``
and ``export`` need to see a GPU released before another job was given it.

The events topic carries jobs' and nodes' events alike, and both are read. A record that is no
event at all (damaged, or of a type or schema version this reader does not know) cannot be placed
in time, so it is kept apart, with its position and the reason, and logged: never dropped
unseen, since an SRE tool that skipped it silently would report a log cleaner than it is.

Concurrency: one task reads the partitions one after the other; nothing here is shared.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import structlog

from ffdl.events.codec import DecodeError
from ffdl.events.position import Position
from ffdl.handlers.ports import Bus
from ffdl.projections.documents import JsonObject
from ffdl.projections.store import LoggedEvent

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class UndecodableRecord:
    """A record of the events topic that decodes to no event: where it sits, its key, and why."""

    partition: int
    offset: int
    key: str
    reason: str

    @property
    def position(self) -> str:
        return Position.format_token(self.partition, self.offset)

    def as_json(self) -> JsonObject:
        return {"position": self.position, "key": self.key, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class TopicLog:
    """A topic read whole: its events merged by time, and the records that are no event, by position."""

    events: list[LoggedEvent]
    undecodable: list[UndecodableRecord]


async def read_partition(bus: Bus, topic: str, partition: int) -> TopicLog:
    """One partition in its order: its events, and the records that are no event."""
    events, undecodable = [], []
    async for record in bus.read(topic, partition):
        try:
            events.append(LoggedEvent.of_record(record.value, record.partition, record.offset))
        except DecodeError as exc:
            found = UndecodableRecord(record.partition, record.offset, record.key, exc.reason)
            log.warning(
                "undecodable record in the log",
                topic=topic,
                position=found.position,
                key=found.key,
                reason=found.reason,
            )
            undecodable.append(found)
    return TopicLog(events, undecodable)


async def read_topic(bus: Bus, topic: str) -> TopicLog:
    """Every partition of ``topic``: its events merged by time, and every record that is no event."""
    ends = await bus.end_offsets(topic)
    parts = [await read_partition(bus, topic, partition) for partition in sorted(ends)]
    return TopicLog(
        list(merge_by_time([part.events for part in parts])),
        [record for part in parts for record in part.undecodable],
    )


async def merged_events(bus: Bus, topic: str) -> AsyncIterator[LoggedEvent]:
    """The events of :func:`read_topic` in their merged order (records that are no event are logged)."""
    for logged in (await read_topic(bus, topic)).events:
        yield logged


def merge_by_time(streams: list[list[LoggedEvent]]) -> Iterator[LoggedEvent]:
    return heapq.merge(*streams, key=lambda e: (e.event.occurred_at, e.partition, e.offset))
