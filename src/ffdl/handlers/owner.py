"""The job owner: the only writer of a job's events, and of a node's (architecture §5).

It is a member of the owners' consumer group on the commands topic. For each partition it gains
it first folds that partition of the events topic to its end, then decides every command of the
partition against the folded state and appends the resulting events (keyed by job id, so to the
same partition number). A fetch's events, whatever their partitions, are appended in one publish
(the owner is a :class:`~ffdl.handlers.runtime.FetchProcessor`) and the command offsets are committed
only after the log acknowledged them. Bad input never stops the partition: undecodable
commands, commands for unknown jobs or nodes, commands on another partition than their key's (whose job
another owner serves) and internal errors go to the dead-letter topic with their reason; illegal
commands become ``CommandRejected`` (``NodeCommandRejected``) events. Nodes are keyed like jobs
(``node:<name>``), so the owner of that key's partition decides them: every command is decided by
its aggregate kind's decider, looked up in the owner's registry of kinds (jobs, decided with the
platform's restart policy, and nodes).

Every command is decided for its principal (:func:`~ffdl.handlers.messaging.principal_of`), through
the gate of :func:`~ffdl.core.authorization.decide_as`: a command its principal may not send (another
tenant's job, a scheduler's command without the leader's token, a drain from a tenant, a tenant's
submission above its priority ceiling: ``ceilings``, read from the tenants file), or an
allocation the cluster cannot give (:mod:`ffdl.handlers.cluster_watch`), is refused, recorded as
the aggregate's rejection event or, for an aggregate that does not exist, dead-lettered; the owner
logs each refusal with the principal.

A command is decided once, however often it is delivered. An owner that appended a fetch's events
and died before it committed the fetch's offsets leaves the whole fetch (up to ``max_records``
commands, all of them maybe one job's: a tenant flooding its job, a learner's reports) to the next
owner, which is handed it again after its fold. The aggregates' window of recent command ids
(:func:`~ffdl.core.aggregate.seen`) does not tell: it holds the last
:data:`~ffdl.core.aggregate.COMMAND_WINDOW` ids that caused events and none that decided nothing,
and a command decided again is decided in the state the commands after it left (a halt the tenant
had resumed halted the job again). So each event record the owner appends names the offset of the
command that caused it (:data:`~ffdl.handlers.messaging.COMMAND_OFFSET_HEADER`), and since one owner
decides a partition's commands in their order and appends their events in that order, the last
event its fold applied says how far the decisions in the log reach on the partition: a command at
or below that offset was decided, whether or not it caused events, and is skipped undecoded (a
redelivery; :attr:`JobOwner.redelivered` counts them). That holds for every aggregate of the
partition, with nothing kept but one offset per partition and no change to the events themselves,
because a publish that fails leaves a prefix of its records on each partition, never a later event
without the earlier ones: the embedded log appends a publish in one transaction, the Kafka bus sends
a partition's next batch only once the one before it was acknowledged (aiokafka alone would send
the batch behind one that failed for good; docs/kafka.md). A read of the commands partition for the
check below that fails is :class:`~ffdl.handlers.ports.BusUnavailable`, never a poison command. The offset is
believed once the commands partition is found to hold, at that offset, the command the event
names as its cause (read once per partition, on the first redelivery), so a commands topic made
anew under a kept events topic, whose offsets start again, never has its commands taken for
redeliveries. A log whose last event names no offset (an older owner's, an imported log's) leaves
the window alone to recognise redeliveries, as before.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ffdl.core.aggregate import CommandEnvelope, Kinds, UnknownAggregate
from ffdl.core.authorization import Principal, Unauthorized, decide_as
from ffdl.core.kinds import KINDS
from ffdl.core.tenancy import PriorityCeilings
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, AnyEvent, DecodeError, any_command_from_json
from ffdl.handlers.cluster_watch import ClusterWatch
from ffdl.handlers.messaging import (
    COMMAND_OFFSET_HEADER,
    Topics,
    dead_letter,
    event_records,
    misrouted,
    principal_of,
    utcnow,
)
from ffdl.handlers.ports import (
    MAX_RECORD_BYTES,
    Bus,
    BusUnavailable,
    Election,
    OutgoingRecord,
    Record,
    TopicPartition,
    record_size,
)
from ffdl.handlers.runtime import DECODED, UNREACHABLE, Follower, where

log = structlog.get_logger(__name__)

SCHEDULER_ROLE = "scheduler"


class DecisionTooLarge(ValueError):
    """A command whose events the log would refuse for their size: it is dead-lettered, not decided."""


@dataclass(frozen=True, slots=True)
class DecidedThrough:
    """How far the decisions in the log reach on one commands partition: the offset of the command
    that caused the last event folded there, and that command's id (the event's ``causation_id``);
    ``held``: whether the commands partition was found to hold that command at that offset."""

    offset: int
    command_id: uuid.UUID
    held: bool = False


def decided_through(loaded: tuple[Record, AnyEvent] | None) -> DecidedThrough | None:
    """What the last event a fold applied on a partition (its record, and the event) says of how far
    the decisions in the log reach on the commands partition; None when it names no command offset."""
    if loaded is None:
        return None
    record, event = loaded
    offsets = [value for name, value in record.headers if name == COMMAND_OFFSET_HEADER]
    if len(offsets) != 1 or event.causation_id is None:
        return None
    try:
        offset = int(offsets[0])
    except ValueError:
        return None
    return DecidedThrough(offset, event.causation_id) if offset >= 0 else None


class JobOwner(Follower):
    def __init__(
        self,
        bus: Bus,
        topics: Topics,
        election: Election,
        *,
        producer: str = "owner",
        kinds: Kinds = KINDS,
        clock: Callable[[], datetime] = utcnow,
        ceilings: PriorityCeilings | None = None,
    ) -> None:
        super().__init__(bus, topics.commands, topics.events, kinds)
        self._ceilings = ceilings
        self._bus = bus
        self._topics = topics
        self._election = election
        self._producer = producer
        self._clock = clock
        self.cluster = ClusterWatch(bus, topics.events)
        #: Whether the view caught up in this fetch: the scheduler sent each of the fetch's allocations
        #: before the fetch, so once is enough (what the fetch decides enters the view at once).
        self._caught_up = False
        #: Decided since the last flush, not appended yet: each event with the record that carries it.
        self._pending: list[tuple[AnyEvent, OutgoingRecord]] = []
        #: Per partition held, how far the decisions in the log reach on it (None: it does not say).
        self._decided: dict[int, DecidedThrough | None] = {}
        self.dead_letters = 0
        #: Commands skipped because the log holds their decision already (delivered again).
        self.redelivered = 0

    async def loaded(self, partitions: list[int]) -> None:
        """Decisions still pending from a fetch that never became durable (the group expelled this
        member before its flush: :class:`~ffdl.handlers.runtime.StaleMember`) are void: the
        partitions were just folded again from the log."""
        if self._pending:
            self._forget_pending()
        for partition in partitions:
            self._decided[partition] = decided_through(self.book.last_loaded.get(partition))
        log.info("owning partitions", partitions=partitions, jobs=len(self.book.jobs))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        await super().on_revoked(partitions)
        for tp in partitions:
            if tp.topic == self._topics.commands:
                self._decided.pop(tp.partition, None)

    async def process(self, records: Sequence[Record]) -> None:
        """Decide the records of one partition; their events wait for :meth:`flush`."""
        try:
            for record in records:
                await self._guarded(record)
        except BaseException:
            self._forget_pending()
            raise

    async def flush(self) -> None:
        """Append every event the fetch's commands decided, in one publish."""
        decided, self._pending = self._pending, []
        self._caught_up = False
        if not decided:
            return
        # The reactor of this process reads them next, maybe before the append's acknowledgement is
        # handled here; should the append fail, the entries are still true (a record's bytes decode so).
        for event, record in decided:
            DECODED.remember(record.value, event)
        try:
            await self._bus.publish(self._topics.events, [record for _, record in decided])
        except BaseException:
            self._forget_pending()
            raise
        if not log.is_enabled_for(logging.INFO):
            return  # the lines' fields cost more than the filtered calls (a few % of the owner's time)
        for event, _ in decided:
            log.info(
                "event appended",
                **self.book.kinds.of(event).ids(event),
                type=event.type,
                seq=event.seq,
                event_id=str(event.event_id),
                causation_id=str(event.causation_id),
            )

    def _forget_pending(self) -> None:
        """The fetch failed: nothing it decided may reach the log, so the cluster view, which holds
        it, starts again from the log (the book is folded again when the partitions are)."""
        self._pending = []
        self._caught_up = False
        self.cluster.reset()

    async def _guarded(self, record: Record) -> None:
        """Decide one record; one whose decoding, checks or decision raises (a poison record) is
        dead-lettered with the reason and the partition goes on. An unreachable world is no poison:
        it propagates, and the batch is decided again."""
        try:
            await self._decide(record)
        except UNREACHABLE:
            raise
        except Exception as exc:
            log.exception("command dead-lettered: deciding it failed", **where(record))
            await self._dead_letter(record, f"internal error: {exc!r}")

    async def _decided_already(self, record: Record) -> bool:
        """Whether the log holds the decision of the command in ``record``: it is at or below the
        offset the last event folded on its partition names (a redelivery), once the commands
        partition was found to hold there the command that event names."""
        through = self._decided.get(record.partition)
        if through is None or record.offset > through.offset:
            return False
        if not through.held:
            if not await self._holds(record.topic, record.partition, through):
                log.warning(
                    "the commands partition does not hold the command the last event names at its"
                    " offset: it is not the one the log's decisions were made on, no command is"
                    " taken for a redelivery by its offset",
                    topic=record.topic,
                    partition=record.partition,
                    offset=through.offset,
                    command_id=str(through.command_id),
                )
                self._decided[record.partition] = None
                return False
            self._decided[record.partition] = DecidedThrough(through.offset, through.command_id, held=True)
        return True

    async def _holds(self, topic: str, partition: int, through: DecidedThrough) -> bool:
        """Whether ``topic``'s ``partition`` holds the command ``through`` names at its offset. A read
        that fails, however, is :class:`BusUnavailable`: it says nothing of the command, which is
        no poison (dead-lettered, each redelivered command was parked as an internal error); the
        fetch is handled again."""
        at = through.offset
        try:
            held = [record async for record in self._bus.read(topic, partition, at, at + 1)]
        except Exception as exc:
            raise BusUnavailable(f"cannot check the command at {topic}:{partition}:{at}: {exc!r}") from exc
        if len(held) != 1 or held[0].offset != at:
            return False  # gone (retention), or never there
        try:
            return any_command_from_json(held[0].value).command_id == through.command_id
        except DecodeError:
            return False

    async def _decide(self, record: Record) -> None:
        if await self._decided_already(record):
            self.redelivered += 1
            log.debug("redelivered command skipped: the log holds its decision", **where(record))
            return
        try:
            command = any_command_from_json(record.value)
        except DecodeError as exc:
            await self._dead_letter(record, exc.reason)
            return
        wrong = misrouted(record, command, self._bus.partition_for(record.key))
        if wrong:
            await self._dead_letter(record, wrong)
            return
        try:
            principal = principal_of(record, command)
        except ValueError as exc:
            await self._dead_letter(record, str(exc))
            return
        leader = await self._leader_token(command)
        if isinstance(command.data, cmd.AllocateGpus) and not self._caught_up:
            await self.cluster.catch_up()
            self._caught_up = True
        try:
            events = self.decide(command, record.partition, principal, leader, offset=record.offset)
        except Unauthorized as exc:
            log.warning(
                "command refused",
                key=record.key,
                command=command.type,
                command_id=str(command.command_id),
                principal=str(principal),
                producer=command.producer,
                reason=str(exc),
            )
            await self._dead_letter(record, str(exc))
            return
        except (UnknownAggregate, DecisionTooLarge) as exc:
            await self._dead_letter(record, str(exc))
            return
        except Exception as exc:  # a decider bug must not stall the partition
            log.exception("decider failed", key=command.key, command_id=str(command.command_id))
            await self._dead_letter(record, f"internal error: {exc!r}")
            return
        for event in events:
            if isinstance(event.data, ev.CommandRejected | nd.NodeCommandRejected):
                kind = self.book.kinds.of(command)
                log.warning(
                    "command refused",
                    **kind.ids(command),
                    tenant=kind.tenant_of(command),
                    command=command.type,
                    command_id=str(command.command_id),
                    principal=str(principal),
                    producer=command.producer,
                    reason=event.data.reason,
                )

    def decide(
        self,
        command: CommandEnvelope,
        partition: int,
        principal: Principal,
        leader_token: int | None,
        *,
        offset: int | None = None,
    ) -> list[Any]:
        """Decide ``command`` sent by ``principal`` against its aggregate as folded and the cluster as
        the owner sees it, fold the events decided into the book and the view, and keep them with
        their records for :meth:`flush`; raises :class:`UnknownAggregate` for a command that names no
        aggregate it can decide (or may create), and :class:`DecisionTooLarge`, before folding
        anything, for one whose events the log would refuse for their size (which would otherwise
        fail every append of the fetch, again and again). ``offset``: the command's on its
        partition of the commands topic, which the events' records name."""
        kind = self.book.kinds.of(command)
        state = self.book.of(kind).get(kind.identity(command))
        events = decide_as(
            kind,
            state,
            command,
            self._clock(),
            principal=principal,
            producer=self._producer,
            leader_token=leader_token,
            outside=self.cluster.view.refusal,
            ceilings=self._ceilings,
        )
        records = event_records(events, self._producer, command_offset=offset)
        largest = max((record_size(record) for record in records), default=0)
        if largest > MAX_RECORD_BYTES:
            raise DecisionTooLarge(
                f"{command.type} decided an event of {largest} bytes, more than the"
                f" {MAX_RECORD_BYTES} a record of the log may have"
            )
        for event, record in zip(events, records, strict=True):
            self.book.apply(event, partition)
            self.cluster.apply(event)
            self._pending.append((event, record))
        return events

    async def _leader_token(self, command: AnyCommand) -> int | None:
        """The scheduler leader's token when ``command`` is fenced (only the scheduler's are), else None."""
        if command.fencing_token is None:
            return None
        try:
            return await self._election.current_token(SCHEDULER_ROLE)
        except ConnectionError:
            # The token cannot be checked now: refuse (the scheduler sends again) rather than
            # stall every other key of the partition until the election store is back.
            return -1

    async def _dead_letter(self, record: Record, reason: str) -> None:
        self.dead_letters += 1
        await dead_letter(self._bus, self._topics, record, reason)
