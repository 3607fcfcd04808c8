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
jobs of that partition).

A record is copied once, however often it is delivered. The relay commits a batch once the commands
topic has its copies, so a relay that dies (or loses its partitions) between the two leaves the batch
to the next one, which used to copy it again: a second copy is the same command at a new offset of
the commands topic, no redelivery the owner can tell by its offset (architecture §10), and the
aggregate's window of recent command ids (:func:`~ffdl.core.aggregate.seen`) forgets a command after
64 others of its job and never holds one that decided nothing, so a copy that came back further on,
or whose first copy decided nothing, was decided again in the state the tenant's later commands had
left (a halt the tenant had resumed since halted the job again). So the relay reads back what was
copied before it took a partition over. Only records that were on the tenant's partition when it
began relaying it (:attr:`_ReadBack.until`) can have been copied by another relay; for such a record
it finds, on the commands partition its key goes to, the last copy the ``ffdl_ingress`` header says
came from the same tenant partition, and skips every record at or below that copy's source offset
(:attr:`IngressRelay.already_relayed` counts them). That copy names the furthest the earlier copies
reached there because one relay at a time copies a partition, in its order, and a publish that
fails leaves a prefix of its copies on each commands partition, never a later copy without the
earlier ones (the embedded log appends a publish in one transaction; the Kafka bus sends a
partition's next batch only once the one before it was acknowledged, where aiokafka alone would
send the batch behind one that failed for good: docs/kafka.md). A publish to several partitions of
Kafka is no transaction, so the read-back is per commands partition. A read-back that fails is no
poison record: the relay has no poison guard, the error stops it, and it is run again.
Only the relay writes ``ffdl_ingress`` on the commands topic (the copy replaces any header of that
name the tenant's record brought, and the platform's other writers set none), and the copy also
carries the tenant's principal, so a tenant cannot name positions it did not write, nor another
tenant's topic; and the copy is believed once the tenant's partition holds, at the offset it names,
the key and value it carries, so a tenant topic made anew (its offsets from 0 again) never has its
records taken for ones already copied. The read goes back from the end of the commands partition to
the latest copy from that tenant partition: little after a relay died (its copies are among the last
records), at most the whole partition for a tenant partition that has not sent there for long (as
much as an owner folds when it takes a partition over), and only for partitions that had records
waiting when the relay took them over.

A relay the group expelled (paused, or cut off past its session) still holds what it fetched and
learns that it lost its partitions only at its next call to the group, while the relay that took them
over copies the same records; its copies, appended then, would be second copies the read-back above
never sees (it reads before they land). So the relay is fenced as the owners are: it is a
:class:`~ffdl.handlers.runtime.FetchProcessor` run with ``consume(..., fenced=True)``.
:meth:`IngressRelay.process` only works a fetch's copies out, :meth:`IngressRelay.flush` appends them,
every partition's in one publish, and before it the member commits the offsets the fetch began at,
which changes nothing for a member of the group and is refused to one it expelled (the embedded log
checks that the member still holds the partitions, Kafka's coordinator that it is of the group's
current generation). A refused relay raises :class:`~ffdl.handlers.runtime.StaleMember` with nothing
appended; its copies are dropped (on an error, a revoke or an assignment), and run again by its
supervisor it works out anew, from the log, what is still to copy. A record dead-lettered for its size
is parked at once, as the owners park theirs: an expelled relay may park one twice.

What the fence leaves, on both buses (neither refuses the append itself to an expelled member): the
time between that commit and the append reaching the log. A relay frozen exactly there until the group
has expelled it (its session) and its successor has read back the commands partition (on Kafka also an
append that reaches the broker that late: held up in the network, or retried by the producer up to the
request timeout) appends copies its successor makes too. Such a second copy is left to the window of
recent command ids, as every second copy was before, and a later relay that reads back may take it for
the last copy there (then it copies again, never skips, what its predecessor copied after it). Closing
it needs the append refused to an expelled member: on the embedded log an append that checks the
member's claims in its own transaction; on Kafka a transactional producer fenced for the group (by a
transactional id per tenant partition, or by the group's generation, KIP-447), which tansu does not
have and aiokafka does not send the generation for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from ffdl.core.authorization import Principal
from ffdl.handlers.messaging import PRINCIPAL_HEADER, Topics, dead_letter
from ffdl.handlers.ports import MAX_RECORD_BYTES, Bus, OutgoingRecord, Record, TopicPartition, record_size
from ffdl.handlers.runtime import UNREACHABLE

