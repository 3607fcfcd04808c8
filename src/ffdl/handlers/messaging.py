"""How handlers talk to the log: topic names, sending commands, appending events, dead letters.

A command gets a fresh random id unless its sender passes one derived from what caused it
(``events/ids.py``: a reaction's command, a pod's report), so that sending it again after a crash or
a redelivery makes the same command and the job's owner drops the repeat.

Every command is sent for a principal (:mod:`ffdl.core.authorization`), named in the record's
:data:`PRINCIPAL_HEADER`: the sender's own (a platform role's, the scheduler's) or, for the API,
its caller's. Only the platform's processes may write the commands topic (the broker's ACLs, see
``docs/security.md``), so the owner believes that header there (:func:`principal_of`); tenants that
write to Kafka themselves write to their own ingress topic (:meth:`Topics.ingress`), whose records
the ingress relay attributes to that tenant whatever they say.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import structlog

from ffdl.core.aggregate import Address, CommandEnvelope, CommandHead
from ffdl.core.authorization import Principal, PrincipalKind, legacy_principal
from ffdl.events.codec import (
    AnyCommand,
    AnyEvent,
    cloudevent_headers,
    command_headers,
    command_to_json,
    event_to_json,
)
from ffdl.events.job_events import quoted, within_reason
from ffdl.events.position import Position
from ffdl.handlers.ports import Bus, OutgoingRecord, Record, RecordTooLarge

log = structlog.get_logger(__name__)
C = TypeVar("C", bound=CommandEnvelope)
P = TypeVar("P")
#: The header that names why a record was dead-lettered (the tally classifies it for the metrics).
DEAD_LETTER_REASON_HEADER = "ffdl_dlq_reason"
#: The header that names the topic a dead-lettered record was read from.
DEAD_LETTER_TOPIC_HEADER = "ffdl_dlq_topic"
#: A record's id header (a command's id) that a parked head keeps, when it is no longer than this:
#: the command's sender (the API) finds its refusal by it.
PARKED_ID_BYTES = 64
#: How much of a record too large to park whole is parked: the head of its value, and of its key.
PARKED_HEAD_BYTES = 64 * 1024
PARKED_KEY_CHARS = 1024
#: The header that names the principal a command on the commands topic is sent for (``tenant:acme``).
PRINCIPAL_HEADER = "ffdl_principal"
#: The header of an event record the owner appends that names the offset of the command that caused
#: the event, on the commands topic's partition of the same number (the owner skips a redelivered
#: command by it: :class:`~ffdl.handlers.owner.JobOwner`).
COMMAND_OFFSET_HEADER = "ffdl_command_offset"


@dataclass(frozen=True, slots=True)
class Topics:
    """The three topics of architecture §3, with a configurable prefix (``ffdl`` by default), and the
    tenants' ingress topics."""

    commands: str = "ffdl.commands"
    events: str = "ffdl.events"
    deadletter: str = "ffdl.deadletter"
    prefix: str = "ffdl"

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(f"{prefix}.commands", f"{prefix}.events", f"{prefix}.deadletter", prefix)

    def ingress(self, tenant: str) -> str:
        """The topic a tenant with direct access to the broker writes its commands to."""
        return f"{self.prefix}.tenant.{tenant}.commands"


def utcnow() -> datetime:
    return datetime.now(UTC)


