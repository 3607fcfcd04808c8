"""The consume loop every role runs, the book of aggregates each role folds, and the processor runtime.

A role is a member of a consumer group. The loop fetches records of the partitions assigned to
it, hands each partition's records, in offset order, to the role's processor, and commits the
next offsets only after the processor returned, i.e. after every effect it awaited (events
appended, commands sent) was acknowledged by the log: at-least-once, never at-most-once.
A processor error never stops a partition: the processor dead-letters what it cannot handle.

Poison records: whatever one record makes a role raise while it is decoded, folded or handled
(a bug, a value no check foresaw: RecursionError, IndexError, KeyError ...), the role logs it with
the record's position, counts it and goes on with the next record; the partition never stalls and
the role never crash-loops on it (the owner and the projector also park it on the dead-letter
topic with the reason, once). What is *not* poison is the world being unreachable
(:data:`UNREACHABLE`: the log, a store, a broker): that propagates, so the batch is not committed
and is handled again once the world answers. A fold of newly assigned partitions that fails that
way is done again, from scratch, before any record of them is handled: no role decides or reacts
on a partly folded partition.

The roles that keep aggregates (the owner, the reactors, the scheduler, the notifier) share one
runtime, as the followers of the ``eventsourcing`` library share ``pull_and_process``: on gaining
partitions a :class:`Follower` folds them to their end, on losing them it forgets them; an
:class:`EventFollower` then skips each record already folded, decodes and folds the others, and
hands each applied event to the role's ``policy``. The owner follows the commands topic instead and
decides each command against the aggregates of its partitions.

Reading only what is needed: a record's ``ce_type`` header (the CloudEvents type every producer of
the platform writes) names its event type, so a reader skips, without decoding it, every record of a
type it does not fold (:func:`record_type`; the book of the reactor and of the notifier folds jobs
only, the cluster view of the owner node and GPU events only); its offset is committed with the rest.
A record without the header (an older producer's) is decoded to find out. And a process decodes each
record once, however many of its roles read it (:class:`DecodedEvents`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog

from ffdl.core.aggregate import AggregateKind, Aggregates, AggregateState, Applied, Kinds, Skip, Skipped
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.core.nodes import NodeRecord
from ffdl.events.codec import AnyEvent, DecodeError, trusted_any_event_from_json
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.nodes import NODE_EVENT_TYPES
from ffdl.handlers.aio import Backoff, sleep_or_stop
from ffdl.handlers.ports import Bus, BusUnavailable, CommitFailed, Record, Subscription, TopicPartition

log = structlog.get_logger(__name__)

#: What a failure of the world looks like (the log, a store, a broker unreachable or too slow): the
#: work is retried, never taken for a poison record.
UNREACHABLE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)

S = TypeVar("S", bound=AggregateState)


class PartitionProcessor(Protocol):
    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def process(self, records: Sequence[Record]) -> None:
        """Handle records of one partition, in order; return once their effects are durable (or,
        for a :class:`FetchProcessor`, once they are pending for its :meth:`~FetchProcessor.flush`)."""


@runtime_checkable
class FetchProcessor(PartitionProcessor, Protocol):
    """A processor that makes the effects of a whole fetch durable at once: ``consume`` calls
    :meth:`flush` once it handed every partition of a fetch to :meth:`process`, and commits their
    offsets only after it returned. One append for the fetch instead of one per partition, each
    awaited before the next partition is handled. No rebalance callback runs between a fetch's
    ``process`` calls and its ``flush`` (the member holds its turn until its next fetch)."""

    async def flush(self) -> None:
        """Make durable what ``process`` left pending since the last flush; raise if it cannot be."""


class StaleMember(RuntimeError):
    """The group refused a member before its fetch became durable: it was expelled meanwhile."""


async def consume(
    bus: Bus,
    group: str,
    topics: Sequence[str],
    processor: PartitionProcessor,
    stop: asyncio.Event,
    *,
    max_records: int = 500,
    fenced: bool = False,
) -> None:
    """Run ``processor`` as a member of ``group`` until ``stop`` is set.

    ``fenced`` (the owners, the one writer of each partition's events, and the ingress relay, whose
    copies must be appended once): before a fetch's flush, the member commits the offsets the fetch
    began at, which changes nothing for a member of the group (every record before them is durable
    already) and is refused to one the group expelled. A member cut off from the broker for longer
    than its session still holds what it fetched and learns that it lost its partitions only at its
    next call to the group: without the fence, its first fetch after the cut heals decides against a
    fold another member has moved past and appends events whose seq is taken (readers ignore them,
    ``ffdl verify`` reports them), or copies tenant records another relay copied too. A refused
    member raises :class:`StaleMember` with nothing flushed; its supervisor starts the role again,
    which joins the group again and folds (or reads back) what it is given. The fence leaves the
    time between its commit and the append reaching the log: neither bus refuses the append itself
    to an expelled member (docs/kafka.md).
    """
    subscription = await bus.subscribe(group, topics, processor)
    flush = processor.flush if isinstance(processor, FetchProcessor) else None
    backoff = Backoff(0.1, 5.0)
    try:
        while not stop.is_set():
            try:
                records = await subscription.fetch(max_records, 0.2)
            except BusUnavailable as exc:
                delay = backoff.next_delay()
                log.warning("bus unavailable; retrying", group=group, error=str(exc), retry_in_s=delay)
                await sleep_or_stop(stop, delay)
                continue
            backoff.reset()
            if not records:
                continue
            by_partition: dict[TopicPartition, list[Record]] = defaultdict(list)
            for record in records:
                by_partition[record.where].append(record)
            offsets: dict[TopicPartition, int] = {}
            began: dict[TopicPartition, int] = {}
            for where, batch in by_partition.items():
                if where not in subscription.assignment():
                    continue  # revoked while we were fetching: the new owner reads them again
                await processor.process(batch)
                offsets[where] = batch[-1].offset + 1
                began[where] = batch[0].offset
            if flush is not None:
                if fenced and began:
                    await _prove_membership(subscription, group, began)
                await flush()
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


async def _prove_membership(subscription: Subscription, group: str, began: dict[TopicPartition, int]) -> None:
    """Commit where the fetch began; raise :class:`StaleMember` if the group refuses it."""
    try:
        await subscription.commit(began)
    except CommitFailed as exc:
        log.warning(
            "the group expelled this member: its fetch is not made durable", group=group, error=str(exc)
        )
        raise StaleMember(f"group {group!r} refused this member before its flush: {exc}") from exc


def where(record: Record) -> dict[str, object]:
    """A record's position, for logs."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


