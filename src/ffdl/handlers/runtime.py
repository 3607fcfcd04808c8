"""The consume loop every role runs, and the book of jobs and nodes each role folds from the log.

A role is a member of a consumer group. The loop fetches records of the partitions assigned to
it, hands each partition's records, in offset order, to the role's processor, and commits the
next offsets only after the processor returned, i.e. after every effect it awaited (events
appended, commands sent) was acknowledged by the log: at-least-once, never at-most-once.
A processor error never stops a partition: the processor dead-letters what it cannot handle.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import structlog

from ffdl.core.aggregate import EvolveError
from ffdl.core.job import Job, evolve
from ffdl.core.nodes import NodeRecord, evolve_node
from ffdl.events.codec import AnyEvent, DecodeError, any_event_from_json
from ffdl.events.envelope import Event, NodeEvent
from ffdl.handlers.ports import Bus, BusUnavailable, CommitFailed, Record, TopicPartition

log = structlog.get_logger(__name__)

_State = TypeVar("_State", Job, NodeRecord)
_Event = TypeVar("_Event", Event, NodeEvent)


class PartitionProcessor(Protocol):
    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def process(self, records: Sequence[Record]) -> None:
        """Handle records of one partition, in order; return once their effects are durable."""


async def consume(
    bus: Bus,
    group: str,
    topics: Sequence[str],
    processor: PartitionProcessor,
    stop: asyncio.Event,
    *,
    max_records: int = 500,
) -> None:
    """Run ``processor`` as a member of ``group`` until ``stop`` is set."""
    subscription = await bus.subscribe(group, topics, processor)
    backoff = 0.1
    try:
        while not stop.is_set():
            try:
                records = await subscription.fetch(max_records, 0.2)
            except BusUnavailable as exc:
                log.warning("bus unavailable; retrying", group=group, error=str(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            backoff = 0.1
            if not records:
                continue
            by_partition: dict[TopicPartition, list[Record]] = defaultdict(list)
            for record in records:
                by_partition[record.where].append(record)
            offsets: dict[TopicPartition, int] = {}
            for where, batch in by_partition.items():
                if where not in subscription.assignment():
                    continue  # revoked while we were fetching: the new owner reads them again
                await processor.process(batch)
                offsets[where] = batch[-1].offset + 1
            try:
                await subscription.commit(offsets)
            except CommitFailed as exc:
                log.warning(
                    "commit refused after a rebalance; records will be redelivered",
                    group=group,
                    error=str(exc),
                )
    finally:
        await subscription.close()


def decode_event(record: Record) -> AnyEvent | None:
    """The job or node event in ``record``, or None (logged) when it cannot be decoded."""
    try:
        return any_event_from_json(record.value)
    except DecodeError as exc:
        log.error(
            "undecodable event skipped",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=exc.reason,
        )
        return None


class AggregateBook:
    """Jobs and nodes folded from the events of the partitions a role owns.

    Events whose seq is already taken are duplicates (redelivery) or conflicts (a stale owner
    wrote too): either way they are ignored and counted, never applied twice (DESIGN §5).
    """

    def __init__(self, bus: Bus, events_topic: str) -> None:
        self._bus = bus
        self._topic = events_topic
        self.jobs: dict[str, Job] = {}
        self.partition_of: dict[str, int] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.node_partition: dict[str, int] = {}
        self._folded_until: dict[int, int] = {}
        self.ignored = 0

    async def load(self, partitions: Iterable[int]) -> None:
        """Fold every event of ``partitions`` up to the end of the log as it is now (from scratch).

        Remembers, per partition, the offset the fold really reached, so that records the consumer
        redelivers below it are known to be folded already (:meth:`folded`).
        """
        partitions = list(partitions)
        self.drop(partitions)
        for partition in partitions:
            self._folded_until[partition] = 0
            async for record in self._bus.read(self._topic, partition):
                self._folded_until[partition] = record.offset + 1
                event = decode_event(record)
                if isinstance(event, NodeEvent):
                    self.apply_node(event, partition)
                elif event is not None:
                    self.apply(event, partition)

    def folded(self, record: Record) -> bool:
        """Whether ``load`` already folded this record (a redelivery the caller must skip)."""
        return record.offset < self._folded_until.get(record.partition, 0)

    def drop(self, partitions: Iterable[int]) -> None:
        gone = set(partitions)
        for partition in gone:
            self._folded_until.pop(partition, None)
        for job_id in [j for j, p in self.partition_of.items() if p in gone]:
            del self.jobs[job_id]
            del self.partition_of[job_id]
        for name in [n for n, p in self.node_partition.items() if p in gone]:
            del self.nodes[name]
            del self.node_partition[name]

    def apply(self, event: Event, partition: int) -> tuple[Job | None, Job] | None:
        """Apply one event; returns (before, after), or None when it was ignored."""
        before = self.jobs.get(event.job_id)
        after = self._next(before, event, evolve, job_id=event.job_id)
        if after is None:
            return None
        self.jobs[event.job_id] = after
        self.partition_of[event.job_id] = partition
        return before, after

    def apply_node(self, event: NodeEvent, partition: int) -> NodeRecord | None:
        """Apply one node event; returns the node after it, or None when it was ignored."""
        after = self._next(self.nodes.get(event.node), event, evolve_node, node=event.node)
        if after is None:
            return None
        self.nodes[event.node] = after
        self.node_partition[event.node] = partition
        return after

    def _next(
        self,
        before: _State | None,
        event: _Event,
        step: Callable[[_State | None, _Event], _State],
        **ids: str,
    ) -> _State | None:
        """``step`` applied to ``before``; None (counted and logged) for a duplicate, a conflict or an
        event that does not apply."""
        if before is not None and event.seq <= before.seq:
            self.ignored += 1
            log.info(
                "duplicate or conflicting event ignored",
                seq=event.seq,
                event_id=str(event.event_id),
                have_seq=before.seq,
                **ids,
            )
            return None
        try:
            return step(before, event)
        except EvolveError as exc:
            self.ignored += 1
            log.error("event does not apply", event_id=str(event.event_id), error=str(exc), **ids)
            return None
