"""The owner appends what a whole fetch decided, every partition's, in one publish, and the fetch's
offsets are committed only after it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.authorization import Principal
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.handlers import owner as owner_module
from ffdl.handlers.messaging import DEAD_LETTER_REASON_HEADER, CommandSender, Topics, event_records
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import Bus, CommitFailed, OutgoingRecord
from ffdl.handlers.runtime import StaleMember, consume, decode_event
from tests.flaky_log import BrokenRead
from tests.services import wait_until_async

PARTITIONS = 4


class CountingBus:
    """The embedded log, noting each publish: its topic, how many records, and the group's commits then."""

    def __init__(self, bus: Bus, topics: Topics) -> None:
        self._bus = bus
        self._topics = topics
        self.appends: list[tuple[str, int, dict[int, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        committed = await self._bus.committed("owners", self._topics.commands)
        self.appends.append((topic, len(records), committed))
        return await self._bus.publish(topic, records)


async def test_one_publish_for_every_partition_of_a_fetch(tmp_path: Path) -> None:
    log = open_bus(f"embedded://{tmp_path}", PARTITIONS)
    await log.start()
    topics = Topics()
    sender = CommandSender(log, topics, "test", Principal.tenant("default"))
    job_ids = [f"job-{n}" for n in range(8)]  # written before the owner joins: its first fetch has them all
    submit = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
    await sender.send(*(sender.make(JOBS.address(job_id, "default"), submit) for job_id in job_ids))
    bus = CountingBus(log, topics)
    owner = JobOwner(bus, topics, FileElection(tmp_path / "election"))  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop))  # type: ignore[arg-type]

    async def decided_and_committed() -> bool:
        return len(owner.book.jobs) == len(job_ids) and bool(await log.committed("owners", topics.commands))

    try:
        await wait_until_async(decided_and_committed, 15, what="the submissions decided and committed")
    finally:
        stop.set()
        await running
        await log.close()

    assert len({log.partition_for(j) for j in job_ids}) >= 2
    assert bus.appends == [(topics.events, len(job_ids), {})], "one append, before any commit"


async def test_a_command_whose_events_the_log_would_refuse_is_dead_lettered_and_the_fetch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the check, the one oversized event would fail the fetch's single append every time the
    fetch is handled again: the partition would stall. The limit is lowered so a bounded spec reaches it."""
    monkeypatch.setattr(owner_module, "MAX_RECORD_BYTES", 4_000)
    log = open_bus(f"embedded://{tmp_path}", PARTITIONS)
    await log.start()
    topics = Topics()
    sender = CommandSender(log, topics, "test", Principal.tenant("default"))
    small = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
    large = cmd.SubmitJob(spec=JobSpec(name="j", command="x" * 5_000))
    await sender.send(
        sender.make(JOBS.address("job-small-1", "default"), small),
        sender.make(JOBS.address("job-large", "default"), large),
        sender.make(JOBS.address("job-small-2", "default"), small),
    )
    owner = JobOwner(log, topics, FileElection(tmp_path / "election"))
    stop = asyncio.Event()
    running = asyncio.create_task(consume(log, "owners", [topics.commands], owner, stop))

    async def all_handled() -> bool:
        # the book and the dead letters are ahead of the fetch's one append: wait for its commit too
        decided = len(owner.book.jobs) == 2 and owner.dead_letters == 1
        return decided and bool(await log.committed("owners", topics.commands))

    try:
        await wait_until_async(all_handled, 15, what="the small submissions decided, the large one parked")
        decided = sorted(owner.book.jobs)  # the book is let go with the partitions when the owner stops
        parked = [r for p in range(PARTITIONS) async for r in log.read(topics.deadletter, p)]
        appended = [r.key for p in range(PARTITIONS) async for r in log.read(topics.events, p)]
    finally:
        stop.set()
        await running
        await log.close()

    assert decided == sorted(appended) == ["job-small-1", "job-small-2"]
    (record,) = parked
    assert record.key == "job-large"
    reason = dict(record.headers)[DEAD_LETTER_REASON_HEADER].decode()
    assert "SubmitJob decided an event of" in reason and "more than the 4000" in reason


def test_an_event_whose_framing_takes_it_over_the_limit_is_too_large_as_on_kafka(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's producer weighs a record with its framing: an event whose key, value and headers fit
    the limit but not with it was decided when the owner counted the bytes alone, and on Kafka the
    fetch's one append was refused, each time the fetch came again. The limit is lowered so a bounded
    spec reaches it."""
    limit = 4_000
    monkeypatch.setattr(owner_module, "MAX_RECORD_BYTES", limit)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    sender = CommandSender(None, Topics(), "test", Principal.tenant("default"))  # type: ignore[arg-type]

    def submit(job_id: str, length: int) -> Command:
        spec = JobSpec(name="j", command="x" * length)
        return sender.make(JOBS.address(job_id, "default"), cmd.SubmitJob(spec=spec))

    def weighed_by_kafka(command: Command) -> int:
        [record] = event_records(JOBS.decide(None, command, at, producer="owner", leader_token=None), "owner")
        return DefaultRecordBatchBuilder.estimate_size_in_bytes(
            record.key.encode(), record.value, [*record.headers]
        )

    length = 3_000 + limit - weighed_by_kafka(submit("job-0", 3_000))  # ids and times are of fixed width
    assert weighed_by_kafka(submit("job-0", length)) == limit
    owner = JobOwner(None, Topics(), FileElection(tmp_path / "election"), clock=lambda: at)  # type: ignore[arg-type]
    tenant = Principal.tenant("default")

    owner.decide(submit("job-1", length), 0, tenant, None)
    with pytest.raises(
        owner_module.DecisionTooLarge, match=f"SubmitJob decided an event of {limit + 1} bytes"
    ):
        owner.decide(submit("job-2", length + 1), 0, tenant, None)
    assert sorted(owner.book.jobs) == ["job-1"]


async def test_an_owner_whose_fold_broke_off_decides_only_on_the_whole_history(tmp_path: Path) -> None:
    """Had the owner decided on the part it folded, it would not know the second job: the cancel
    would be dead-lettered as for an unknown job (and the API would have answered it with nothing
    to wait for). It folds again, then decides."""
    log = open_bus(f"embedded://{tmp_path}", 1)
    await log.start()
    topics = Topics()
    sender = CommandSender(log, topics, "test", Principal.tenant("default"))

    async def decided_by(owner: JobOwner, bus: Any, job_id: str, expected_seq: int) -> Job:
        """The job as ``owner`` folded it once at ``expected_seq`` (it forgets it when it stops)."""
        stop = asyncio.Event()
        running = asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop))

        async def decided() -> bool:
            folded = owner.book.jobs.get(job_id)
            return folded is not None and folded.seq == expected_seq

        try:
            await wait_until_async(decided, 15, what=f"{job_id} at seq {expected_seq}")
            return owner.book.jobs[job_id]
        finally:
            stop.set()
            await running

    submit = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
    await sender.send(
        *(sender.make(JOBS.address(job_id, "default"), submit) for job_id in ("job-0", "job-1"))
    )
    first = JobOwner(log, topics, FileElection(tmp_path / "election"))
    await decided_by(first, log, "job-1", expected_seq=1)
    await sender.send(sender.make(JOBS.address("job-1", "default"), cmd.CancelJob(reason="for the test")))
    flaky = BrokenRead(log, topics.events)
    second = JobOwner(flaky, topics, FileElection(tmp_path / "election"))  # type: ignore[arg-type]
    decided = await decided_by(second, flaky, "job-1", expected_seq=3)  # cancel requested, cancelled
    dead = [record async for record in log.read(topics.deadletter, 0)]
    await log.close()

    assert flaky.breaks_left == 0, "the fold on assignment did break off"
    assert decided.state is JobState.CANCELLED
    assert dead == []


