"""An ingress relay killed after it appended its copies of a tenant's records to the commands topic,
before it committed its offsets on the tenant's topic: the next relay is handed the same records
again, and must not copy them a second time.

A second copy is no redelivery the owner can tell by its offset (it is a new record, further on the
commands topic); only the aggregates' window of the last 64 command ids that caused events stood in
its way, so a copy of a command more than 64 commands of its job back, or of one that decided
nothing, was decided again, in the state the tenant's later commands had left (a halt the tenant had
since resumed halted the job again).

And a relay the group expelled (frozen past its session while another relay took its partition over
and copied the same records) must not append the copies it had worked out once it thaws: it is
fenced as the owners are, and the one window the fence leaves (frozen between its fence and its
append) is pinned as docs/kafka.md states it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.bus import embedded, open_bus
from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.election import FileElection
from ffdl.core.aggregate import COMMAND_WINDOW
from ffdl.core.authorization import SCHEDULER, Principal
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import AnyEvent, command_headers, command_to_json
from ffdl.events.envelope import Command
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.handlers.ingress import INGRESS_HEADER, IngressRelay
from ffdl.handlers.messaging import PRINCIPAL_HEADER, CommandSender, Topics
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, OutgoingRecord, Record, TopicPartition
from ffdl.handlers.runtime import StaleMember, consume, decode_event
from tests.crashing_bus import CommandsUnreadable, Crash, CrashesBeforeCommit
from tests.services import wait_until_async

TENANT = "acme"
OWNERS, RELAYS = "owners", "ingress"


class RelayCrashesBeforeCommit(CrashesBeforeCommit):
    """The log, whose relay dies right after it appended copies to the commands topic, before it
    commits its offsets on the tenant's topic; ``landed``: which of a publish's copies land before
    the crash (a publish to several partitions of Kafka is no transaction), by default all."""

    crash = "killed between the copies' append and the commit"

    def __init__(self, bus: Bus, commands: str, landed: Any = None) -> None:
        super().__init__(bus)
        self._commands = commands
        self._landed = landed

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        if topic != self._commands:
            return await self._bus.publish(topic, records)
        self.appended = True
        if self._landed is None:
            return await self._bus.publish(topic, records)
        await self._bus.publish(topic, [record for record in records if self._landed(record)])
        raise Crash("killed while its copies were being appended")


class Story:
    """Jobs of tenant ``acme``, which writes to its own topic, on an embedded log; relays and owners
    that come and go."""

    def __init__(self, tmp_path: Path, partitions: int = 1, tenants: Sequence[str] = (TENANT,)) -> None:
        self.log = open_bus(f"embedded://{tmp_path / 'log'}", partitions)
        self.partitions = partitions
        self.topics = Topics()
        self.tenants = tuple(tenants)
        self.election = FileElection(tmp_path / "election")
        self.api = CommandSender(self.log, self.topics, "api", Principal.tenant(TENANT))
        self.scheduler = CommandSender(self.log, self.topics, "scheduler", SCHEDULER)

    async def __aenter__(self) -> Story:
        await self.log.start()
        self.token = await self.election.campaign(SCHEDULER_ROLE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.election.close()
        await self.log.close()

    async def queued(self, *jobs: str) -> None:
        """Submit ``jobs`` through the API and let the scheduler admit them; the owner decides."""
        for job in jobs:
            to = JOBS.address(job, TENANT)
            await self.api.send(self.api.make(to, cmd.SubmitJob(spec=JobSpec(name=job, command="true"))))
            await self.scheduler.send(self.scheduler.make(to, cmd.AdmitJob(), fencing_token=self.token))
        await self.owner_decides_everything()

    def command(self, job: str, data: cmd.CommandData) -> Command:
        return self.api.make(JOBS.address(job, TENANT), data)

    async def tenant_writes(self, *commands: Command, tenant: str = TENANT, extra: Any = ()) -> None:
        """The tenant's service writes ``commands`` to its own topic (with headers ``extra`` too)."""
        records = [
            OutgoingRecord(c.key, command_to_json(c), (*command_headers(c, "acme-service"), *extra))
            for c in commands
        ]
        await self.log.publish(self.topics.ingress(tenant), records)

    async def events(self) -> list[AnyEvent]:
        decoded = [
            decode_event(record)
            for partition in range(self.partitions)
            async for record in self.log.read(self.topics.events, partition)
        ]
        return [event for event in decoded if event is not None]

    async def commands(self) -> list[Record]:
        return [
            record
            for partition in range(self.partitions)
            async for record in self.log.read(self.topics.commands, partition)
        ]

    async def _run_until_committed(
        self, bus: Bus, group: str, topics: list[str], processor: Any, fenced: bool = False
    ) -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(consume(bus, group, topics, processor, stop, fenced=fenced))

        async def all_committed() -> bool:
            if running.done():
                running.result()
            for topic in topics:
                ends = await self.log.end_offsets(topic)
                committed = await self.log.committed(group, topic)
                if any(committed.get(p, 0) != end for p, end in ends.items()):
                    return False
            return True

        try:
            await wait_until_async(all_committed, 15, what=f"every record of {topics} committed by {group}")
        finally:
            stop.set()
            await running

    async def owner_decides_everything(self) -> JobOwner:
        owner = JobOwner(self.log, self.topics, self.election)
        await self._run_until_committed(self.log, OWNERS, [self.topics.commands], owner, fenced=True)
        return owner

    def relay(self, bus: Bus | None = None) -> IngressRelay:
        return IngressRelay(bus or self.log, self.topics, self.tenants)

    async def relay_copies_everything(
        self, relay: IngressRelay | None = None, bus: Bus | None = None
    ) -> IngressRelay:
        relay = relay or self.relay()
        await self._run_until_committed(bus or self.log, RELAYS, relay.topics, relay, fenced=True)
        return relay

    async def relay_crashes_before_commit(self, landed: Any = None) -> None:
        bus = RelayCrashesBeforeCommit(self.log, self.topics.commands, landed)
        relay = self.relay(bus)  # type: ignore[arg-type]
        stop = asyncio.Event()
        with pytest.raises(Crash):
            await asyncio.wait_for(consume(bus, RELAYS, relay.topics, relay, stop, fenced=True), 15)  # type: ignore[arg-type]
        assert bus.appended


