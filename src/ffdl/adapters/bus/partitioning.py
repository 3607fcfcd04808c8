"""Kafka's default partitioner for keyed records, bit-exact, so a key lands on the same partition number
on every bus: the embedded log here and a Kafka cluster (Java clients and aiokafka alike).

Kafka hashes the key's bytes with ``Utils.murmur2`` and takes ``toPositive(hash) % partitions``, where
``toPositive`` clears the sign bit (``hash & 0x7fffffff``). Java computes on signed 32-bit ints; here
the hash is kept as an unsigned 32-bit value, so Java's ``>>>`` is Python's ``>>`` and the bits agree.
"""

from __future__ import annotations

from functools import lru_cache

_SEED = 0x9747B28C
_MULTIPLIER = 0x5BD1E995
_SHIFT = 24
_UINT32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2`` of ``data``, as an unsigned 32-bit int."""
    length = len(data)
    whole = length - length % 4
    hashed = (_SEED ^ length) & _UINT32
    for start in range(0, whole, 4):
        word = int.from_bytes(data[start : start + 4], "little")
        word = (word * _MULTIPLIER) & _UINT32
        word ^= word >> _SHIFT
        word = (word * _MULTIPLIER) & _UINT32
        hashed = ((hashed * _MULTIPLIER) & _UINT32) ^ word
    tail = data[whole:]
    if len(tail) == 3:
        hashed ^= tail[2] << 16
    if len(tail) >= 2:
        hashed ^= tail[1] << 8
    if tail:
        hashed ^= tail[0]
        hashed = (hashed * _MULTIPLIER) & _UINT32
    hashed ^= hashed >> 13
    hashed = (hashed * _MULTIPLIER) & _UINT32
    hashed ^= hashed >> 15
    return hashed


@lru_cache(maxsize=65_536)
def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` (UTF-8) among ``partitions``.

    Cached: a job's key comes back with each of its events.
    """
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