class ExpelledOnce:
    """The embedded log whose group refuses the first commit of its first member, as Kafka refuses a
    member it expelled while the member was cut off (it still holds what it fetched)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def subscribe(self, group: str, topics: Sequence[str], listener: Any = None) -> Any:
        subscription = await self._bus.subscribe(group, topics, listener)
        inner_commit = subscription.commit

        async def commit(offsets: Any) -> None:
            if not self.refused:
                self.refused += 1
                raise CommitFailed("the group's generation moved on: this member was expelled")
            await inner_commit(offsets)

        subscription.commit = commit
        return subscription


async def test_an_owner_the_group_expelled_appends_nothing_it_fetched_and_decides_it_again_once_back(
    tmp_path: Path,
) -> None:
    """A member whose session ran out while it was cut off still holds its fetch; had it appended
    its decisions, another owner's events would meet them with the same seq (a conflict ``ffdl
    verify`` reports, which the nemesis found). The fence refuses it before the flush; once back in
    the group it folds again and decides each command once."""
    log = open_bus(f"embedded://{tmp_path}", 1)
    await log.start()
    topics = Topics()
    sender = CommandSender(log, topics, "test", Principal.tenant("default"))
    submit = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
    await sender.send(sender.make(JOBS.address("job-0", "default"), submit))
    bus = ExpelledOnce(log)
    owner = JobOwner(bus, topics, FileElection(tmp_path / "election"))  # type: ignore[arg-type]
    stop = asyncio.Event()
    with pytest.raises(StaleMember):
        await asyncio.wait_for(consume(bus, "owners", [topics.commands], owner, stop, fenced=True), 15)  # type: ignore[arg-type]
    assert (await log.end_offsets(topics.events)).get(0, 0) == 0, "nothing the expelled member decided"

    running = asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop, fenced=True))  # type: ignore[arg-type]

    async def decided() -> bool:
        return bool(await log.committed("owners", topics.commands)) and "job-0" in owner.book.jobs

    try:
        await wait_until_async(decided, 15, what="the submission decided by the member back in the group")
    finally:
        stop.set()
        await running
    events = [record async for record in log.read(topics.events, 0)]
    await log.close()
    assert bus.refused == 1
    decoded = [decode_event(record) for record in events]
    assert [event.type for event in decoded if event is not None].count("JobSubmitted") == 1
    assert [event.seq for event in decoded if event is not None] == list(range(1, len(events) + 1))