log = structlog.get_logger(__name__)

#: The header that names the ingress topic, partition and offset a relayed command came from.
INGRESS_HEADER = "ffdl_ingress"
#: Records of a commands partition the read-back reads at first, going back from its end; each
#: further read goes twice as far back, up to :data:`READ_BACK_MOST` at a time.
READ_BACK_FIRST = 256
READ_BACK_MOST = 16_384


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


def origin_of(copy: Record) -> tuple[str, int, int, Principal] | None:
    """Where the relayed command in ``copy`` (a record of the commands topic) came from: the tenant's
    topic, partition and offset its one ``ffdl_ingress`` header names, and the principal its one
    principal header names; None for a record the relay did not write."""
    origins = [value for name, value in copy.headers if name == INGRESS_HEADER]
    principals = [value for name, value in copy.headers if name == PRINCIPAL_HEADER]
    if len(origins) != 1 or len(principals) != 1:
        return None
    try:
        topic, partition, offset = origins[0].decode().rsplit(":", 2)
        return topic, int(partition), int(offset), Principal.parse(principals[0].decode())
    except ValueError:  # UnicodeDecodeError is one
        return None


@dataclass(slots=True)
class _ReadBack:
    """What a relay that took a tenant's partition over knows of the copies made before: ``until``,
    the partition's end when it began (no other relay can have copied a record at or after it), and
    per commands partition, the highest offset of a record of this partition copied there (-1: none),
    read back the first time a record below ``until`` goes there."""

    until: int
    copied: dict[int, int] = field(default_factory=dict)


