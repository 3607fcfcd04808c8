"""The event log on a Kafka cluster (or any broker that speaks its protocol, such as tansu), with aiokafka.

It gives handlers the same :class:`~ffdl.handlers.ports.Bus` as the embedded log, and passes the same
contract suite: one producer for every append, one consumer per group member, and one group-less
consumer for reading partitions by offset.

Topics
    ``start`` creates the topics the caller names (the platform names ``commands``, ``events`` and
    ``deadletter`` with its prefix) when they are missing; any other topic is created on first use.
    Every topic has the bus's partition count, so a job's commands and events share a partition number;
    a topic that exists with another count is refused (as the embedded log refuses a file made with
    another count), since a key would land elsewhere than :meth:`KafkaBus.partition_for` says.

Appends
    A record's partition is Kafka's default partitioner of its key (murmur2, :mod:`.partitioning`), so
    Java clients, aiokafka and the embedded log agree on it. ``publish`` sends each partition's records
    as batches of up to 1 MiB, the next only once the broker acknowledged the one before (``acks=all``
    unless configured otherwise), so a publish that fails leaves a prefix of its records on each
    partition (aiokafka alone sends the batch queued behind one whose retries ran out); it returns
    with the partition and offset the broker gave each record. The producer keeps one batch in flight
    per partition, so a retried batch cannot overtake a later one; without idempotence (tansu has none) a
    retry after a lost acknowledgement may append a record twice, which readers ignore by ``seq``.

Consumer groups
    A :class:`KafkaSubscription` is an ``AIOKafkaConsumer`` in the group, committing by hand, starting
    where the group committed (else at the beginning), with the range assignor so topics subscribed
    together keep partition ``p`` on one member. aiokafka rebalances in its coordinator task (the eager
    protocol: every member revokes everything, then each is assigned its share), while the group's
    caller works in its own task. The subscription keeps the two apart with one lock, the *turn*:
    ``fetch`` takes it before returning records and keeps it until the caller's next ``fetch`` or
    ``close``, so the caller processes and commits a batch while it holds the turn, and rebalance
    callbacks take the turn before they call our listener. A listener therefore never runs while the
    caller is in the middle of a batch, and a member commits what it processed before it is revoked.
    Records of a partition the member was assigned but whose ``on_assigned`` has not run yet are not
    handed out: the consumer is rewound to them, so they come again once the listener has run.
    Records of a partition revoked meanwhile are dropped (the next owner reads them from the committed
    offset). ``commit`` refuses partitions the member does not own, and a commit the group refuses
    (the member was expired, or the group rebalanced) raises :class:`CommitFailed`.

Reading by offset
    ``read`` and ``end_offsets`` share one group-less consumer; a lock gives each page of a read the
    consumer to itself. The end of a partition is the high watermark a fetch response reports. (The
    ListOffsets answer cannot be trusted on tansu: it says the last *batch*'s base offset plus one.)
    ``committed`` asks the group's coordinator (OffsetFetch, through the admin client).

Broker trouble
    An unreachable broker at ``start`` raises :class:`BusUnavailable` (the platform retries with
    backoff). Later, aiokafka reconnects by itself: fetches come back empty, appends and commits wait
    (appends up to the request timeout, then :class:`BusUnavailable`), and a member whose session ran
    out while the broker was away rejoins and is revoked and assigned again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Literal

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NoBrokersAvailable,
    NodeNotReadyError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.commit import OffsetCommitRequest

from ffdl.adapters.bus.kafka_config import KafkaConfig
from ffdl.adapters.bus.listening import partition_names, tell_listener
from ffdl.adapters.bus.partitioning import partition_for
from ffdl.events.position import Position
from ffdl.handlers.ports import (
    MAX_RECORD_BYTES,
    BusUnavailable,
    CommitFailed,
    OutgoingRecord,
    RebalanceListener,
    Record,
    RecordTooLarge,
    TopicPartition,
    record_size,
)

log = structlog.get_logger(__name__)

#: Errors that mean the brokers cannot be reached (now): callers retry.
UNREACHABLE = (
    KafkaConnectionError,
    KafkaTimeoutError,
    NoBrokersAvailable,
    NodeNotReadyError,
    RequestTimedOutError,
)
#: How long one poll of the reading consumer waits for a fetch response.
READ_POLL_MS = 20
#: Records one page of a read returns at most.
READ_PAGE = 5_000


_header_value = itemgetter(1)


def _to_record(message: ConsumerRecord[bytes, bytes]) -> Record:
    key = message.key.decode(errors="replace") if message.key is not None else ""
    headers = message.headers
    if not all(map(_header_value, headers)):  # a header sent without a value reads as b"" (checked in C: hot)
        headers = tuple((name, value or b"") for name, value in headers)
    return Record(
        message.topic,
        message.partition,
        message.offset,
        key,
        message.value or b"",
        headers,
        message.timestamp,
    )


class KafkaSubscription:
    """A member of a consumer group on Kafka (see the module docstring for how rebalances meet the caller)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        group: str,
        topics: Sequence[str],
        listener: RebalanceListener | None,
    ) -> None:
        self._consumer = consumer
        self.group = group
        self._topics = tuple(sorted(set(topics)))
        self._listener = listener
        #: The partitions whose ``on_assigned`` ran and whose ``on_revoked`` did not.
        self._owned: set[TopicPartition] = set()
        self._turn = asyncio.Lock()
        self._holds_turn = False
        #: Set whenever the listener was told of an assignment; cleared, under the turn, to wait for one.
        self._told = asyncio.Event()
        #: The group generation of the last assignment the listener was told of (see :meth:`commit`).
        self._generation: int | None = None
        self._closed = False
        self._log = log.bind(group=group)

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.subscribe(list(self._topics), listener=_Bridge(self))
        self._log.info("joining group", topics=list(self._topics))

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._owned)

    async def fetch(self, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        if self._closed:
            raise RuntimeError(f"this member of group {self.group!r} is closed")
        self._release_turn()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            batches = await self._consumer.getmany(
                timeout_ms=round(timeout_s * 1000), max_records=max_records
            )
        except UNREACHABLE as exc:
            raise BusUnavailable(f"cannot fetch for group {self.group!r}: {exc}") from exc
        await self._turn.acquire()
        self._holds_turn = True
        records: list[Record] = []
        untold = False
        assigned = self._consumer.assignment()
        for where, messages in batches.items():
            if TopicPartition(where.topic, where.partition) in self._owned:
                records.extend(_to_record(message) for message in messages)
            elif where in assigned:
                # Assigned, but the listener has not been told yet: fetch these again once it has.
                self._consumer.seek(where, messages[0].offset)
                untold = True
        if records:
            return records
        if untold:
            self._told.clear()
        self._release_turn()
        if untold:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._told.wait()
        return []

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        not_owned = set(offsets) - self._owned
        if not_owned:
            raise CommitFailed(
                f"this member of group {self.group!r} does not own {partition_names(not_owned)}"
            )
        if any(offset < 0 for offset in offsets.values()):
            raise ValueError(f"offsets are never negative: {dict(offsets)}")
        if not offsets:
            return
        self._check_generation(offsets)
        try:
            await self._consumer.commit(
                {KafkaTopicPartition(tp.topic, tp.partition): offset for tp, offset in offsets.items()}
            )
        except (CommitFailedError, IllegalStateError) as exc:
            raise CommitFailed(
                f"group {self.group!r} refused the commit of {partition_names(offsets)}: {exc}"
            ) from exc
        self._check_generation(offsets)

    def _check_generation(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Raise :class:`CommitFailed` unless the member is still of the generation its partitions
        were assigned in. A member the coordinator forgot (expelled past its session: frozen, or cut
        off) learns it from its next heartbeat, and aiokafka then forgets its generation: a commit
        sent after that goes without one, as a consumer outside any group commits, and a broker
        takes it for a group with no member left. So a relay thawed after its successor had copied
        and left had its fence commit taken, and appended its copies a second time (a flaky
        ``test_ingress_fence`` on tansu). Within the caller's turn the generation moves only so
        (a rebalance waits for the turn to revoke first), so a move, seen before the commit or after
        it (the heartbeat may come while it is sent), refuses it, as does no generation at all."""
        generation = self._consumer._coordinator.generation
        if generation != self._generation or generation == OffsetCommitRequest.DEFAULT_GENERATION_ID:
            raise CommitFailed(
                f"group {self.group!r} refused the commit of {partition_names(offsets)}: this member's "
                f"generation is {generation}, its partitions were assigned in {self._generation}"
            )

    async def close(self) -> None:
        """Revoke what this member owns (its listener may still commit), then leave the group."""
        if self._closed:
            return
        self._release_turn()
        async with self._turn:
            self._closed = True
            if self._owned:
                await self._call_listener("on_revoked", frozenset(self._owned))
                self._owned.clear()
        await self._consumer.stop()
        self._log.info("left group")

    async def abandon(self) -> None:
        """Stop as a killed process would: no revoke, no leave; the group expires it after its session.

        aiokafka always says goodbye when it stops a member it believes to be in the group, and has no
        public way not to; forgetting the generation first (as after the coordinator forgot the member)
        makes it stop without a word.
        """
        self._closed = True
        self._release_turn()
        self._consumer._coordinator.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID
        await self._consumer.stop()

    def _release_turn(self) -> None:
        if self._holds_turn:
            self._holds_turn = False
            self._turn.release()

    async def revoked(self, partitions: set[KafkaTopicPartition]) -> None:
        """The coordinator revokes ``partitions``: tell the listener when the caller is between batches."""
        async with self._turn:
            mine = frozenset(TopicPartition(tp.topic, tp.partition) for tp in partitions) & self._owned
            if self._closed or not mine:
                return
            self._log.info("partitions revoked", partitions=partition_names(mine))
            try:
                await self._call_listener("on_revoked", mine)
            finally:
                self._owned -= mine

    async def assigned(self, partitions: set[KafkaTopicPartition]) -> None:
        """The coordinator assigned ``partitions``: tell the listener when the caller is between batches."""
        async with self._turn:
            self._generation = self._consumer._coordinator.generation
            gained = frozenset(TopicPartition(tp.topic, tp.partition) for tp in partitions) - self._owned
            if self._closed or not gained:
                return
            self._log.info("partitions assigned", partitions=partition_names(gained))
            try:
                await self._call_listener("on_assigned", gained)
            finally:
                self._owned |= gained
                self._told.set()

    async def _call_listener(
        self, callback: Literal["on_assigned", "on_revoked"], partitions: frozenset[TopicPartition]
    ) -> None:
        await tell_listener(self._listener, callback, partitions, self._log)


class _Bridge(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's rebalance callbacks, handed to the subscription."""

    def __init__(self, subscription: KafkaSubscription) -> None:
        self._subscription = subscription

    async def on_partitions_revoked(self, revoked: set[KafkaTopicPartition]) -> None:
        await self._subscription.revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[KafkaTopicPartition]) -> None:
        await self._subscription.assigned(assigned)


class _OffsetReader:
    """One group-less consumer for reading partitions by offset; each page has it to itself."""

    def __init__(self, consumer: AIOKafkaConsumer, timeout_s: float) -> None:
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()

    async def page(self, topic: str, partition: int, start: int) -> tuple[list[Record], int]:
        """Records of one partition from ``start`` on (none at its end), and the partition's end then."""
        where = KafkaTopicPartition(topic, partition)
        async with self._lock:
            # A fresh assignment: no buffered records of another read, no high watermark from before.
            self._consumer.assign([where])
            self._consumer.seek(where, start)
            messages = await self._poll([where], lambda: self._consumer.highwater(where) is not None)
            end: int = self._consumer.highwater(where)
        return [_to_record(m) for m in messages.get(where, []) if m.offset < end], end

    async def ends(self, topic: str, partitions: int) -> dict[int, int]:
        everywhere = [KafkaTopicPartition(topic, p) for p in range(partitions)]
        async with self._lock:
            self._consumer.assign(everywhere)
            await self._consumer.seek_to_end(*everywhere)
            await self._poll(
                everywhere, lambda: all(self._consumer.highwater(w) is not None for w in everywhere)
            )
            return {w.partition: int(self._consumer.highwater(w)) for w in everywhere}

    async def _poll(
        self, where: list[KafkaTopicPartition], answered: Callable[[], bool]
    ) -> dict[KafkaTopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """Poll until fetch responses tell what ``answered`` waits for; the records they brought."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        fetched: dict[KafkaTopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        answer_seen = False
        while True:
            try:
                # Once answered, one more poll without waiting takes what came with the answer.
                batches = await self._consumer.getmany(
                    *where, timeout_ms=0 if answer_seen else READ_POLL_MS, max_records=READ_PAGE
                )
            except UNREACHABLE as exc:
                raise BusUnavailable(f"cannot read {[str(w) for w in where]}: {exc}") from exc
            for partition, messages in batches.items():
                fetched.setdefault(partition, []).extend(messages)
            if answer_seen:
                return fetched
            answer_seen = answered()
            if not answer_seen and loop.time() > deadline:
                raise BusUnavailable(f"no fetch answer for {[str(w) for w in where]} in {self._timeout_s} s")

    async def start(self) -> None:
        await self._consumer.start()

    async def close(self) -> None:
        await self._consumer.stop()


class KafkaBus:
    """The :class:`~ffdl.handlers.ports.Bus` on Kafka: ``bootstrap`` is ``HOST:PORT[,HOST:PORT...]``."""

    def __init__(
        self,
        bootstrap: str,
        partitions: int = 8,
        *,
        settings: KafkaConfig | None = None,
        topics: Sequence[str] = (),
    ) -> None:
        if partitions < 1:
            raise ValueError(f"a topic has at least one partition, got {partitions}")
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.settings = settings or KafkaConfig()
        self._topics = tuple(topics)
        self._ready_topics: set[str] = set()
        self._topics_lock = asyncio.Lock()
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: AIOKafkaProducer | None = None
        self._reader: _OffsetReader | None = None
        self._members: set[KafkaSubscription] = set()

    # -- connections ----------------------------------------------------------------------------

    def _connection_options(self) -> dict[str, Any]:
        s = self.settings
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "client_id": s.client_id,
            "request_timeout_ms": round(s.request_timeout_s * 1000),
            "security_protocol": s.security_protocol,
        }
        if s.security_protocol in ("SSL", "SASL_SSL"):
            context = create_ssl_context(
                cafile=s.ssl_cafile,
                certfile=s.ssl_certfile,
                keyfile=s.ssl_keyfile,
                password=s.ssl_key_password.get_secret_value() if s.ssl_key_password else None,
            )
            context.check_hostname = s.ssl_check_hostname
            options["ssl_context"] = context
        if s.security_protocol.startswith("SASL"):
            options["sasl_mechanism"] = s.sasl_mechanism
            options["sasl_plain_username"] = s.sasl_username
            options["sasl_plain_password"] = s.sasl_password.get_secret_value() if s.sasl_password else None
        return options

    def _consumer(self, group: str | None) -> AIOKafkaConsumer:
        s = self.settings
        session_ms = round(s.session_timeout_s * 1000)
        return AIOKafkaConsumer(
            **self._connection_options(),
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=min(round(s.heartbeat_interval_s * 1000), session_ms // 3),
            partition_assignment_strategy=(RangePartitionAssignor,),
            fetch_max_wait_ms=s.fetch_max_wait_ms,
        )

    async def start(self) -> None:
        """Connect and create the missing named topics; :class:`BusUnavailable` if no broker answers."""
        s = self.settings
        admin = AIOKafkaAdminClient(**self._connection_options())
        producer = AIOKafkaProducer(
            **self._connection_options(),
            acks="all" if s.acks == "all" else int(s.acks),
            enable_idempotence=s.enable_idempotence,
            linger_ms=s.linger_ms,
            max_request_size=MAX_RECORD_BYTES,  # record_size weighs a record as this producer does
            # publish sends a partition's batches one at a time: as few as the record limit allows
            # (a batch of this size is within a broker's default message.max.bytes, 1 MiB + 12)
            max_batch_size=MAX_RECORD_BYTES,
        )
        reader = _OffsetReader(self._consumer(None), s.request_timeout_s)
        try:
            await admin.start()
            self._admin = admin
            await self._ensure_topics(self._topics)
            await producer.start()
            await reader.start()
        except UNREACHABLE as exc:
            self._admin = None
            await _quietly(admin.close(), producer.stop(), reader.close())
            raise BusUnavailable(f"cannot reach the Kafka brokers at {self.bootstrap}: {exc}") from exc
        except BaseException:
            self._admin = None
            await _quietly(admin.close(), producer.stop(), reader.close())
            raise
        self._producer, self._reader = producer, reader
        log.info(
            "event log on Kafka",
            bootstrap=self.bootstrap,
            partitions=self.partitions,
            acks=s.acks,
            idempotence=s.enable_idempotence,
            security=s.security_protocol,
        )

    async def close(self) -> None:
        """Every member revokes and leaves its group, then the connections close."""
        for member in list(self._members):
            await member.close()
        self._members.clear()
        await self._disconnect()

    async def abandon(self) -> None:
        """Stop at once as a crashed process would, for crash drills: no member revokes, commits or leaves;
        their groups expire them after their session timeout. The connections close."""
        for member in list(self._members):
            await member.abandon()
        self._members.clear()
        await self._disconnect()

    async def _disconnect(self) -> None:
        producer, reader, admin = self._producer, self._reader, self._admin
        self._producer = self._reader = self._admin = None
        if producer is not None:
            await producer.stop()
        if reader is not None:
            await reader.close()
        if admin is not None:
            await admin.close()

    # -- topics ---------------------------------------------------------------------------------

    async def _ensure_topics(self, topics: Iterable[str]) -> None:
        missing = set(topics) - self._ready_topics
        if not missing:
            return
        async with self._topics_lock:
            missing -= self._ready_topics
            if not missing:
                return
            if self._admin is None:
                raise RuntimeError(f"the Kafka bus at {self.bootstrap} is not started")
            s = self.settings
            configs = (
                {} if s.min_insync_replicas is None else {"min.insync.replicas": str(s.min_insync_replicas)}
            )
            response = await self._admin.create_topics(
                [
                    NewTopic(t, self.partitions, s.replication_factor, topic_configs=configs)
                    for t in sorted(missing)
                ]
            )
            created = []
            for topic, code, message in response.topic_errors:
                if code == TopicAlreadyExistsError.errno:
                    continue
                if code != 0:
                    raise KafkaError(f"cannot create topic {topic!r}: error {code}: {message}")
                created.append(topic)
            for description in await self._admin.describe_topics(sorted(missing)):
                count = len(description["partitions"])
                if count != self.partitions:
                    raise ValueError(
                        f"topic {description['topic']!r} has {count} partitions, not {self.partitions}: "
                        "a key would land elsewhere than this platform expects"
                    )
            if created:
                log.info(
                    "topics created",
                    topics=created,
                    partitions=self.partitions,
                    replication_factor=s.replication_factor,
                )
            self._ready_topics |= missing

    # -- the Bus port ---------------------------------------------------------------------------

    def partition_for(self, key: str) -> int:
        return partition_for(key, self.partitions)

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        """Append ``records``; each partition keeps a prefix of its records should the append fail.

        A partition's records go as batches of up to :data:`MAX_RECORD_BYTES`, the next one built and
        sent only once the broker acknowledged the one before (the partitions of a publish go in
        parallel). aiokafka alone does not keep the prefix: a batch whose retries run past the
        request timeout fails, and the batch queued behind it is sent all the same, and lands."""
        if not records:
            return []
        producer = self._producer
        if producer is None:
            raise RuntimeError(f"the Kafka bus at {self.bootstrap} is not started")
        too_large = max(map(record_size, records))
        if too_large > MAX_RECORD_BYTES:  # refused before anything is sent
            raise RecordTooLarge(
                f"appending to {topic!r} refused: a record of {too_large} bytes, more than {MAX_RECORD_BYTES}"
            )
        await self._ensure_topics((topic,))
        partitions = [self.partition_for(record.key) for record in records]
        by_partition: dict[int, list[int]] = {}
        for index, partition in enumerate(partitions):
            by_partition.setdefault(partition, []).append(index)
        offsets: list[int] = [-1] * len(records)
        outcomes = await asyncio.gather(
            *(
                _append_in_order(producer, topic, partition, records, indices, offsets)
                for partition, indices in by_partition.items()
            ),
            return_exceptions=True,
        )
        for outcome in outcomes:
            # a batch whose retries ran out fails with the last error the broker answered
            if isinstance(outcome, UNREACHABLE) or (isinstance(outcome, KafkaError) and outcome.retriable):
                raise BusUnavailable(f"appending to {topic!r} failed: {outcome}") from outcome
            if isinstance(outcome, MessageSizeTooLargeError):
                raise RecordTooLarge(f"appending to {topic!r} refused: {outcome}") from outcome
            if isinstance(outcome, BaseException):
                raise outcome
        return [
            Position(topic, partition, offset) for partition, offset in zip(partitions, offsets, strict=True)
        ]

    async def subscribe(
        self, group: str, topics: Sequence[str], listener: RebalanceListener | None = None
    ) -> KafkaSubscription:
        if not topics:
            raise ValueError("a subscription names at least one topic")
        await self._ensure_topics(topics)
        member = KafkaSubscription(self._consumer(group), group, topics, listener)
        try:
            await member.start()
        except UNREACHABLE as exc:
            raise BusUnavailable(f"cannot join group {group!r}: {exc}") from exc
        self._members.add(member)
        return member

    async def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[Record]:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is not one of the {self.partitions} of {topic!r}")
        reader = self._started_reader()
        await self._ensure_topics((topic,))
        position = start
        while end is None or position < end:
            page, high_watermark = await reader.page(topic, partition, position)
            if end is None:
                end = high_watermark
            for record in page:
                if record.offset >= end:
                    return
                yield record
                position = record.offset + 1
            if not page:
                return

    async def end_offsets(self, topic: str) -> dict[int, int]:
        reader = self._started_reader()
        await self._ensure_topics((topic,))
        return await reader.ends(topic, self.partitions)

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        if self._admin is None:
            raise RuntimeError(f"the Kafka bus at {self.bootstrap} is not started")
        everywhere = [KafkaTopicPartition(topic, p) for p in range(self.partitions)]
        try:
            offsets = await self._admin.list_consumer_group_offsets(group, partitions=everywhere)
        except UNREACHABLE as exc:
            raise BusUnavailable(f"cannot read the offsets of group {group!r}: {exc}") from exc
        # the broker answers -1 for a partition the group never committed
        return {where.partition: int(at.offset) for where, at in offsets.items() if at.offset >= 0}

    def _started_reader(self) -> _OffsetReader:
        if self._reader is None:
            raise RuntimeError(f"the Kafka bus at {self.bootstrap} is not started")
        return self._reader


async def _append_in_order(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[OutgoingRecord],
    indices: list[int],
    offsets: list[int],
) -> None:
    """Append ``records[i]`` for each ``i`` of ``indices`` (in that order) to ``partition``, batch by
    batch, each sent once the one before it is acknowledged; the offsets go to ``offsets[i]``. A batch
    that fails raises, and nothing after it is sent."""
    at = 0
    while at < len(indices):
        batch = producer.create_batch()  # as big as the producer's max_batch_size
        first = at
        while at < len(indices):
            record = records[indices[at]]
            appended = batch.append(
                key=record.key.encode(), value=record.value, timestamp=None, headers=list(record.headers)
            )
            if appended is None:  # full (the first record always goes in)
                break
            at += 1
        acknowledged = await (await producer.send_batch(batch, topic, partition=partition))
        base: int = acknowledged.offset
        for n, index in enumerate(indices[first:at]):
            offsets[index] = base + n


async def _quietly(*closing: Any) -> None:
    """Await every close, ignoring their errors: cleaning up after a failed start."""
    for step in closing:
        with contextlib.suppress(Exception):
            await step
