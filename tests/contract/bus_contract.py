"""What the bus contract suite needs from an adapter, and the helpers its tests share.

An adapter takes part by providing a :class:`BusFactory` and one entry in ``BUS_FACTORIES``
(``tests/contract/conftest.py``). A factory stands for one log, fresh for each test: every ``open``
is another instance on that same log, as another process would open it, so the suite can play
several members, a crash, and a restart. Tests use unique topic and group names, so a factory
may share one broker between tests.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.handlers.ports import Bus, Record, Subscription, TopicPartition

#: How long a test waits for the bus to get somewhere before it fails.
WAIT_S = 15.0


class BusFactory(Protocol):
    """Opens instances of one adapter's bus on one log."""

    def open(
        self, partitions: int = 4, *, session_timeout_s: float = 10.0
    ) -> AbstractAsyncContextManager[Bus]:
        """A started bus on this test's log, closed on exit; each call is another instance."""

    async def crash(self, bus: Bus) -> None:
        """End ``bus`` as a killed process would: no revoke, no commit, no leave. Its group members
        keep their partitions until their session times out. Leaving its ``open`` context afterwards
        must do nothing more."""


class EmbeddedBusFactory:
    """Embedded buses on one SQLite file."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "log.sqlite"

    @asynccontextmanager
    async def open(self, partitions: int = 4, *, session_timeout_s: float = 10.0) -> AsyncIterator[Bus]:
        bus = EmbeddedBus(self.path, partitions, session_timeout_s=session_timeout_s)
        await bus.start()
        try:
            yield bus
        finally:
            await bus.close()

    async def crash(self, bus: Bus) -> None:
        assert isinstance(bus, EmbeddedBus)
        await bus.abandon()


def unique(name: str) -> str:
    """``name`` made unique to this test, for topics and groups."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


#: One rebalance callback as it happened: (member name, "assigned" or "revoked", partitions).
Callback = tuple[str, str, frozenset[TopicPartition]]


@dataclass
class RecordingListener:
    """A rebalance listener that writes each callback to a timeline shared by the test's members."""

    name: str
    timeline: list[Callback] = field(default_factory=list)
    #: What the callbacks say this member owns now.
    owned: set[TopicPartition] = field(default_factory=set)

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        self.timeline.append((self.name, "assigned", partitions))
        self.owned |= partitions

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.timeline.append((self.name, "revoked", partitions))
        self.owned -= partitions


@dataclass
class Member:
    """A subscription under test and everything it has fetched so far."""

    subscription: Subscription
    listener: RecordingListener | None = None
    received: list[Record] = field(default_factory=list)

    def assignment(self) -> frozenset[TopicPartition]:
        return self.subscription.assignment()

    def offsets(self, where: TopicPartition) -> list[int]:
        return [r.offset for r in self.received if r.where == where]


async def join(
    bus: Bus, group: str, topics: Sequence[str], name: str = "", timeline: list[Callback] | None = None
) -> Member:
    """A new member of ``group``; with a ``name``, its rebalance callbacks go to ``timeline``."""
    listener = RecordingListener(name, timeline if timeline is not None else []) if name else None
    return Member(await bus.subscribe(group, topics, listener), listener)


async def fetch_round(members: Sequence[Member], timeout_s: float = 0.1) -> None:
    """One fetch on every member at once; what each gets is added to its ``received``.

    Members fetch concurrently because a rebalance may need all of them to take part.
    """
    batches = await asyncio.gather(*(m.subscription.fetch(500, timeout_s) for m in members))
    for member, batch in zip(members, batches, strict=True):
        member.received.extend(batch)


async def drive(
    members: Sequence[Member], until: Callable[[], bool], what: str, timeout_s: float = WAIT_S
) -> None:
    """Fetch rounds until ``until()`` holds. Between rounds no fetch is in flight, so a test may commit
    or close a member then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not until():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s driving members until {what}")
        await fetch_round(members)


def all_partitions(topics: Sequence[str], partitions: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for topic in topics for p in range(partitions))