def causes(events: Sequence[AnyEvent], data: type) -> list[Any]:
    return [e.causation_id for e in events if isinstance(e.data, data)]


def origins(records: Sequence[Record]) -> Counter[bytes]:
    """How often each record of a tenant's topic was copied to the commands topic."""
    return Counter(value for record in records for name, value in record.headers if name == INGRESS_HEADER)


def fold(events: Sequence[AnyEvent], job: str) -> JobState:
    state = None
    for event in events:
        if getattr(event, "job_id", None) == job:
            state = JOBS.evolve(state, event)
    assert state is not None
    return state.state


async def test_a_relay_killed_before_its_commit_copies_none_of_the_batch_again(tmp_path: Path) -> None:
    """The tenant halts and resumes its job, then sends more commands than the window holds (each
    refused: a rejection event, so each pushes an id out of the window). The relay dies between its
    copies' append and its commit. Copied again, the halt was decided again, on a job the tenant had
    resumed: halted a second time, and the resume and every refusal recorded twice."""
    async with Story(tmp_path) as story:
        await story.queued("job-1")
        halt = story.command("job-1", cmd.HaltJob(reason="for the weekend"))
        resume = story.command("job-1", cmd.ResumeJob())
        flood = [story.command("job-1", cmd.ResumeJob()) for _ in range(COMMAND_WINDOW + 16)]
        await story.tenant_writes(halt, resume, *flood)
        await story.relay_crashes_before_commit()
        await story.owner_decides_everything()
        decided = await story.events()
        assert causes(decided, ev.HaltRequested) == [halt.command_id]
        assert fold(decided, "job-1") is JobState.QUEUED

        cancel = story.command("job-1", cmd.CancelJob(reason="after the crash"))
        await story.tenant_writes(cancel)  # behind the batch the relay copied: copied once, decided
        relay = await story.relay_copies_everything()
        await story.owner_decides_everything()
        after = await story.events()
        copies = await story.commands()

    assert causes(after, ev.HaltRequested) == [halt.command_id], "the halt was copied and decided again"
    assert causes(after, ev.ResumeRequested) == [resume.command_id], "the resume was decided again"
    assert after[: len(decided)] == decided
    assert [e.type for e in after[len(decided) :]] == ["CancelRequested", "JobCancelled"]
    assert set(origins(copies).values()) == {1}, "a record of the tenant's topic was copied twice"
    assert len(origins(copies)) == 2 + len(flood) + 1
    assert relay.already_relayed == 2 + len(flood)


