"""The ports: what handlers need from the world, as Protocols. Adapters implement them.

Every port has an embedded adapter (in-process or a local file) and a real one, and one contract
suite in ``tests/contract`` that all of them pass.

* :class:`Bus` is the log with Kafka's semantics: topics split into partitions by key, offsets,
  consumer groups that share partitions and commit positions, at-least-once delivery.
* :class:`HeartbeatStore` is etcd's model: leases with a TTL, keys bound to leases, prefix watches.
* :class:`Launcher` starts and stops the learners of a job attempt, idempotently.
* :class:`InventorySource` says which nodes exist and which of them the source itself cordons
  (the configuration, the Kubernetes nodes); the scheduler records what it says as node events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from ffdl.core.nodes import InventoryObservation
from ffdl.events.model import Checkpoint, JobSpec, Placement
from ffdl.events.position import Position  # where the Bus says an appended record landed

# --------------------------------------------------------------------------- bus


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read from the log."""

    topic: str
    partition: int
    offset: int
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0

    @property
    def where(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


class BusUnavailable(ConnectionError):
    """The log cannot be reached now; callers retry with backoff."""


class RecordTooLarge(ValueError):
    """A record the log refuses for its size: sending it again can never succeed."""


#: The largest record a bus appends, weighed by :func:`record_size`: Kafka's default
#: ``max.request.size``, which the Kafka bus's producer is given, so that what the embedded log
#: takes a Kafka cluster takes too.
MAX_RECORD_BYTES = 1_048_576
#: What Kafka frames any record with, besides the lengths of its parts: the header of the batch it
#: travels in (61 bytes) and the most its own fixed fields take (21: its length, attributes,
#: timestamp and offset deltas), as the producer estimates a record before it sends it.
RECORD_FRAMING_BYTES = 61 + 21


def record_size(record: OutgoingRecord) -> int:
    """What a record weighs against :data:`MAX_RECORD_BYTES`: as Kafka's producer weighs it (aiokafka's
    ``estimate_size_in_bytes``), its key, value and headers, each with its length, and its framing.

    Counting the bytes of the parts alone let records through that the producer then refused: up to
    90 bytes of framing more, and two lengths for each header, however empty; refused in a batch,
    such a record failed the whole publish, again each time it was handled."""
    headers = sum(_sized(len(name.encode())) + _sized(len(value)) for name, value in record.headers)
    parts = _sized(len(record.key.encode())) + _sized(len(record.value)) + _varint_size(len(record.headers))
    return RECORD_FRAMING_BYTES + parts + headers


def _sized(length: int) -> int:
    """What a part of ``length`` bytes takes in a record: its length, then its bytes."""
    return _varint_size(length) + length


def _varint_size(n: int) -> int:
    """The bytes of ``n`` (>= 0) as a record writes a length: a zigzag varint, 7 bits a byte."""
    return max(1, ((n << 1).bit_length() + 6) // 7)


class CommitFailed(RuntimeError):
    """A commit for partitions this member no longer owns (a rebalance took them)."""


class RebalanceListener(Protocol):
    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None: ...


class Subscription(Protocol):
    """A member of a consumer group: it fetches from the partitions assigned to it."""

    async def fetch(self, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]: ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record, per partition, the offset of the next record the group should read."""

    def assignment(self) -> frozenset[TopicPartition]: ...

    async def close(self) -> None: ...


class Bus(Protocol):
    partitions: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def partition_for(self, key: str) -> int: ...

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        """Append records (each to its key's partition); returns once the log has them durably."""

    async def subscribe(
        self, group: str, topics: Sequence[str], listener: RebalanceListener | None = None
    ) -> Subscription: ...

    def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[Record]:
        """Records of one partition from ``start`` up to ``end`` (exclusive; ``None``: the current end)."""

    async def end_offsets(self, topic: str) -> dict[int, int]: ...

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        """The offsets ``group`` committed on ``topic``: per partition, the next record it will read
        (partitions it never committed are absent). A reader outside the group learns from it how far
        the group's effects went: a role commits a record only after its effects are durable."""


# --------------------------------------------------------------------------- heartbeats


class StoreUnavailable(ConnectionError):
    """The heartbeat store cannot be reached: not the same as a learner being gone."""


class WatchKind(StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: WatchKind
    key: str
    value: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every key under a prefix at one revision; a watch from ``revision + 1`` continues it."""

    values: Mapping[str, bytes]
    revision: int


class HeartbeatStore(Protocol):
    async def grant(self, ttl_s: float) -> int:
        """A new lease that lives ``ttl_s`` seconds unless kept alive; returns its id."""

    async def keepalive(self, lease: int) -> bool:
        """Renew the lease; False when it has expired or was revoked already."""

    async def revoke(self, lease: int) -> None: ...

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def snapshot(self, prefix: str) -> Snapshot: ...

    def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Changes under ``prefix`` from ``start_revision`` on, deletions by lease expiry included.

        Raises :class:`StoreUnavailable` when the store goes away; the caller resyncs with a snapshot.
        """

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- launcher


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything a launcher needs to start every learner of one attempt of a job."""

    job_id: str
    tenant: str
    attempt: int
    spec: JobSpec
    placement: Placement
    resume_from: Checkpoint | None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LearnerHandle:
    """A learner the launcher knows to be alive (or not yet reaped)."""

    job_id: str
    attempt: int
    rank: int


class Launcher(Protocol):
    async def launch(self, request: LaunchRequest) -> None:
        """Start every learner of the attempt; launching the same attempt twice starts nothing new."""

    async def stop(self, job_id: str, grace_s: float) -> None:
        """Stop every learner of the job (any attempt): SIGTERM, then SIGKILL after ``grace_s``."""

    async def running(self) -> list[LearnerHandle]:
        """The learners this launcher has alive, for reconciling against the jobs that should have them."""

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- inventory


class InventorySource(Protocol):
    """Where the nodes come from. The scheduler leader asks it each cycle and sends the node
    commands that bring the log in line with it (:func:`ffdl.core.nodes.inventory_changes`)."""

    def observe(self) -> InventoryObservation | None:
        """What the source sees now; None until it has seen the whole inventory once."""


# --------------------------------------------------------------------------- leader election


class Election(Protocol):
    """Leader election for singleton roles, with a fencing token that grows with every new leader."""

    async def campaign(self, role: str) -> int:
        """Wait until this process leads ``role``; returns its fencing token."""

    async def current_token(self, role: str) -> int | None:
        """The token of the current leader of ``role`` (None: nobody has led it yet)."""

    async def is_leader(self, role: str, token: int) -> bool:
        """Whether ``token`` still leads ``role`` (False once the lease behind it was lost)."""

    async def resign(self, role: str) -> None: ...

    async def close(self) -> None: ...