#: The record header that names the type of what a record holds (CloudEvents' Kafka binding).
CE_TYPE_HEADER = "ce_type"
_CE_TYPE_PREFIX = "io.ffdl."
#: The event types of each aggregate kind, by the kind's name: what a book of that kind folds.
_EVENT_TYPES_OF_KIND: dict[str, frozenset[str]] = {
    JOBS.name: frozenset(EVENT_TYPES),
    NODES.name: frozenset(NODE_EVENT_TYPES),
}


def record_type(record: Record) -> str | None:
    """The event type ``record``'s ``ce_type`` header names (``io.ffdl.<Type>.v<version>``), or None
    when it has none (a record of a producer older than the header)."""
    for name, value in record.headers:
        if name == CE_TYPE_HEADER:
            return value.decode(errors="replace").removeprefix(_CE_TYPE_PREFIX).rpartition(".v")[0]
    return None


def may_hold(record: Record, types: Collection[str] | None) -> bool:
    """Whether ``record`` may hold an event of ``types`` (None: any type), by its ``ce_type`` header:
    a record without one may hold anything, and is decoded to find out."""
    if types is None:
        return True
    named = record_type(record)
    return named is None or named in types


def event_types(kinds: Kinds) -> frozenset[str] | None:
    """The event types a book of ``kinds`` folds; None (every type) if one of the kinds is unknown here."""
    types: set[str] = set()
    for kind in kinds:
        known = _EVENT_TYPES_OF_KIND.get(kind.name)
        if known is None:
            return None
        types |= known
    return frozenset(types)


