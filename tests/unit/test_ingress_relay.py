"""The ingress relay copies a tenant's records for that tenant, and one it cannot copy is parked,
never the relay's end: every direct tenant's commands go through it."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from ffdl.core.authorization import Principal
from ffdl.handlers.ingress import IngressRelay, relayed
from ffdl.handlers.messaging import DEAD_LETTER_REASON_HEADER, PARKED_KEY_CHARS, PRINCIPAL_HEADER, Topics
from ffdl.handlers.ports import MAX_RECORD_BYTES, Bus, Record


async def test_a_record_whose_copy_is_over_the_limit_is_dead_lettered_and_the_batch_relayed(bus: Bus) -> None:
    topics = Topics()
    relay = IngressRelay(bus, topics, ["acme"])
    ingress = topics.ingress("acme")
    forged = (PRINCIPAL_HEADER, b"admin:root")
    huge = Record(ingress, 0, 0, "job-a", b"x" * (MAX_RECORD_BYTES - 10), (forged,))
    small = Record(ingress, 0, 1, "job-b", b'{"type": "CancelJob"}', (forged,))

    await relay.process([huge, small])
    await relay.flush()

    relayed = [record async for record in bus.read(topics.commands, 0)]
    assert [(r.key, r.value) for r in relayed] == [("job-b", small.value)]
    assert dict(relayed[0].headers)[PRINCIPAL_HEADER] == b"tenant:acme"
    parked = [record async for record in bus.read(topics.deadletter, 0)]
    assert [record.key for record in parked] == ["job-a"]
    reason = dict(parked[0].headers)[DEAD_LETTER_REASON_HEADER].decode()
    assert "over the limit" in reason


async def test_a_record_whose_key_is_near_the_limit_is_parked_as_its_heads_and_the_batch_relayed(
    bus: Bus,
) -> None:
    """Its dead letter, whole key and all, was refused too: the relay raised, uncommitted, and met the
    record again after every restart, while every direct tenant's commands waited behind it."""
    topics = Topics()
    relay = IngressRelay(bus, topics, ["acme"])
    ingress = topics.ingress("acme")
    key = "k" * (MAX_RECORD_BYTES - 50)  # the tenant's topic took it; its copy's headers tip it over
    huge = Record(ingress, 0, 0, key, b"x" * 10)
    small = Record(ingress, 0, 1, "job-b", b'{"type": "CancelJob"}')

    await relay.process([huge, small])
    await relay.flush()

    relayed = [record async for record in bus.read(topics.commands, 0)]
    assert [r.key for r in relayed] == ["job-b"]
    [parked] = [record async for record in bus.read(topics.deadletter, 0)]
    assert (parked.key, parked.value) == (key[:PARKED_KEY_CHARS], huge.value)
    headers = dict(parked.headers)
    assert headers["ffdl_dlq_key_truncated_from"] == str(len(key)).encode()
    assert "over the limit" in headers[DEAD_LETTER_REASON_HEADER].decode()


async def test_a_record_whose_copy_kafkas_producer_would_refuse_is_dead_lettered_not_relayed(
    bus: Bus,
) -> None:
    """The copy's key, value and headers fit the limit, their framing does not: the relay counted the
    bytes alone, and on Kafka the batch's publish was refused, each time the batch came again."""
    topics = Topics()
    relay = IngressRelay(bus, topics, ["acme"])
    ingress = topics.ingress("acme")

    def weighed_by_kafka(key_length: int) -> int:
        copy = relayed(Record(ingress, 0, 0, "k" * key_length, b"{}"), Principal.tenant("acme"))
        return DefaultRecordBatchBuilder.estimate_size_in_bytes(
            copy.key.encode(), copy.value, [*copy.headers]
        )

    near = MAX_RECORD_BYTES - 200
    record = Record(ingress, 0, 0, "k" * (near + MAX_RECORD_BYTES + 1 - weighed_by_kafka(near)), b"{}")
    assert weighed_by_kafka(len(record.key)) == MAX_RECORD_BYTES + 1

    await relay.process([record])
    await relay.flush()

    assert [r async for r in bus.read(topics.commands, 0)] == []
    [parked] = [r async for r in bus.read(topics.deadletter, 0)]
    assert "over the limit" in dict(parked.headers)[DEAD_LETTER_REASON_HEADER].decode()