async def halted_twice_then_resumed(story: Story) -> Command:
    """The tenant halts a queued job, halts it again (which decides nothing), then resumes it: the
    first halt, whose copy is the one the owner may decide."""
    await story.queued("job-1")
    first = story.command("job-1", cmd.HaltJob(reason="for the weekend"))
    again = story.command("job-1", cmd.HaltJob(reason="for the weekend, pressed twice"))
    resume = story.command("job-1", cmd.ResumeJob())
    await story.tenant_writes(first, again, resume)
    return first


async def test_a_copy_whose_first_copy_decided_nothing_is_not_copied_again(tmp_path: Path) -> None:
    """A second halt of a halted job decides nothing, so no window remembers it; the tenant then
    resumes the job. Copied again after the relay died, the second halt found the job queued and
    halted it: the job the tenant resumed last stayed halted."""
    async with Story(tmp_path) as story:
        first = await halted_twice_then_resumed(story)
        await story.relay_crashes_before_commit()
        await story.owner_decides_everything()
        decided = await story.events()

        relay = await story.relay_copies_everything()
        await story.owner_decides_everything()
        after = await story.events()

    assert causes(after, ev.HaltRequested) == [first.command_id], "the second halt was decided on its copy"
    assert after == decided and fold(after, "job-1") is JobState.QUEUED
    assert relay.already_relayed == 3


