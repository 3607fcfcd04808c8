"""What only the Kafka adapter promises, beyond the bus contract it shares with the embedded log.

Against a real Kafka-protocol broker (tansu, started for the module): keys land on the partition
Kafka's own default partitioner picks (and the embedded log picks), a record another producer wrote
without a key or with a header without a value reads as empty, ``start`` creates the topics it is
given with the bus's partition count and refuses a topic with another, a bus started before any
broker answers is unavailable until one does, and a broker frozen mid-stream delays appends and
fetches without losing or reordering a record.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import NotLeaderForPartitionError

from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.handlers.ports import BusUnavailable, OutgoingRecord, TopicPartition
from ffdl.wiring.config import KafkaConfig
from tests.services import TansuBroker, free_port

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: Short sessions: tansu holds a group join for about half the session timeout.
FAST = KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2, request_timeout_s=20.0)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def bus(broker: TansuBroker) -> AsyncIterator[KafkaBus]:
    started = KafkaBus(broker.bootstrap, PARTITIONS, settings=FAST)
    await started.start()
    yield started
    await started.close()


async def topic_partitions(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(topics)}
    finally:
        await admin.close()


async def test_a_key_lands_on_the_partition_kafkas_default_partitioner_and_the_embedded_log_pick(
    bus: KafkaBus, broker: TansuBroker, tmp_path: Path
) -> None:
    topic = unique("events")
    keys = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(40)]
    positions = await bus.publish(topic, [OutgoingRecord(key, b"x") for key in keys])
    # A plain producer with aiokafka's default partitioner, no partition chosen for it.
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        by_kafka = [(await producer.send_and_wait(topic, b"y", key=key.encode())).partition for key in keys]
    finally:
        await producer.stop()
    embedded = EmbeddedBus(tmp_path / "log.sqlite", PARTITIONS)
    await embedded.start()
    try:
        by_embedded = [
            p.partition for p in await embedded.publish(topic, [OutgoingRecord(k, b"z") for k in keys])
        ]
    finally:
        await embedded.close()
    assert [p.partition for p in positions] == by_kafka == by_embedded
    assert len(set(by_kafka)) == PARTITIONS


async def test_a_record_from_another_producer_without_a_key_or_header_values_reads_as_empty(
    bus: KafkaBus, broker: TansuBroker
) -> None:
    topic = unique("commands")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            topic, b"{}", partition=1, headers=[("ce_id", None), ("ce_type", b"x")]
        )
    finally:
        await producer.stop()
    (record,) = [r async for r in bus.read(topic, 1)]
    assert (record.offset, record.key, record.value) == (sent.offset, "", b"{}")
    assert record.headers == (("ce_id", b""), ("ce_type", b"x"))


async def test_start_creates_the_named_topics_with_the_bus_partition_count(broker: TansuBroker) -> None:
    topics = [unique("commands"), unique("events"), unique("deadletter")]
    bus = KafkaBus(broker.bootstrap, 3, settings=FAST, topics=topics)
    await bus.start()
    try:
        assert await topic_partitions(broker.bootstrap, topics) == dict.fromkeys(topics, 3)
        assert await bus.end_offsets(topics[1]) == {0: 0, 1: 0, 2: 0}
    finally:
        await bus.close()
    again = KafkaBus(broker.bootstrap, 3, settings=FAST, topics=topics)
    await again.start()  # the topics exist already: nothing to create, nothing to refuse
    await again.close()


async def test_a_topic_with_another_partition_count_is_refused(broker: TansuBroker) -> None:
    topic = unique("events")
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    bus = KafkaBus(broker.bootstrap, PARTITIONS, settings=FAST, topics=[topic])
    with pytest.raises(ValueError, match="has 2 partitions, not 4"):
        await bus.start()


async def test_a_bus_is_unavailable_until_a_broker_answers_then_starts() -> None:
    late = TansuBroker(port=free_port())
    bus = KafkaBus(late.bootstrap, PARTITIONS, settings=FAST, topics=[unique("events")])
    with pytest.raises(BusUnavailable, match=f"cannot reach the Kafka brokers at {late.bootstrap}"):
        await bus.start()
    late.start()
    try:
        await bus.start()  # the platform retries start() with backoff until it succeeds
        try:
            positions = await bus.publish(unique("events"), [OutgoingRecord("job-1", b"x")])
            assert positions[0].offset == 0
        finally:
            await bus.close()
    finally:
        late.stop()


async def test_a_frozen_broker_delays_appends_and_fetches_but_loses_and_reorders_nothing(
    broker: TansuBroker, bus: KafkaBus
) -> None:
    topic, group = unique("commands"), unique("owners")
    member = await bus.subscribe(group, [topic])
    received: list[bytes] = []

    async def consume_until(count: int) -> None:
        while len(received) < count:
            batch = await member.fetch(500, 0.2)
            received.extend(record.value for record in batch)
            if batch:
                last = batch[-1]
                await member.commit({TopicPartition(last.topic, last.partition): last.offset + 1})

    await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(20)])
    await asyncio.wait_for(consume_until(20), 30)
    broker.pause()
    try:
        appending = asyncio.create_task(
            bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(20, 40)])
        )
        consuming = asyncio.create_task(consume_until(40))
        await asyncio.sleep(3.0)  # the outage the test is about
        assert not appending.done(), "an append was acknowledged by a frozen broker"
    finally:
        broker.resume()
    positions = await asyncio.wait_for(appending, 30)
    await asyncio.wait_for(consuming, 30)
    assert [p.offset for p in positions] == list(range(20, 40))
    assert received == [f"{i}".encode() for i in range(40)]


async def test_a_publish_whose_first_batch_of_a_partition_fails_leaves_no_later_record_of_it_there(
    broker: TansuBroker,
) -> None:
    """The owner and the ingress relay take the last record of a partition for how far a publish
    reached there, so what a failed publish leaves on a partition must be a prefix of its records.

    The producer here refuses every produce request that carries the publish's first record (a
    leader election that outlasts that batch's retries, as aiokafka sees it) and sends the others.
    aiokafka alone fails that batch once its retries run past the request timeout and then sends the
    batch queued behind it, which lands; the bus sends a partition's next batch only once the one
    before it is acknowledged, so nothing after the failed batch is sent."""
    bus = KafkaBus(broker.bootstrap, PARTITIONS, settings=FAST.model_copy(update={"request_timeout_s": 1.5}))
    await bus.start()
    try:
        topic = unique("events")
        await bus.publish(topic, [OutgoingRecord("job-1", b"warm-up")])
        # Six records of one job, three to a batch at most: two batches, whichever limit applies.
        filler = b"x" * 300_000
        records = [OutgoingRecord("job-1", b"record-%d " % i + filler) for i in range(6)]
        first = b"record-0 "
        producer = bus._producer
        assert producer is not None
        client, real_send = producer.client, producer.client.send
        refused = 0

        async def send(node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal refused
            if type(request).__name__.startswith("ProduceRequest") and any(
                first in bytes(data) for _, partitions in request._topics for _, data in partitions
            ):
                refused += 1
                raise NotLeaderForPartitionError()
            return await real_send(node_id, request, *args, **kwargs)

        client.send = send  # kept to the end: record 0 never lands
        with pytest.raises(BusUnavailable):
            await bus.publish(topic, records)
        assert refused >= 1
        await asyncio.sleep(3.0)  # time for a batch sent after the failure to land
        partition = bus.partition_for("job-1")
        held = [record.value[:9] async for record in bus.read(topic, partition)]
        assert held == [b"warm-up"], f"a failed publish left later records on the partition: {held}"
    finally:
        await bus.close()
