"""The job owner: the only writer of a job's events (DESIGN §5).

It is a member of the owners' consumer group on the commands topic. For each partition it gains
it first folds that partition of the events topic to its end, then decides every command of the
partition against the folded state and appends the resulting events (keyed by job id, so to the
same partition number). A batch's events are appended in one publish and the command offsets are
committed only after the log acknowledged them. Bad input never stops the partition: undecodable
commands, commands for unknown jobs, commands on another partition than their key's (whose job
another owner serves) and internal errors go to the dead-letter topic with their reason; illegal
commands become ``CommandRejected`` events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from ffdl.core.decider import UnknownJob, decide
from ffdl.core.restart import RestartPolicy
from ffdl.events.codec import DecodeError, command_from_json
from ffdl.events.envelope import Event
from ffdl.handlers.messaging import Topics, dead_letter, event_records, utcnow
from ffdl.handlers.ports import Bus, Election, Record, TopicPartition
from ffdl.handlers.runtime import JobBook

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
        self.book = JobBook(bus, topics.events)
        self.dead_letters = 0

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        mine = sorted(tp.partition for tp in partitions if tp.topic == self._topics.commands)
        await self.book.load(mine)
        log.info("owning partitions", partitions=mine, jobs=len(self.book.jobs))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.book.drop(tp.partition for tp in partitions if tp.topic == self._topics.commands)

    async def process(self, records: Sequence[Record]) -> None:
        decided: list[Event] = []
        for record in records:
            decided.extend(await self._decide(record))
        if decided:
            await self._bus.publish(self._topics.events, event_records(decided, self._producer))
            for event in decided:
                log.info(
                    "event appended",
                    job_id=event.job_id,
                    type=event.type,
                    seq=event.seq,
                    event_id=str(event.event_id),
                    causation_id=str(event.causation_id),
                )

    async def _decide(self, record: Record) -> list[Event]:
        try:
            command = command_from_json(record.value)
        except DecodeError as exc:
            return await self._dead_letter(record, exc.reason)
        if command.job_id != record.key:
            return await self._dead_letter(record, f"record key {record.key!r} is not the command's job_id")
        home = self._bus.partition_for(record.key)
        if record.partition != home:
            # Another owner serves the job: deciding here would fork it. A producer that does not use
            # Kafka's default (murmur2) partitioner puts commands on the wrong partition.
            wrong = f"wrong partition: key {record.key!r} belongs on partition {home}, not {record.partition}"
            return await self._dead_letter(record, wrong)
        leader = None
        if command.fencing_token is not None:  # only the scheduler's commands are fenced
            try:
                leader = await self._election.current_token(SCHEDULER_ROLE)
            except ConnectionError:
                # The token cannot be checked now: refuse (the scheduler offers again) rather than
                # stall every other job of the partition until the election store is back.
                leader = -1
        job = self.book.jobs.get(command.job_id)
        try:
            events = decide(
                job, command, self._clock(), policy=self._policy, producer=self._producer, leader_token=leader
            )
        except UnknownJob as exc:
            return await self._dead_letter(record, str(exc))
        except Exception as exc:  # a decider bug must not stall the partition
            log.exception("decider failed", job_id=command.job_id, command_id=str(command.command_id))
            return await self._dead_letter(record, f"internal error: {exc!r}")
        for event in events:
            self.book.apply(event, record.partition)
        return events

    async def _dead_letter(self, record: Record, reason: str) -> list[Event]:
        self.dead_letters += 1
        await dead_letter(self._bus, self._topics, record, reason)
        return []