async def test_copies_that_reached_one_commands_partition_and_not_another_are_made_where_they_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish to several partitions of Kafka is no transaction: a relay that dies in it may leave
    the copies bound for one commands partition appended and those for another not. The tenant's
    client partitions otherwise than Kafka's default (librdkafka's default partitioner is not
    murmur2), so one partition of its topic feeds both commands partitions. The next relay copies
    what did not land, and nothing that did: the furthest copy of a tenant partition is known per
    commands partition (taken for the whole tenant partition, it would skip the copies never made)."""
    async with Story(tmp_path, partitions=2) as story:
        jobs = {story.log.partition_for(f"job-{n}"): f"job-{n}" for n in range(20)}
        home, elsewhere = jobs[0], jobs[1]
        await story.queued(home, elsewhere)
        sent = [
            story.command(home, cmd.HaltJob(reason="h")),
            story.command(elsewhere, cmd.HaltJob(reason="e")),
            story.command(home, cmd.ResumeJob()),
            story.command(elsewhere, cmd.ResumeJob()),
        ]
        with monkeypatch.context() as patched:  # the tenant's client writes all of them to partition 0
            patched.setattr("ffdl.adapters.bus.embedded.partition_for", lambda key, partitions: 0)
            await story.tenant_writes(*sent)
        assert (await story.log.end_offsets(story.topics.ingress(TENANT))) == {0: 4, 1: 0}

        await story.relay_crashes_before_commit(landed=lambda copy: story.log.partition_for(copy.key) == 1)
        assert (
            set(origins(await story.commands()).values()) == {1} and len(origins(await story.commands())) == 2
        )
        relay = await story.relay_copies_everything()
        await story.owner_decides_everything()
        after = await story.events()
        copies = await story.commands()

    assert relay.already_relayed == 2
    assert sorted(origins(copies)) == [f"ffdl.tenant.{TENANT}.commands:0:{n}".encode() for n in range(4)]
    assert set(origins(copies).values()) == {1}
    for job in (home, elsewhere):
        mine = [e for e in after if getattr(e, "job_id", None) == job]
        assert [e.type for e in mine].count("HaltRequested") == 1
        assert fold(after, job) is JobState.QUEUED


async def test_a_tenant_cannot_make_the_relay_skip_records_by_the_headers_it_writes(tmp_path: Path) -> None:
    """Tenant ``acme`` writes records whose headers claim to be copies, of ``globex``'s records and of
    its own far ahead, sent for ``globex``. Their copies carry the relay's own headers instead, so a
    relay that takes both topics over with records waiting copies every one of them. A record on the
    commands topic that names a tenant partition but is sent for another principal (no copy the relay
    made) does not count either."""
    async with Story(tmp_path, tenants=(TENANT, "globex")) as story:
        await story.queued("job-1")
        forged = (
            (INGRESS_HEADER, b"ffdl.tenant.globex.commands:0:1000000"),
            (INGRESS_HEADER, b"ffdl.tenant.acme.commands:0:1000000"),
            (PRINCIPAL_HEADER, b"tenant:globex"),
        )
        await story.tenant_writes(story.command("job-1", cmd.ResumeJob()), extra=forged)
        await story.relay_copies_everything()
        smuggled = OutgoingRecord(
            "job-1",
            b"{}",
            ((PRINCIPAL_HEADER, b"tenant:acme"), (INGRESS_HEADER, b"ffdl.tenant.globex.commands:0:1000000")),
        )
        await story.log.publish(story.topics.commands, [smuggled])
        waiting = [story.command("job-1", cmd.ResumeJob()) for _ in range(3)]
        await story.tenant_writes(*waiting)
        await story.tenant_writes(*waiting, tenant="globex")

        relay = await story.relay_copies_everything()
        copies = await story.commands()

    assert relay.already_relayed == 0
    relayed = origins(copies)
    assert relayed[b"ffdl.tenant.globex.commands:0:1000000"] == 1  # the smuggled record, not a copy
    del relayed[b"ffdl.tenant.globex.commands:0:1000000"]
    expected = [b"ffdl.tenant.acme.commands:0:%d" % n for n in range(4)]
    expected += [b"ffdl.tenant.globex.commands:0:%d" % n for n in range(3)]
    assert sorted(relayed) == sorted(expected) and set(relayed.values()) == {1}
    first = next(record for record in copies if origins([record]))
    assert [name for name, _ in first.headers].count(INGRESS_HEADER) == 1


async def test_copies_of_another_topic_than_the_tenants_topic_now_are_not_taken_for_its_records(
    tmp_path: Path,
) -> None:
    """Copies name positions of the tenant's topic; one made anew (or a commands log imported from
    another platform) starts its offsets again, and the copies there name offsets whose records
    are others now. The relay believes a copy once the tenant's partition holds, where the copy says,
    the key and value it carries: here it does not, and every record is copied."""
    async with Story(tmp_path) as story:
        await story.queued("job-1")
        old = [story.command("job-1", cmd.ResumeJob()) for _ in range(3)]
        earlier = [
            OutgoingRecord(
                c.key,
                command_to_json(c),
                (
                    (PRINCIPAL_HEADER, b"tenant:acme"),
                    (INGRESS_HEADER, b"ffdl.tenant.acme.commands:0:%d" % (n + 5)),
                ),
            )
            for n, c in enumerate(old)
        ]
        await story.log.publish(story.topics.commands, earlier)
        now = [story.command("job-1", cmd.ResumeJob()) for _ in range(10)]
        await story.tenant_writes(*now)

        relay = await story.relay_copies_everything()
        copies = await story.commands()

    assert relay.already_relayed == 0
    relayed = [copy for copy in copies if copy.value in {command_to_json(c) for c in now}]
    assert len(relayed) == len(now)


class CountsReads:
    """The log, counting the reads of the commands topic."""

    def __init__(self, bus: Bus, commands: str) -> None:
        self._bus = bus
        self._commands = commands
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    def read(self, topic: str, partition: int, start: int = 0, end: int | None = None) -> Any:
        self.reads += topic == self._commands
        return self._bus.read(topic, partition, start, end)


class Begins(IngressRelay):
    """A relay that says when it was given partitions."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.begun = asyncio.Event()

    async def on_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        await super().on_assigned(partitions)
        self.begun.set()


async def test_records_written_after_the_relay_began_are_copied_without_reading_back(tmp_path: Path) -> None:
    """Only records that were on the tenant's topic when the relay took it over can have been copied
    by another relay: those written since are copied without reading the commands topic."""
    async with Story(tmp_path) as story:
        await story.queued("job-1")
        bus = CountsReads(story.log, story.topics.commands)
        relay = Begins(bus, story.topics, story.tenants)  # type: ignore[arg-type]
        stop = asyncio.Event()
        running = asyncio.create_task(consume(bus, RELAYS, relay.topics, relay, stop))  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(relay.begun.wait(), 15)  # given the tenant's partition, nothing waiting
            sent = [story.command("job-1", cmd.ResumeJob()) for _ in range(5)]
            await story.tenant_writes(*sent)

            async def copied() -> bool:
                return len(origins(await story.commands())) == len(sent)

            await wait_until_async(copied, 15, what="the records copied")
        finally:
            stop.set()
            await running
    assert bus.reads == 0 and relay.already_relayed == 0


