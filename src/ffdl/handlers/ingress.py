"""Tenants that write commands to the broker themselves: each to its own topic, relayed for that tenant.

The platform's commands topic is written by the platform alone (the broker's ACLs, see
``docs/security.md``), so the owner believes the principal header there. A service acting for a
tenant with direct access to the broker writes to the tenant's ingress topic
(:meth:`~ffdl.handlers.messaging.Topics.ingress`, which only that tenant may write), and the relay, a
platform role, copies each of its records to the commands topic with the tenant as the principal,
replacing any principal header the record brought: whatever a record on a tenant's topic says, it is
that tenant's. Key and value are copied unread, so the record lands on its key's partition and the
owner decodes, checks and decides it like any other (a record it cannot decode is dead-lettered
there); ``ffdl_ingress`` names where it came from.

A relay rather than owners that read the ingress topics too: the owner then decides every command of a
partition in the one order of the commands topic, which ``ffdl export --commands`` exports and
``ffdl verify --redecide`` decides again (an owner reading two topics interleaves them in an order no
log records), and an owner never depends on every member subscribing to the same topics (a range
assignment of a topic only some owners read gives its partitions to owners that do not hold the
jobs of that partition). The relay commits a batch once the commands topic has it: at least once;
a copy appended twice is the same command at another offset, which the owner takes for a repeat by
the aggregate's window of recent command ids (:func:`~ffdl.core.aggregate.seen`), not by its offset:
a copy that comes back after more than the window's commands of its job, or whose first copy
decided nothing, is decided again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import structlog

from ffdl.core.authorization import Principal
from ffdl.handlers.messaging import PRINCIPAL_HEADER, Topics, dead_letter
from ffdl.handlers.ports import MAX_RECORD_BYTES, Bus, OutgoingRecord, Record, TopicPartition, record_size

log = structlog.get_logger(__name__)

#: The header that names the ingress topic, partition and offset a relayed command came from.
INGRESS_HEADER = "ffdl_ingress"


def relayed(record: Record, principal: Principal) -> OutgoingRecord:
    """``record`` as the relay appends it to the commands topic: sent for ``principal``."""
    kept = tuple(
        (name, value) for name, value in record.headers if name not in (PRINCIPAL_HEADER, INGRESS_HEADER)
    )
    origin = f"{record.topic}:{record.partition}:{record.offset}".encode()
    return OutgoingRecord(
        record.key,
        record.value,
        (*kept, (PRINCIPAL_HEADER, str(principal).encode()), (INGRESS_HEADER, origin)),
    )


class IngressRelay:
    """Copies the records of the tenants' ingress topics to the commands topic, each for its tenant."""

    def __init__(self, bus: Bus, topics: Topics, tenants: Iterable[str]) -> None:
        self._bus = bus
        self._topics = topics
        self._commands = topics.commands
        self._tenant_of = {topics.ingress(tenant): Principal.tenant(tenant) for tenant in tenants}

    @property
    def topics(self) -> list[str]:
        """The ingress topics it relays."""
        return sorted(self._tenant_of)

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        pass

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        pass

    async def process(self, records: Sequence[Record]) -> None:
        """Relay a batch; a record whose copy the log would refuse for its size (the tenant's topic
        took it, and the copy adds headers) is dead-lettered instead, with the reason: refused in
        the batch, it stopped the relay, and every tenant's commands behind it."""
        copies: list[OutgoingRecord] = []
        for record in records:
            copy = relayed(record, self._tenant_of[record.topic])
            size = record_size(copy)
            if size <= MAX_RECORD_BYTES:
                copies.append(copy)
                continue
            reason = f"relayed copy of {size} bytes is over the limit of {MAX_RECORD_BYTES} a record may have"
            await dead_letter(self._bus, self._topics, record, reason)
        if copies:
            await self._bus.publish(self._commands, copies)
        log.debug(
            "commands relayed", topic=records[0].topic, partition=records[0].partition, count=len(copies)
        )
