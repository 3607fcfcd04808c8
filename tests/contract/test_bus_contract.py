"""The bus contract: every Bus adapter passes these, so handlers run the same on each (architecture §2, §5).

The tests at the top take ``bus_factory`` and run once per adapter in ``BUS_FACTORIES``. The section at
the bottom, "adapter-specific: embedded", pins what only the SQLite file promises (its partition
count, opening errors, several OS processes on one file).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.bus.partitioning import partition_for
from ffdl.handlers.ports import (
    MAX_RECORD_BYTES,
    BusUnavailable,
    CommitFailed,
    OutgoingRecord,
    Position,
    Record,
    RecordTooLarge,
    TopicPartition,
)
from tests.contract.bus_contract import (
    WAIT_S,
    BusFactory,
    Callback,
    Member,
    all_partitions,
    drive,
    fetch_round,
    join,
    unique,
)


def values(records: list[Record]) -> list[bytes]:
    return [r.value for r in records]


def first_index(timeline: list[Callback], name: str, kind: str, where: TopicPartition) -> int:
    """Where in ``timeline`` member ``name`` was first told ``kind`` about ``where``."""
    for index, (who, what, partitions) in enumerate(timeline):
        if (who, what) == (name, kind) and where in partitions:
            return index
    raise AssertionError(f"{name} was never {kind} {where}: {timeline}")


class CommittingListener:
    """Commits, on revocation, everything its member fetched from the partitions it loses."""

    def __init__(self) -> None:
        self.member: Member | None = None

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        pass

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        assert self.member is not None
        fetched = {where: offsets[-1] + 1 for where in partitions if (offsets := self.member.offsets(where))}
        await self.member.subscription.commit(fetched)


# --------------------------------------------------------------------------- the log


async def test_records_of_one_key_keep_publish_order_at_contiguous_offsets(bus_factory: BusFactory) -> None:
    topic = unique("events")
    keys = [f"job-{i}" for i in range(6)]
    async with bus_factory.open(partitions=4) as bus:
        assert bus.partitions == 4
        for batch in range(3):
            await bus.publish(
                topic, [OutgoingRecord(k, f"{k}/{batch}/{n}".encode()) for n in range(2) for k in keys]
            )
        ends = await bus.end_offsets(topic)
        by_key: dict[str, list[bytes]] = defaultdict(list)
        for partition in range(4):
            records = [r async for r in bus.read(topic, partition)]
            assert [r.offset for r in records] == list(range(ends[partition]))
            assert {(r.topic, r.partition) for r in records} <= {(topic, partition)}
            for record in records:
                by_key[record.key].append(record.value)
    for key in keys:
        assert by_key[key] == [f"{key}/{batch}/{n}".encode() for batch in range(3) for n in range(2)]


async def test_a_key_always_lands_on_kafkas_default_partition(bus_factory: BusFactory) -> None:
    topic = unique("events")
    keys = [f"job-{i}" for i in range(20)]
    async with bus_factory.open(partitions=4) as bus:
        for _ in range(3):
            positions = await bus.publish(topic, [OutgoingRecord(k, b"x") for k in keys])
            for key, position in zip(keys, positions, strict=True):
                assert position.partition == bus.partition_for(key) == partition_for(key, 4)
    assert len({partition_for(k, 4) for k in keys}) > 1


async def test_publish_returns_the_positions_read_finds_the_records_at(bus_factory: BusFactory) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        await bus.publish(topic, [OutgoingRecord("job-0", b"before")])
        sent = [OutgoingRecord(f"job-{i % 5}", f"value-{i}".encode()) for i in range(25)]
        positions = await bus.publish(topic, sent)
        stored = {(r.partition, r.offset): r for p in range(4) async for r in bus.read(topic, p)}
    assert len(positions) == len(sent)
    for record, position in zip(sent, positions, strict=True):
        assert position.topic == topic
        found = stored[(position.partition, position.offset)]
        assert (found.key, found.value) == (record.key, record.value)


async def test_headers_values_and_timestamps_round_trip(bus_factory: BusFactory) -> None:
    topic = unique("events")
    headers = (
        ("ce_id", b"7c9e6679-7425-40de-944b-e07fc1f90ae7"),
        ("ce_type", b"JobQueued"),
        ("binary", bytes(range(256))),
        ("repeated", b"1"),
        ("repeated", b"2"),
        ("empty", b""),
        ("n\u00e4me", "v\u00e4lue".encode()),
    )
    async with bus_factory.open(partitions=4) as bus:
        before_ms = time.time_ns() // 1_000_000
        positions = await bus.publish(
            topic, [OutgoingRecord("job-1", b"\x00\xffpayload", headers), OutgoingRecord("job-1", b"")]
        )
        after_ms = time.time_ns() // 1_000_000
        read = [r async for r in bus.read(topic, positions[0].partition)]
    assert [(r.key, r.value, r.headers) for r in read] == [
        ("job-1", b"\x00\xffpayload", headers),
        ("job-1", b"", ()),
    ]
    # The record's time is the producer's (or broker's) wall clock: allow for skew, not for garbage.
    assert all(before_ms - 60_000 <= r.timestamp_ms <= after_ms + 60_000 for r in read)


async def test_a_record_over_the_size_limit_is_refused_and_the_log_stays_usable(
    bus_factory: BusFactory,
) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        with pytest.raises(RecordTooLarge):
            await bus.publish(topic, [OutgoingRecord("job-1", b"x" * (MAX_RECORD_BYTES + 1))])
        # Kafka's producer weighs a record with its framing: key and value of the limit's bytes are over it
        with pytest.raises(RecordTooLarge):
            await bus.publish(topic, [OutgoingRecord("job-1", b"x" * (MAX_RECORD_BYTES - len("job-1")))])
        (position,) = await bus.publish(topic, [OutgoingRecord("job-1", b"small")])
        read = [r async for r in bus.read(topic, position.partition)]
    assert [(r.key, r.value) for r in read] == [("job-1", b"small")]


async def test_end_offsets_are_the_next_offset_of_every_partition(bus_factory: BusFactory) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        assert await bus.end_offsets(topic) == {0: 0, 1: 0, 2: 0, 3: 0}
        positions = await bus.publish(topic, [OutgoingRecord(f"job-{i % 7}", b"x") for i in range(30)])
        counts = {p: sum(1 for pos in positions if pos.partition == p) for p in range(4)}
        assert await bus.end_offsets(topic) == counts


async def test_read_pages_through_a_range_of_offsets(bus_factory: BusFactory) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        for batch in range(12):
            await bus.publish(
                topic, [OutgoingRecord("job-1", f"{batch * 100 + i}".encode()) for i in range(100)]
            )
        partition = bus.partition_for("job-1")
        middle = [r async for r in bus.read(topic, partition, start=100, end=1100)]
        tail = [r async for r in bus.read(topic, partition, start=1150)]
        everything = [r async for r in bus.read(topic, partition)]
    assert [r.offset for r in middle] == list(range(100, 1100))
    assert values(middle) == [f"{i}".encode() for i in range(100, 1100)]
    assert [r.offset for r in tail] == list(range(1150, 1200))
    assert len(everything) == 1200


# --------------------------------------------------------------------------- consumer groups


async def test_fetch_with_nothing_new_waits_out_its_timeout(bus_factory: BusFactory) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        member = await join(bus, unique("group"), [topic])
        await drive([member], lambda: member.assignment() == all_partitions([topic], 4), "assigned")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await member.subscription.fetch(500, 0.3) == []
        assert loop.time() - started >= 0.25


@pytest.mark.parametrize("publisher", ["same instance", "another instance"])
async def test_fetch_wakes_up_for_a_record_appended_while_it_waits(
    bus_factory: BusFactory, publisher: str
) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus, bus_factory.open(partitions=4) as other:
        member = await join(bus, unique("group"), [topic])
        await drive([member], lambda: member.assignment() == all_partitions([topic], 4), "assigned")
        waiting = asyncio.create_task(member.subscription.fetch(500, WAIT_S))
        await asyncio.sleep(0.2)  # let the fetch start waiting; the outcome does not depend on it
        assert not waiting.done()
        await (bus if publisher == "same instance" else other).publish(
            topic, [OutgoingRecord("job-1", b"new")]
        )
        records = await waiting
    assert values(records) == [b"new"]


async def test_every_group_sees_every_record(bus_factory: BusFactory) -> None:
    topic = unique("events")
    async with bus_factory.open(partitions=4) as bus:
        positions = await bus.publish(topic, [OutgoingRecord(f"job-{i % 9}", b"x") for i in range(40)])
        projections = await join(bus, unique("projections"), [topic])
        notifier = await join(bus, unique("notifier"), [topic])
        await drive(
            [projections, notifier],
            lambda: len(projections.received) >= 40 and len(notifier.received) >= 40,
            "both groups fetched every record",
        )
    expected = sorted((p.partition, p.offset) for p in positions)
    for member in (projections, notifier):
        assert sorted((r.partition, r.offset) for r in member.received) == expected


async def test_members_of_a_group_split_co_partitioned_topics_without_overlap(
    bus_factory: BusFactory,
) -> None:
    commands, events = unique("commands"), unique("events")
    topics = [commands, events]
    async with bus_factory.open(partitions=4) as bus:
        group = unique("owners")
        a = await join(bus, group, topics)
        b = await join(bus, group, topics)
        await drive(
            [a, b],
            lambda: len(a.assignment()) == len(b.assignment()) == 4 and not a.assignment() & b.assignment(),
            "each member owns half of the partitions",
        )
        assert a.assignment() | b.assignment() == all_partitions(topics, 4)
        for member in (a, b):
            numbers = {tp.partition for tp in member.assignment() if tp.topic == commands}
            assert {tp.partition for tp in member.assignment() if tp.topic == events} == numbers

        positions = await bus.publish(commands, [OutgoingRecord(f"job-{i}", b"c") for i in range(20)])
        positions += await bus.publish(events, [OutgoingRecord(f"job-{i}", b"e") for i in range(20)])
        await drive([a, b], lambda: len(a.received) + len(b.received) >= 40, "every record fetched")
        for member in (a, b):
            assert all(r.where in member.assignment() for r in member.received)
    fetched = sorted((r.topic, r.partition, r.offset) for r in a.received + b.received)
    assert fetched == sorted((p.topic, p.partition, p.offset) for p in positions)


async def test_a_new_member_resumes_from_the_committed_offset(bus_factory: BusFactory) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as bus:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        first = await join(bus, group, [topic])
        await drive([first], lambda: len(first.received) == 10, "the first member fetched everything")
        await first.subscription.commit({where: 6})
        await first.subscription.close()
        second = await join(bus, group, [topic])
        await drive([second], lambda: len(second.received) >= 4, "the second member fetched the rest")
    assert second.offsets(where) == [6, 7, 8, 9]


async def test_the_committed_offsets_of_a_group_are_readable_by_any_instance(bus_factory: BusFactory) -> None:
    topic, group, other = unique("commands"), unique("owners"), unique("projector")
    async with bus_factory.open(partitions=4) as bus, bus_factory.open(partitions=4) as outsider:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        assert await outsider.committed(group, topic) == {}
        member = await join(bus, group, [topic])
        await drive([member], lambda: len(member.received) == 10, "the member fetched everything")
        await member.subscription.commit({where: 6})
        assert await outsider.committed(group, topic) == {where.partition: 6}
        await member.subscription.commit({where: 10})
        assert await outsider.committed(group, topic) == {where.partition: 10}
        assert await outsider.committed(other, topic) == {}
        assert await outsider.committed(group, unique("unsubscribed")) == {}


async def test_records_fetched_but_not_committed_are_redelivered_after_the_member_closes(
    bus_factory: BusFactory,
) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as bus:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        first = await join(bus, group, [topic])
        await drive([first], lambda: len(first.received) == 10, "the first member fetched everything")
        await first.subscription.close()
        second = await join(bus, group, [topic])
        await drive(
            [second], lambda: len(second.received) >= 10, "the second member fetched everything again"
        )
    assert second.offsets(where) == list(range(10))


async def test_records_a_crashed_member_did_not_commit_are_redelivered_after_its_session_times_out(
    bus_factory: BusFactory,
) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as survivor_bus:
        positions = await survivor_bus.publish(
            topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)]
        )
        where = TopicPartition(topic, positions[0].partition)
        async with bus_factory.open(partitions=4, session_timeout_s=1.0) as doomed_bus:
            doomed = await join(doomed_bus, group, [topic])
            await drive([doomed], lambda: len(doomed.received) == 10, "the doomed member fetched everything")
            await doomed.subscription.commit({where: 4})
            await bus_factory.crash(doomed_bus)
        survivor = await join(survivor_bus, group, [topic])
        await drive([survivor], lambda: len(survivor.received) >= 6, "the survivor took over the partitions")
        assert survivor.assignment() == all_partitions([topic], 4)
    assert survivor.offsets(where) == [4, 5, 6, 7, 8, 9]


async def test_the_old_owner_is_revoked_before_the_new_owner_is_assigned(bus_factory: BusFactory) -> None:
    topic, group = unique("commands"), unique("owners")
    everything = all_partitions([topic], 4)
    timeline: list[Callback] = []
    async with bus_factory.open(partitions=4) as bus:
        a = await join(bus, group, [topic], "a", timeline)
        await drive([a], lambda: a.assignment() == everything, "the first member owns every partition")
        b = await join(bus, group, [topic], "b", timeline)
        # The newcomer fetches first in every round: it must still wait for the old owner's revocation.
        await drive([b, a], lambda: len(a.assignment()) == len(b.assignment()) == 2, "the members share")
        moved = b.assignment()
        assert not a.assignment() & moved
        for where in moved:
            assert first_index(timeline, "a", "revoked", where) < first_index(
                timeline, "b", "assigned", where
            )
        for member in (a, b):
            assert member.listener is not None
            assert member.listener.owned == member.assignment()

        b_left_at = len(timeline)
        await b.subscription.close()
        await drive([a], lambda: a.assignment() == everything, "the first member owns every partition again")
        assert a.listener is not None
        assert a.listener.owned == everything
        for where in moved:
            first_index(timeline[b_left_at:], "a", "assigned", where)


async def test_a_member_may_commit_in_on_revoked_so_the_next_owner_redelivers_nothing(
    bus_factory: BusFactory,
) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as bus:
        await bus.publish(topic, [OutgoingRecord(f"job-{i}", b"x") for i in range(40)])
        committing = CommittingListener()
        a = committing.member = Member(await bus.subscribe(group, [topic], committing))
        await drive([a], lambda: len(a.received) == 40, "the first member fetched everything")
        b = await join(bus, group, [topic])
        await drive([b, a], lambda: len(a.assignment()) == len(b.assignment()) == 2, "the members share")
        await fetch_round([b, a], timeout_s=0.5)
        assert b.received == []


async def test_committing_a_partition_the_member_does_not_own_fails(bus_factory: BusFactory) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as bus:
        a = await join(bus, group, [topic])
        b = await join(bus, group, [topic])
        await drive([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 2, "the members share")
        theirs = min(b.assignment())
        with pytest.raises(CommitFailed):
            await a.subscription.commit({theirs: 1})
        with pytest.raises(CommitFailed):
            await a.subscription.commit({TopicPartition(unique("unsubscribed"), 0): 1})
        await a.subscription.commit({min(a.assignment()): 0})


async def test_records_and_committed_offsets_survive_reopening_the_log(bus_factory: BusFactory) -> None:
    topic, group = unique("commands"), unique("owners")
    async with bus_factory.open(partitions=4) as bus:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        first = await join(bus, group, [topic])
        await drive([first], lambda: len(first.received) == 10, "the member fetched everything")
        await first.subscription.commit({where: 7})
        ends = await bus.end_offsets(topic)
        before = [r async for r in bus.read(topic, where.partition)]
    async with bus_factory.open(partitions=4) as reopened:
        assert await reopened.end_offsets(topic) == ends
        assert [r async for r in reopened.read(topic, where.partition)] == before
        second = await join(reopened, group, [topic])
        await drive(
            [second], lambda: len(second.received) >= 3, "the member after the restart fetched the rest"
        )
    assert second.offsets(where) == [7, 8, 9]


# --------------------------------------------------------------------------- adapter-specific: embedded
# Not part of the contract: what only the SQLite file promises. These do not take ``bus_factory``.

_CHILD_PUBLISHER = """
import asyncio, sys
from pathlib import Path
from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.handlers.ports import OutgoingRecord