#: The session of the relay that is frozen: the group expels it this long after its last heartbeat.
FROZEN_SESSION_S = 1.0


class Frozen:
    """One relay's process (its own connection to the log, a session of :data:`FROZEN_SESSION_S`),
    frozen once, as SIGSTOP or a long pause would, at the point ``at``: right after it read back the
    commands topic (its copies are worked out, none appended), or as it appends them. Its task waits
    there and its heartbeats stop reaching the log, so the group expels it once its session is out;
    :meth:`thaw` lets it go on from where it stopped. ``resumed`` is set at its first call to the
    group after the thaw (the fence's commit, or the commit after its append)."""

    def __init__(self, path: Path, partitions: int, commands: str, at: str) -> None:
        self._bus = EmbeddedBus(path, partitions, session_timeout_s=FROZEN_SESSION_S)
        self._commands = commands
        self._at = at
        self.members: set[str] = set()
        self.frozen = asyncio.Event()
        self.thawed = asyncio.Event()
        self.resumed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    def beats(self, member_id: str) -> bool:
        """Whether a heartbeat of ``member_id`` reaches the log (none of this process's while frozen)."""
        return member_id not in self.members or not self.frozen.is_set() or self.thawed.is_set()

    def thaw(self) -> None:
        self.thawed.set()

    async def _freeze(self) -> None:
        if not self.frozen.is_set():
            self.frozen.set()
            await self.thawed.wait()

    async def read(self, topic: str, partition: int, start: int = 0, end: int | None = None) -> Any:
        async for record in self._bus.read(topic, partition, start, end):
            yield record
        if topic == self._commands and self._at == "read back":
            await self._freeze()

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        if topic == self._commands and self._at == "append":
            await self._freeze()
        return await self._bus.publish(topic, records)

    async def subscribe(self, group: str, topics: Sequence[str], listener: Any = None) -> Any:
        subscription = await self._bus.subscribe(group, topics, listener)
        self.members.add(subscription.member_id)
        inner_commit = subscription.commit

        async def commit(offsets: Any) -> None:
            if self.thawed.is_set():
                self.resumed.set()
            await inner_commit(offsets)

        subscription.commit = commit  # type: ignore[method-assign]
        return subscription


@pytest.fixture
def freezing(monkeypatch: pytest.MonkeyPatch) -> list[Frozen]:
    """Processes a test freezes: the heartbeats of their members stop reaching the log while they are."""
    processes: list[Frozen] = []
    heartbeat = embedded._heartbeat

    def beat(connection: Any, member: Any, now_ms: int) -> bool:
        if all(process.beats(member.member_id) for process in processes):
            return heartbeat(connection, member, now_ms)
        return True  # a frozen process sends nothing (and so does not learn it was expelled)

    monkeypatch.setattr(embedded, "_heartbeat", beat)
    return processes


async def relay_frozen_while_another_copies(
    story: Story, frozen: Frozen, relay: IngressRelay
) -> BaseException | None:
    """``relay``, in the process ``frozen``, takes the tenant's partition with records waiting, and
    freezes; another relay joins the group, which expels the frozen one once its session is out, and
    copies every record; then the frozen relay thaws and goes on with what it had fetched. Returns
    what its run ended with."""
    stop = asyncio.Event()
    running = asyncio.create_task(consume(frozen, RELAYS, relay.topics, relay, stop, fenced=True))
    try:
        await asyncio.wait_for(frozen.frozen.wait(), 15)
        await story.relay_copies_everything()  # once the frozen relay's session is out
        assert len(origins(await story.commands())) == 3, "the other relay copied every record"
        frozen.thaw()
        await asyncio.wait_for(asyncio.wait([running, asyncio.ensure_future(frozen.resumed.wait())],
                                            return_when=asyncio.FIRST_COMPLETED), 15)  # fmt: skip
    finally:
        stop.set()
        outcome = (await asyncio.gather(running, return_exceptions=True))[0]
    return outcome if isinstance(outcome, BaseException) else None


