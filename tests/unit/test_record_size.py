"""A record weighs what Kafka's producer weighs it (aiokafka's estimate, against its
``max_request_size`` of :data:`MAX_RECORD_BYTES`): so a record the relay or the owner finds within
the limit is one Kafka takes. Counting the bytes of key, value and headers alone let through records
up to 90 bytes (and two lengths a header) over the producer's limit, which then failed their batch,
every time it was handled."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given
from hypothesis import strategies as st

from ffdl.handlers.ports import OutgoingRecord, record_size

#: Lengths at the steps of the varints Kafka writes lengths as (1 to 4 bytes), and any up to 2 MB.
LENGTHS = st.sampled_from([0, 1, 63, 64, 8_191, 8_192, 1_048_575, 1_048_576]) | st.integers(0, 2_000_000)


@given(
    key_length=LENGTHS,
    key_char=st.sampled_from(["k", "é", "作", "\U0001f600"]),
    value_length=LENGTHS,
    headers=st.lists(st.tuples(st.text(max_size=70), st.integers(0, 9_000)), max_size=70),
)
def test_a_record_weighs_what_kafkas_producer_estimates(
    key_length: int, key_char: str, value_length: int, headers: list[tuple[str, int]]
) -> None:
    record = OutgoingRecord(
        key_char * key_length,
        b"v" * value_length,
        tuple((name, b"h" * length) for name, length in headers),
    )
    estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        record.key.encode(), record.value, list(record.headers)
    )

    assert record_size(record) == estimate