class DecodedEvents:
    """The events this process decoded last, by the bytes of their record's value: each role of the
    process that reads a record finds it decoded if another just did (the owner's fold, its cluster
    view and the reactor read the same records; with every role in one process, five readers do).

    Keyed by the value's bytes, not the record's position: decoding is a function of the bytes, so an
    entry is right whichever log, topic or offset the same bytes come from. The events are immutable,
    so readers share them. A writer remembers what it encoded (an event round-trips through
    its JSON: the codec's tests hold it to that), so the readers of a process do not decode what the
    process itself appended. FIFO, at most ``size`` entries: the readers of one process trail each
    other by about a fetch, and a miss only costs the decode.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._events: dict[bytes, AnyEvent] = {}
        self.hits = 0
        self.misses = 0

    def decode(self, value: bytes) -> AnyEvent:
        """The event in ``value``; raises :class:`DecodeError` (never cached) when it holds none."""
        event = self._events.get(value)
        if event is not None:
            self.hits += 1
            return event
        self.misses += 1
        event = trusted_any_event_from_json(value)  # the events topic: written only by owners
        self.remember(value, event)
        return event

    def remember(self, value: bytes, event: AnyEvent) -> None:
        """Note that ``value`` decodes to ``event`` (it is ``event``'s encoding)."""
        if len(self._events) >= self._size:
            del self._events[next(iter(self._events))]
        self._events[value] = event


#: The events the roles of this process decoded last.
DECODED = DecodedEvents()


def decode_event(record: Record) -> AnyEvent | None:
    """The job or node event in ``record``, or None (logged) when it cannot be decoded."""
    try:
        return DECODED.decode(record.value)
    except DecodeError as exc:
        log.error(
            "undecodable event skipped",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            reason=exc.reason,
        )
        return None


class AggregateBook(Aggregates):
    """The aggregates folded from the events of the partitions a role owns: a keyed book per kind.

    Events whose seq is already taken are duplicates (redelivery) or conflicts (a stale owner
    wrote too): either way they are ignored and counted, never applied twice, as is an event that
    does not apply (architecture §5). A book built for some kinds only does not fold the others' events,
    nor decode them when their record's header names their type (:attr:`types`).
    """

    def __init__(self, bus: Bus, events_topic: str, kinds: Kinds = KINDS) -> None:
        super().__init__(kinds)
        self._bus = bus
        self._topic = events_topic
        #: The event types this book folds (None: every type); records of others are not decoded.
        self.types = event_types(kinds)
        self._partition_of: dict[tuple[str, str], int] = {}  # (kind, id) -> partition
        self._folded_until: dict[int, int] = {}
        #: Per partition, the last record whose event :meth:`load` applied, with the event (the owner
        #: reads there how far on the commands partition the decisions in the log reach).
        self.last_loaded: dict[int, tuple[Record, AnyEvent]] = {}
        self.ignored = 0

    @property
    def jobs(self) -> dict[str, Job]:
        return self.of(JOBS)

    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.of(NODES)

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions folded (since they were loaded)."""
        return frozenset(self._folded_until)

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
                if not may_hold(record, self.types):
                    continue
                try:
                    event = decode_event(record)
                    if event is not None and self.apply(event, partition) is not None:
                        self.last_loaded[partition] = (record, event)
                except UNREACHABLE:
                    raise
                except Exception:  # a poison record: skipped and counted, the fold goes on
                    self.ignored += 1
                    log.exception("event skipped: folding it failed", **where(record))

    def folded(self, record: Record) -> bool:
        """Whether ``load`` already folded this record (a redelivery the caller must skip)."""
        return record.offset < self._folded_until.get(record.partition, 0)

    def on_partitions(self, kind: AggregateKind[S, Any, Any, Any], partitions: Iterable[int]) -> dict[str, S]:
        """The aggregates of ``kind`` on ``partitions``."""
        wanted = set(partitions)
        return {
            identity: state
            for identity, state in self.of(kind).items()
            if self._partition_of[(kind.name, identity)] in wanted
        }

    def drop(self, partitions: Iterable[int]) -> Aggregates:
        """Forget ``partitions``; returns the aggregates that were on them."""
        gone = set(partitions)
        for partition in gone:
            self._folded_until.pop(partition, None)
            self.last_loaded.pop(partition, None)
        dropped = [where for where, partition in self._partition_of.items() if partition in gone]
        for where in dropped:
            del self._partition_of[where]
        return self.forget(dropped)

    def apply(self, event: AnyEvent, partition: int) -> Applied[Any, Any] | None:
        """Fold one event of ``partition``; None when it was ignored (or is of a kind not kept here)."""
        folded = self.fold(event)
        if isinstance(folded, Skipped):
            self.ignored += 1
            ids = self.kinds.of(event).ids(event)
            where = {"event_id": str(event.event_id), "seq": event.seq, **ids}
            if folded.why is Skip.TAKEN:
                log.info("duplicate or conflicting event ignored", detail=folded.detail, **where)
            else:
                log.error("event does not apply", error=folded.detail, **where)
            return None
        if folded is not None:
            self._partition_of[(folded.kind.name, folded.kind.identity(event))] = partition
        return folded


class Follower:
    """What every role that keeps aggregates shares: on gaining partitions of ``topic`` it folds the
    same partitions of the events topic to their end (:class:`AggregateBook`), and forgets them
    when they are revoked. Roles plug in through :meth:`loaded` and :meth:`revoked`, and handle
    the records of ``topic`` in ``process``.
    """

    def __init__(self, bus: Bus, topic: str, events_topic: str, kinds: Kinds = KINDS) -> None:
        self._topic = topic
        self.book = AggregateBook(bus, events_topic, kinds)

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions this role holds now."""
        return self.book.partitions

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topic)
        backoff = Backoff(0.1, 5.0)
        while True:  # until folded whole: nothing of these partitions is handled on a partial fold
            try:
                await self.book.load(mine)
                break
            except UNREACHABLE as exc:
                delay = backoff.next_delay()
                log.warning("folding assigned partitions failed; folding again", partitions=mine,
                            error=str(exc), retry_in_s=delay)  # fmt: skip
                await asyncio.sleep(delay)
        await self.loaded(mine)

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.revoked(self.book.drop(tp.partition for tp in partitions if tp.topic == self._topic))

    async def loaded(self, partitions: list[int]) -> None:
        """Called once ``partitions`` are folded to their end, before any of their records is processed."""

    def revoked(self, dropped: Aggregates) -> None:
        """Called with the aggregates of the partitions just revoked, already forgotten by the book."""


