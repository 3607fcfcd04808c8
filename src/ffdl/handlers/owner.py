"""The job owner: the only writer of a job's events, and of a node's (DESIGN §5).

It is a member of the owners' consumer group on the commands topic. For each partition it gains
it first folds that partition of the events topic to its end, then decides every command of the
partition against the folded state and appends the resulting events (keyed by job id, so to the
same partition number). A batch's events are appended in one publish and the command offsets are
committed only after the log acknowledged them. Bad input never stops the partition: undecodable
commands, commands for unknown jobs or nodes, commands on another partition than their key's (whose job
another owner serves) and internal errors go to the dead-letter topic with their reason; illegal
commands become ``CommandRejected`` (``NodeCommandRejected``) events. Nodes are keyed like jobs
(``node:<name>``), so the owner of that key's partition decides them with the node decider.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from ffdl.core.decider import UnknownJob, decide
from ffdl.core.nodes import UnknownNode, decide_node
from ffdl.core.restart import RestartPolicy
from ffdl.events.codec import AnyCommand, AnyEvent, DecodeError, any_command_from_json
from ffdl.events.envelope import Command, NodeEvent
from ffdl.handlers.messaging import Topics, dead_letter, event_records, misrouted, utcnow
from ffdl.handlers.ports import Bus, Election, Record, TopicPartition
from ffdl.handlers.runtime import AggregateBook

log = structlog.get_logger(__name__)

SCHEDULER_ROLE = "scheduler"


class JobOwner:
    def __init__(
        self,
        bus: Bus,
        topics: Topics,
        election: Election,
        *,
        producer: str = "owner",
        policy: RestartPolicy | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._bus = bus
        self._topics = topics
        self._election = election
        self._producer = producer
        self._policy = policy or RestartPolicy()
        self._clock = clock
        self.book = AggregateBook(bus, topics.events)
        self.dead_letters = 0

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topics.commands)
        await self.book.load(mine)
        log.info("owning partitions", partitions=mine, jobs=len(self.book.jobs))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.book.drop(tp.partition for tp in partitions if tp.topic == self._topics.commands)

    async def process(self, records: Sequence[Record]) -> None:
        decided: list[AnyEvent] = []
        for record in records:
            decided.extend(await self._decide(record))
        if decided:
            await self._bus.publish(self._topics.events, event_records(decided, self._producer))
            for event in decided:
                log.info(
                    "event appended",
                    **({"node": event.node} if isinstance(event, NodeEvent) else {"job_id": event.job_id}),
                    type=event.type,
                    seq=event.seq,
                    event_id=str(event.event_id),
                    causation_id=str(event.causation_id),
                )

    async def _decide(self, record: Record) -> list[AnyEvent]:
        try:
            command = any_command_from_json(record.value)
        except DecodeError as exc:
            return await self._dead_letter(record, exc.reason)
        wrong = misrouted(record, command, self._bus.partition_for(record.key))
        if wrong:
            return await self._dead_letter(record, wrong)
        leader = await self._leader_token(command)
        try:
            events = self._decide_command(command, leader)
        except (UnknownJob, UnknownNode) as exc:
            return await self._dead_letter(record, str(exc))
        except Exception as exc:  # a decider bug must not stall the partition
            log.exception("decider failed", key=command.key, command_id=str(command.command_id))
            return await self._dead_letter(record, f"internal error: {exc!r}")
        for event in events:
            if isinstance(event, NodeEvent):
                self.book.apply_node(event, record.partition)
            else:
                self.book.apply(event, record.partition)
        return events

    def _decide_command(self, command: AnyCommand, leader: int | None) -> list[AnyEvent]:
        now = self._clock()
        if isinstance(command, Command):
            job = self.book.jobs.get(command.job_id)
            return [
                *decide(job, command, now, policy=self._policy, producer=self._producer, leader_token=leader)
            ]
        node = self.book.nodes.get(command.node)
        return [*decide_node(node, command, now, producer=self._producer, leader_token=leader)]

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

    async def _dead_letter(self, record: Record, reason: str) -> list[AnyEvent]:
        self.dead_letters += 1
        await dead_letter(self._bus, self._topics, record, reason)
        return []
