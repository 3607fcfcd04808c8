"""How handlers talk to the log: topic names, sending commands, appending events, dead letters.

A command gets a fresh random id unless its sender passes one derived from what caused it
(``events/ids.py``: a reaction's command, a pod's report), so that sending it again after a crash or
a redelivery makes the same command and the job's owner drops the repeat.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import structlog

from ffdl.core.aggregate import Address, CommandEnvelope, CommandHead
from ffdl.events.codec import (
    AnyCommand,
    AnyEvent,
    cloudevent_headers,
    command_headers,
    command_to_json,
    event_to_json,
)
from ffdl.events.position import Position
from ffdl.handlers.ports import Bus, OutgoingRecord, Record

log = structlog.get_logger(__name__)
C = TypeVar("C", bound=CommandEnvelope)
P = TypeVar("P")
#: The header that names why a record was dead-lettered (the tally classifies it for the metrics).
DEAD_LETTER_REASON_HEADER = "ffdl_dlq_reason"


@dataclass(frozen=True, slots=True)
class Topics:
    """The three topics of DESIGN §3, with a configurable prefix (``ffdl`` by default)."""

    commands: str = "ffdl.commands"
    events: str = "ffdl.events"
    deadletter: str = "ffdl.deadletter"

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(f"{prefix}.commands", f"{prefix}.events", f"{prefix}.deadletter")


def utcnow() -> datetime:
    return datetime.now(UTC)


class CommandSender:
    """Puts commands on the commands topic, keyed by job id or node key (so they reach the owner in order)."""

    def __init__(self, bus: Bus, topics: Topics, producer: str) -> None:
        self._bus = bus
        self._topics = topics
        self.producer = producer

    def make(
        self,
        to: Address[C, P],
        data: P,
        *,
        fencing_token: int | None = None,
        command_id: uuid.UUID | None = None,
    ) -> C:
        """A command to the aggregate at ``to`` (``JOBS.address(...)``, ``NODES.address(...)``).

        ``command_id``: where a repeat must be recognised as one, an id the caller derives from
        what the command is about; else a fresh one.
        """
        head: CommandHead = {
            "command_id": command_id or uuid.uuid4(),
            "issued_at": utcnow(),
            "producer": self.producer,
            "fencing_token": fencing_token,
        }
        return to.command(head, data)

    async def send(self, *commands: AnyCommand) -> list[Position]:
        records = [
            OutgoingRecord(c.key, command_to_json(c), tuple(command_headers(c, self.producer)))
            for c in commands
        ]
        positions = await self._bus.publish(self._topics.commands, records)
        for command, position in zip(commands, positions, strict=True):
            log.debug(
                "command sent",
                key=command.key,
                command=command.type,
                command_id=str(command.command_id),
                position=position.token,
            )
        return positions


def event_records(events: Sequence[AnyEvent], source: str) -> list[OutgoingRecord]:
    return [OutgoingRecord(e.key, event_to_json(e), tuple(cloudevent_headers(e, source))) for e in events]


def misrouted(record: Record, command: AnyCommand, home: int) -> str:
    """Why the owner of ``record``'s partition must not decide ``command`` (empty when it may).

    ``home`` is the partition the record's key belongs on. Another owner serves that key: deciding
    here would fork it. A producer that does not use Kafka's default (murmur2) partitioner puts
    commands on the wrong partition.
    """
    if command.key != record.key:
        return f"record key {record.key!r} is not the command's key {command.key!r}"
    if record.partition != home:
        return f"wrong partition: key {record.key!r} belongs on partition {home}, not {record.partition}"
    return ""


async def dead_letter(bus: Bus, topics: Topics, record: Record, reason: str) -> None:
    """Park an undecodable or inapplicable record with its reason and origin; processing moves on."""
    headers = (
        *record.headers,
        (DEAD_LETTER_REASON_HEADER, reason.encode()),
        ("ffdl_dlq_topic", record.topic.encode()),
        ("ffdl_dlq_partition", str(record.partition).encode()),
        ("ffdl_dlq_offset", str(record.offset).encode()),
    )
    await bus.publish(topics.deadletter, [OutgoingRecord(record.key, record.value, headers)])
    log.warning(
        "dead-lettered", topic=record.topic, partition=record.partition, offset=record.offset, reason=reason
    )