class CommandSender:
    """Puts commands on the commands topic, keyed by job id or node key (so they reach the owner in order),
    each for ``principal`` unless sent for another (the API sends for its caller)."""

    def __init__(self, bus: Bus, topics: Topics, producer: str, principal: Principal) -> None:
        self._bus = bus
        self._topics = topics
        self.producer = producer
        self.principal = principal

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

    async def send(self, *commands: AnyCommand, principal: Principal | None = None) -> list[Position]:
        """Append ``commands``, sent for ``principal`` (default: the sender's own)."""
        sent_for = (PRINCIPAL_HEADER, str(principal or self.principal).encode())
        records = [
            OutgoingRecord(c.key, command_to_json(c), (*command_headers(c, self.producer), sent_for))
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


def event_records(
    events: Sequence[AnyEvent], source: str, *, command_offset: int | None = None
) -> list[OutgoingRecord]:
    """The records of ``events``; ``command_offset``: the offset of the command that caused them on
    its partition of the commands topic, which each record then names (:data:`COMMAND_OFFSET_HEADER`)."""
    extra = () if command_offset is None else ((COMMAND_OFFSET_HEADER, str(command_offset).encode()),)
    return [OutgoingRecord(e.key, event_to_json(e), (*cloudevent_headers(e, source), *extra)) for e in events]


def misrouted(record: Record, command: AnyCommand, home: int) -> str:
    """Why the owner of ``record``'s partition must not decide ``command`` (empty when it may).

    ``home`` is the partition the record's key belongs on. Another owner serves that key: deciding
    here would fork it. A producer that does not use Kafka's default (murmur2) partitioner puts
    commands on the wrong partition.
    """
    if command.key != record.key:
        return f"record key {quoted(repr(record.key))} is not the command's key {command.key!r}"
    if record.partition != home:
        return f"wrong partition: key {record.key!r} belongs on partition {home}, not {record.partition}"
    return ""


def principal_of(record: Record, command: AnyCommand) -> Principal:
    """Whom the command in ``record`` (on the platform's commands topic) was sent for: its principal
    header, or, a record of a producer older than principals, :func:`legacy_principal`.

    Raises ValueError for a header that names no principal, or for more than one; and for a command
    of anyone but the platform's roles whose id is name-based (UUID version 5), as the platform's
    own are. The owner takes a command id it has seen on an aggregate for a redelivery and decides
    nothing, whoever sent it, and the platform derives the ids of its reactions from what a tenant
    can read (the job, the attempt, the seq: :mod:`ffdl.events.ids`): a tenant that sent its job a
    command with the id of the job's coming ``ReleaseGpus`` kept the job's GPUs held after it ended.
    A random id (version 4, as the API and ``ffdl.learner`` make them) never is one of those.
    """
    named = [value for name, value in record.headers if name == PRINCIPAL_HEADER]
    if not named:
        return legacy_principal(command)
    if len(named) > 1:
        raise ValueError(f"bad {PRINCIPAL_HEADER} header: {len(named)} of them, for one command")
    try:
        principal = Principal.parse(named[0].decode())
    except UnicodeDecodeError as exc:
        raise ValueError(f"bad {PRINCIPAL_HEADER} header: not UTF-8 ({exc})") from exc
    except ValueError as exc:
        raise ValueError(f"bad {PRINCIPAL_HEADER} header: {exc}") from exc
    if principal.kind not in _PLATFORM_KINDS and command.command_id.version == NAME_BASED_ID_VERSION:
        raise ValueError(
            f"{command.type} from {principal} refused: its id {command.command_id} is name-based "
            f"(UUID version {NAME_BASED_ID_VERSION}), the kind the platform derives its own from; "
            "send a random one (version 4)"
        )
    return principal


#: The UUID version of the ids the platform derives (:mod:`ffdl.events.ids`), its roles' alone.
NAME_BASED_ID_VERSION = 5
_PLATFORM_KINDS = frozenset({PrincipalKind.PLATFORM, PrincipalKind.SCHEDULER})


async def dead_letter(bus: Bus, topics: Topics, record: Record, reason: str) -> None:
    """Park an undecodable or inapplicable record with its reason and origin; processing moves on.

    A dead letter always fits the log's limit: its reason is cut to a reason's length (it may quote
    what the record holds), and a record too large to park whole is parked as the heads of its key
    and value, without its own headers but its id (``ce_id``, when short). One the log refused raised
    out of the role's processing, uncommitted, and the role, restarted, met the same record again,
    for ever."""
    reason = within_reason(reason)
    headers = (
        *record.headers,
        (DEAD_LETTER_REASON_HEADER, reason.encode()),
        (DEAD_LETTER_TOPIC_HEADER, record.topic.encode()),
        ("ffdl_dlq_partition", str(record.partition).encode()),
        ("ffdl_dlq_offset", str(record.offset).encode()),
    )
    try:
        await bus.publish(topics.deadletter, [OutgoingRecord(record.key, record.value, headers)])
    except RecordTooLarge:
        # The record with its reason does not fit the log's limit: park the heads of its key and
        # value with the reason and origin (not its own headers but a short id), and how long each was.
        short_id = [(name, v) for name, v in record.headers if name == "ce_id" and len(v) <= PARKED_ID_BYTES]
        ours = (
            *short_id[:1],
            *headers[len(record.headers) :],
            ("ffdl_dlq_truncated_from", str(len(record.value)).encode()),
            ("ffdl_dlq_key_truncated_from", str(len(record.key)).encode()),
        )
        head = OutgoingRecord(record.key[:PARKED_KEY_CHARS], record.value[:PARKED_HEAD_BYTES], ours)
        await bus.publish(topics.deadletter, [head])
    log.warning(
        "dead-lettered", topic=record.topic, partition=record.partition, offset=record.offset, reason=reason
    )