class IngressRelay:
    """Copies the records of the tenants' ingress topics to the commands topic, each for its tenant,
    once each (see the module's docstring)."""

    def __init__(self, bus: Bus, topics: Topics, tenants: Iterable[str]) -> None:
        self._bus = bus
        self._topics = topics
        self._commands = topics.commands
        self._tenant_of = {topics.ingress(tenant): Principal.tenant(tenant) for tenant in tenants}
        #: Per tenant partition whose records below ``until`` are still to come, what was copied before.
        self._read_back: dict[TopicPartition, _ReadBack] = {}
        #: The tenant partitions past their ``until`` (or begun where nothing was waiting).
        self._past: set[TopicPartition] = set()
        #: The copies the fetch's batches made, appended by :meth:`flush`.
        self._pending: list[OutgoingRecord] = []
        #: Records skipped because the commands topic had their copy already (delivered again).
        self.already_relayed = 0

    @property
    def topics(self) -> list[str]:
        """The ingress topics it relays."""
        return sorted(self._tenant_of)

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        """Note where each partition ends now: another relay may have copied records before that,
        none after. (Unreachable, the log is asked at the partition's first batch instead, which
        only reads back more than needed.)"""
        self._forget_pending()
        self._forget(partitions)
        for topic in {where.topic for where in partitions}:
            try:
                ends = await self._bus.end_offsets(topic)
            except UNREACHABLE as exc:
                log.warning(
                    "cannot read where the partitions end; asking again later", topic=topic, error=str(exc)
                )
                continue
            for where in partitions:
                if where.topic == topic:
                    self._read_back[where] = _ReadBack(ends.get(where.partition, 0))

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self._forget_pending()
        self._forget(partitions)

    def _forget(self, partitions: Iterable[TopicPartition]) -> None:
        for where in partitions:
            self._read_back.pop(where, None)
            self._past.discard(where)

    async def process(self, records: Sequence[Record]) -> None:
        """Work out the copies of a batch of one partition, but for the records whose copies the
        commands topic has already; they wait for :meth:`flush`. A record whose copy the log would
        refuse for its size (the tenant's topic took it, and the copy adds headers) is dead-lettered
        instead, with the reason: refused in the batch, it stopped the relay, and every tenant's
        commands behind it."""
        try:
            await self._copy(records)
        except BaseException:
            self._forget_pending()
            raise

    async def _copy(self, records: Sequence[Record]) -> None:
        copies = 0
        skipped = 0
        for record in records:
            if await self._relayed_already(record):
                skipped += 1
                continue
            copy = relayed(record, self._tenant_of[record.topic])
            size = record_size(copy)
            if size <= MAX_RECORD_BYTES:
                self._pending.append(copy)
                copies += 1
                continue
            reason = f"relayed copy of {size} bytes is over the limit of {MAX_RECORD_BYTES} a record may have"
            await dead_letter(self._bus, self._topics, record, reason)
        if skipped:
            self.already_relayed += skipped
            log.info(
                "records the commands topic has copies of already skipped",
                topic=records[0].topic,
                partition=records[0].partition,
                count=skipped,
                first=records[0].offset,
            )
        log.debug("commands to relay", topic=records[0].topic, partition=records[0].partition, count=copies)

    async def flush(self) -> None:
        """Append the copies of every partition of the fetch, in one publish."""
        copies, self._pending = self._pending, []
        if copies:
            await self._bus.publish(self._commands, copies)
            log.debug("commands relayed", count=len(copies))

    def _forget_pending(self) -> None:
        """The fetch failed, or the partitions moved: none of its copies may reach the log (the fetch
        is delivered again, to this relay or the next, which works them out anew)."""
        if self._pending:
            log.info("copies not appended: their fetch is delivered again", count=len(self._pending))
        self._pending = []

    async def _relayed_already(self, record: Record) -> bool:
        """Whether the commands topic holds a copy of ``record`` made before this relay took its
        partition over (by a relay that died before it committed, or lost the partition meanwhile)."""
        where = record.where
        if where in self._past:
            return False
        read_back = self._read_back.get(where)
        if read_back is None:
            ends = await self._bus.end_offsets(record.topic)
            read_back = self._read_back[where] = _ReadBack(ends.get(record.partition, 0))
        if record.offset >= read_back.until:
            del self._read_back[where]
            self._past.add(where)
            return False
        target = self._bus.partition_for(record.key)
        copied = read_back.copied.get(target)
        if copied is None:
            copied = read_back.copied[target] = await self._last_copied(record, target)
        return record.offset <= copied

    async def _last_copied(self, record: Record, target: int) -> int:
        """The highest offset of a record of ``record``'s partition copied to ``target``, the commands
        partition its key goes to (-1: none): the offset the last copy from that partition names,
        read back from the end of ``target`` (copies of a partition are appended in its order).
        ``record`` is the first record of its partition bound for ``target`` since this relay took the
        partition over: a copy that would have it skipped is believed once the tenant's partition is
        found to hold what the copy carries."""
        ends = await self._bus.end_offsets(self._commands)
        high = ends.get(target, 0)
        span = READ_BACK_FIRST
        while high > 0:
            low = max(0, high - span)
            latest: tuple[int, Record] | None = None  # the last copy from the partition in the span
            read = 0
            async for copy in self._bus.read(self._commands, target, low, high):
                read += 1
                offset = self._copied_from(copy, record.where)
                if offset is not None:
                    latest = (offset, copy)
            if latest is not None:
                offset, copy = latest
                if offset >= record.offset and not await self._holds(record.where, offset, copy):
                    return -1
                return offset
            if not read:
                break  # below where the partition begins (what retention removed)
            high, span = low, min(2 * span, READ_BACK_MOST)
        return -1

    def _copied_from(self, copy: Record, where: TopicPartition) -> int | None:
        """The offset of the record of ``where`` (a tenant's partition) that ``copy`` is a copy of, or
        None when it is none: a relayed copy names its origin, and is sent for the origin's tenant."""
        origin = origin_of(copy)
        if origin is None:
            return None
        topic, partition, offset, principal = origin
        if (topic, partition) != (where.topic, where.partition) or principal != self._tenant_of[topic]:
            return None
        return offset if offset >= 0 else None

    async def _holds(self, where: TopicPartition, offset: int, copy: Record) -> bool:
        """Whether the tenant's partition holds at ``offset`` what ``copy`` carries (a tenant topic made
        anew starts its offsets again: a copy from the old one names a record that is not there)."""
        held = [record async for record in self._bus.read(where.topic, where.partition, offset, offset + 1)]
        if (
            len(held) == 1
            and held[0].offset == offset
            and (held[0].key, held[0].value) == (copy.key, copy.value)
        ):
            return True
        log.warning(
            "the tenant's topic does not hold at its offset the record a copy on the commands topic names:"
            " it is not the topic the copy was made from, and no record is taken for one already copied",
            topic=where.topic,
            partition=where.partition,
            offset=offset,
            copy_offset=copy.offset,
        )
        return False