class EventFollower(Follower, ABC):
    """A role that follows the events topic: each record not folded yet and of a type its book folds
    is decoded, folded, and, if it applied, handed to the role's :meth:`policy` (a duplicate, a
    conflict or an event that does not apply is ignored and counted by the book, an undecodable one
    logged).
    """

    def __init__(self, bus: Bus, events_topic: str, kinds: Kinds = KINDS) -> None:
        super().__init__(bus, events_topic, events_topic, kinds)
        self.poisoned = 0  # records skipped because handling them raised

    async def process(self, records: Sequence[Record]) -> None:
        types = self.book.types
        for record in records:
            if self.book.folded(record) or not may_hold(record, types):
                continue
            try:
                event = decode_event(record)
                applied = self.book.apply(event, record.partition) if event is not None else None
                if applied is not None:
                    await self.policy(applied)
            except UNREACHABLE:
                raise
            except Exception:  # a poison record: logged and counted, the partition goes on
                self.poisoned += 1
                log.exception("record skipped: handling it failed", **where(record))
        await self.processed()

    @abstractmethod
    async def policy(self, applied: Applied[Any, Any]) -> None:
        """What the role does about an event applied to one of its aggregates."""

    async def processed(self) -> None:
        """Called once a batch's records are all folded: for what a role does once per batch
        rather than per event (the states an aggregate passes through within a batch are seen by
        :meth:`policy`, the state it is left in here)."""