async def main() -> None:
    bus = EmbeddedBus(Path(sys.argv[1]), 4)
    await bus.start()
    print("started", flush=True)
    topic, partition = sys.argv[2], bus.partition_for("job-1")

    async def parents() -> int:
        return len([r async for r in bus.read(topic, partition) if r.value.startswith(b"parent-")])

    before = 0
    for batch in range(100):
        records = [OutgoingRecord("job-1", f"child-{batch}-{i}".encode()) for i in range(10)]
        await bus.publish(topic, records)
        # Halfway, wait for an append of the parent's to land after our first: on a busy machine one
        # process could otherwise append all it has before the other's first write lands.
        if batch == 0:
            before = await parents()
        while batch == 49 and await parents() == before:
            await asyncio.sleep(0.01)
    await bus.close()

asyncio.run(main())
"""

_CHILD_MEMBER = """
import asyncio, sys
from pathlib import Path
from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.handlers.ports import CommitFailed, TopicPartition

class PrintingListener:
    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        print("assigned", sorted(p.partition for p in partitions), flush=True)

    async def on_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        print("revoked", sorted(p.partition for p in partitions), flush=True)

async def main() -> None:
    path, topic, group = sys.argv[1:4]
    bus = EmbeddedBus(Path(path), 4, session_timeout_s=1.0)
    await bus.start()
    member = await bus.subscribe(group, [topic], PrintingListener())
    where = TopicPartition(topic, bus.partition_for("job-1"))
    fetched = 0
    while fetched < 10:
        fetched += len(await member.fetch(500, 0.5))
    await member.commit({where: 4})
    print("fetched", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        await member.commit({where: 10})
    except CommitFailed:
        print("commit refused", flush=True)
    else:
        print("commit accepted", flush=True)
    await member.fetch(500, 0.5)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def _start_child(code: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _wait_for_line(child: asyncio.subprocess.Process, wanted: str) -> None:
    """Read the child's output (its log lines included) until ``wanted`` comes."""
    assert child.stdout is not None
    try:
        async with asyncio.timeout(WAIT_S):
            while (line := await child.stdout.readline()) and line.decode().strip() != wanted:
                pass
    except TimeoutError:
        raise AssertionError(f"the child did not say {wanted!r} within {WAIT_S} s") from None
    assert line, f"the child exited without saying {wanted!r}"


@pytest.fixture
async def child_processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Children the test starts; any still running at the end is killed."""
    children: list[asyncio.subprocess.Process] = []
    yield children
    for child in children:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_embedded_log_keeps_the_partition_count_it_was_created_with(tmp_path: Path) -> None:
    bus = EmbeddedBus(tmp_path / "log.sqlite", 4)
    await bus.start()
    await bus.close()
    with pytest.raises(ValueError, match="has 4 partitions"):
        await EmbeddedBus(tmp_path / "log.sqlite", 8).start()


@pytest.mark.parametrize("problem", ["missing directory", "not a database"])
async def test_embedded_bus_is_unavailable_until_its_file_can_be_opened(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "missing" / "log.sqlite"
    if problem == "not a database":
        path = tmp_path / "log.sqlite"
        path.write_bytes(b"this is not an SQLite database, not even close" * 100)
    bus = EmbeddedBus(path, 4)
    with pytest.raises(BusUnavailable, match="cannot open the event log"):
        await bus.start()
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    await bus.start()  # a caller retries start() until the file can be opened
    try:
        assert await bus.publish("events", [OutgoingRecord("job-1", b"x")]) == [
            Position("events", bus.partition_for("job-1"), 0)
        ]
    finally:
        await bus.close()


async def test_embedded_processes_appending_to_one_file_get_gapless_offsets(
    tmp_path: Path, child_processes: list[asyncio.subprocess.Process]
) -> None:
    path, topic = tmp_path / "log.sqlite", "events"
    bus = EmbeddedBus(path, 4)
    await bus.start()
    try:
        child = await _start_child(_CHILD_PUBLISHER, str(path), topic)
        child_processes.append(child)
        await _wait_for_line(child, "started")
        batches = 0
        async with asyncio.timeout(WAIT_S):
            while child.returncode is None:
                await bus.publish(
                    topic, [OutgoingRecord("job-1", f"parent-{batches}-{i}".encode()) for i in range(10)]
                )
                batches += 1
        assert await child.wait() == 0
        records = [r async for r in bus.read(topic, bus.partition_for("job-1"))]
    finally:
        await bus.close()
    assert [r.offset for r in records] == list(range(1000 + 10 * batches))
    child_values = [r.value for r in records if r.value.startswith(b"child-")]
    parent_values = [r.value for r in records if r.value.startswith(b"parent-")]
    assert child_values == [f"child-{b}-{i}".encode() for b in range(100) for i in range(10)]
    assert parent_values == [f"parent-{b}-{i}".encode() for b in range(batches) for i in range(10)]
    writers = [r.value.split(b"-")[0] for r in records]
    switches = sum(1 for before, after in itertools.pairwise(writers) if before != after)
    assert switches > 1, "the two processes never appended in turn: the test did not exercise concurrency"


async def test_embedded_member_process_killed_loses_its_partitions_and_uncommitted_records(
    tmp_path: Path, child_processes: list[asyncio.subprocess.Process]
) -> None:
    path, topic, group = tmp_path / "log.sqlite", "commands", "owners"
    bus = EmbeddedBus(path, 4)
    await bus.start()
    try:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        child = await _start_child(_CHILD_MEMBER, str(path), topic, group)
        child_processes.append(child)
        await _wait_for_line(child, "fetched")
        child.kill()
        await child.wait()
        survivor = Member(await bus.subscribe(group, [topic]))
        await drive([survivor], lambda: len(survivor.received) >= 6, "the survivor took over the partitions")
        assert survivor.assignment() == all_partitions([topic], 4)
    finally:
        await bus.close()
    assert survivor.offsets(where) == [4, 5, 6, 7, 8, 9]


async def test_embedded_member_paused_past_its_session_cannot_commit_and_learns_it_lost_everything(
    tmp_path: Path, child_processes: list[asyncio.subprocess.Process]
) -> None:
    path, topic, group = tmp_path / "log.sqlite", "commands", "owners"
    bus = EmbeddedBus(path, 4)
    await bus.start()
    try:
        positions = await bus.publish(topic, [OutgoingRecord("job-1", f"{i}".encode()) for i in range(10)])
        where = TopicPartition(topic, positions[0].partition)
        child = await _start_child(_CHILD_MEMBER, str(path), topic, group)
        child_processes.append(child)
        await _wait_for_line(child, "fetched")
        os.kill(child.pid, signal.SIGSTOP)
        try:
            survivor = Member(await bus.subscribe(group, [topic]))
            await drive([survivor], lambda: len(survivor.received) >= 6, "the survivor took over")
            await survivor.subscription.commit({where: 10})
            await survivor.subscription.close()
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write(b"commit\n")
        await child.stdin.drain()
        await _wait_for_line(child, "commit refused")
        # Its partitions are free again, yet it must not carry on as if it had never lost them.
        await _wait_for_line(child, "revoked [0, 1, 2, 3]")
        await _wait_for_line(child, "assigned [0, 1, 2, 3]")
    finally:
        await bus.close()
    assert survivor.offsets(where) == [4, 5, 6, 7, 8, 9]