async def test_a_relay_the_group_expelled_appends_none_of_the_copies_it_had_made(
    tmp_path: Path, freezing: list[Frozen]
) -> None:
    """A relay takes the tenant's partition over, reads back what was copied before, and is frozen
    (SIGSTOP, a long GC) before it appends its copies; its session runs out, the group gives the
    partition to another relay, which copies every record. Thawed, the relay appended its copies:
    a second copy of each, further on, which the owner decides unless its job's window of recent
    command ids holds the first: the second halt, which decided nothing, halted the job the tenant
    had resumed. Fenced, the relay is refused before it appends, and taken back into the group (its
    supervisor runs it again) it copies only what came since."""
    async with Story(tmp_path) as story:
        first = await halted_twice_then_resumed(story)
        frozen = Frozen(tmp_path / "log" / "log.sqlite", story.partitions, story.topics.commands, "read back")
        freezing.append(frozen)
        await frozen.start()
        relay = story.relay(frozen)
        outcome = await relay_frozen_while_another_copies(story, frozen, relay)
        copied = origins(await story.commands())
        await story.owner_decides_everything()
        decided = await story.events()
        cancel = story.command("job-1", cmd.CancelJob(reason="after the thaw"))
        await story.tenant_writes(cancel)
        await story.relay_copies_everything(relay, frozen)  # run again by its supervisor, back in the group
        copies = origins(await story.commands())
        await frozen.close()

    assert set(copied.values()) == {1}, "the expelled relay appended its copies after the other relay's"
    assert causes(decided, ev.HaltRequested) == [first.command_id], "the second halt was decided on its copy"
    assert fold(decided, "job-1") is JobState.QUEUED
    assert isinstance(outcome, StaleMember)
    assert len(copies) == 4 and set(copies.values()) == {1}


async def test_a_relay_frozen_between_its_fence_and_its_append_still_appends_its_copies(
    tmp_path: Path, freezing: list[Frozen]
) -> None:
    """The window the fence leaves (docs/kafka.md): a relay whose fence the group accepted, frozen
    before its append lands (on Kafka also an append in flight, retried up to the request timeout),
    appends its copies after the relay that took its partition over copied the same records. Its
    commit after the append is refused, so nothing further is copied twice; the owner decides each
    second copy unless its job's window of recent command ids holds the first (here it does: each
    first copy caused events, fewer than 64 ago). Closing it needs the append refused to an
    expelled member itself: then this test's copies are made once."""
    async with Story(tmp_path) as story:
        await story.queued("job-1")
        halt = story.command("job-1", cmd.HaltJob(reason="for the weekend"))
        resume = story.command("job-1", cmd.ResumeJob())
        cancel = story.command("job-1", cmd.CancelJob(reason="for good"))
        await story.tenant_writes(halt, resume, cancel)
        frozen = Frozen(tmp_path / "log" / "log.sqlite", story.partitions, story.topics.commands, "append")
        freezing.append(frozen)
        await frozen.start()
        relay = story.relay(frozen)
        outcome = await relay_frozen_while_another_copies(story, frozen, relay)
        await frozen.close()
        copies = await story.commands()
        await story.owner_decides_everything()
        decided = await story.events()

    assert outcome is None, "the fence was passed before the freeze"
    assert set(origins(copies).values()) == {2}, "each record copied by both relays"
    relayed = [copy for copy in copies if origins([copy])]
    assert [copy.value for copy in relayed[:3]] == [copy.value for copy in relayed[3:]]
    assert causes(decided, ev.HaltRequested) == [halt.command_id]
    assert causes(decided, ev.ResumeRequested) == [resume.command_id]
    assert fold(decided, "job-1") is JobState.CANCELLED


async def test_a_read_back_that_fails_stops_the_relay_and_dead_letters_or_copies_nothing(
    tmp_path: Path,
) -> None:
    """The relay has no poison guard: a read-back that fails propagates (its supervisor runs it
    again), its records are neither dead-lettered nor copied, and a relay after it copies none twice."""
    async with Story(tmp_path) as story:
        await story.queued("job-1")
        halt = story.command("job-1", cmd.HaltJob(reason="x"))
        await story.tenant_writes(halt)
        await story.relay_crashes_before_commit()
        copied = await story.commands()

        bus = CommandsUnreadable(story.log, story.topics.commands)
        relay = story.relay(bus)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="refused the read"):
            await asyncio.wait_for(
                consume(bus, RELAYS, relay.topics, relay, asyncio.Event(), fenced=True),  # type: ignore[arg-type]
                15,
            )
        assert await story.commands() == copied
        assert not [r async for r in story.log.read(story.topics.deadletter, 0)]

        relay = await story.relay_copies_everything()
        copies = await story.commands()

    assert relay.already_relayed == 1
    assert set(origins(copies).values()) == {1}
