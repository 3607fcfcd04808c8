"""An owner that appended what a fetch decided but crashed before it committed the fetch's offsets:
the next owner is handed the same commands again, and must decide none of them a second time.

The redelivered stretch is a whole fetch (up to ``max_records``, 500), and all of it may be one job's:
a tenant flooding its job, a learner's progress and checkpoints. The aggregates' window of recent
command ids holds the last 64 that caused events, and none that decided nothing: a command further
back, or one that decided nothing at the time, was decided again, in the state the commands after
it had left, into events nobody asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.aggregate import COMMAND_WINDOW
from ffdl.core.authorization import SCHEDULER, Principal
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Command
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.handlers import owner as owner_module
from ffdl.handlers.messaging import CommandSender, Topics, event_records
from ffdl.handlers.owner import SCHEDULER_ROLE, JobOwner
from ffdl.handlers.ports import Bus, OutgoingRecord
from ffdl.handlers.runtime import consume, decode_event
from tests.crashing_bus import CommandsUnreadable, Crash, CrashesBeforeCommit
from tests.services import wait_until_async

GROUP = "owners"
JOB = "job-1"
TENANT = "default"


class OwnerCrashesBeforeCommit(CrashesBeforeCommit):
    """The embedded log, whose member dies right after the first append of events, before it commits
    the offsets of the commands that caused them (the fence's commit before the append goes through)."""

    def __init__(self, bus: Bus, events: str) -> None:
        super().__init__(bus)
        self._events = events

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        positions = await self._bus.publish(topic, records)
        self.appended = self.appended or topic == self._events
        return positions


class Story:
    """One job on a one-partition embedded log, and owners that come and go."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = open_bus(f"embedded://{tmp_path / 'log'}", 1)
        self.topics = Topics()
        self.to = JOBS.address(JOB, TENANT)
        self.election = FileElection(tmp_path / "election")
        self.senders()

    def senders(self) -> None:
        self.tenant = CommandSender(self.log, self.topics, "api", Principal.tenant(TENANT))
        self.scheduler = CommandSender(self.log, self.topics, "scheduler", SCHEDULER)

    async def __aenter__(self) -> Story:
        await self.log.start()
        token = await self.election.campaign(SCHEDULER_ROLE)
        submit = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
        await self.tenant.send(self.tenant.make(self.to, submit))
        await self.scheduler.send(self.scheduler.make(self.to, cmd.AdmitJob(), fencing_token=token))
        await self.owner_decides_everything()
        assert [e.type for e in await self.events()][-1] == "JobQueued"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.election.close()
        await self.log.close()

    def from_tenant(self, data: cmd.CommandData) -> Command:
        return self.tenant.make(self.to, data)

    async def events(self) -> list[AnyEvent]:
        decoded = [decode_event(record) async for record in self.log.read(self.topics.events, 0)]
        return [event for event in decoded if event is not None]

    async def owner_decides_everything(self) -> JobOwner:
        """An owner that joins, decides and commits every command there is, and stops."""
        owner = JobOwner(self.log, self.topics, self.election)
        stop = asyncio.Event()
        running = asyncio.create_task(
            consume(self.log, GROUP, [self.topics.commands], owner, stop, fenced=True)
        )

        async def all_committed() -> bool:
            end = (await self.log.end_offsets(self.topics.commands)).get(0, 0)
            return (await self.log.committed(GROUP, self.topics.commands)).get(0, 0) == end

        try:
            await wait_until_async(all_committed, 15, what="every command decided and committed")
        finally:
            stop.set()
            await running
        return owner

    async def owner_crashes_before_commit(self) -> None:
        """An owner that decides a fetch, appends its events and dies before it commits the fetch."""
        bus = OwnerCrashesBeforeCommit(self.log, self.topics.events)
        owner = JobOwner(bus, self.topics, self.election)  # type: ignore[arg-type]
        stop = asyncio.Event()
        with pytest.raises(Crash):
            await asyncio.wait_for(
                consume(bus, GROUP, [self.topics.commands], owner, stop, fenced=True),  # type: ignore[arg-type]
                15,
            )
        assert bus.appended


def causes(events: Sequence[AnyEvent], data: type) -> list[Any]:
    return [e.causation_id for e in events if isinstance(e.data, data)]


async def test_a_halt_redelivered_further_back_than_the_window_is_not_decided_again(tmp_path: Path) -> None:
    """A tenant halts and resumes its job, then floods it with commands it refuses (each a rejection
    event, so each pushes an id out of the window). The owner dies before its commit. Had the next
    owner decided the redelivered halt again, the job, queued again at the tenant's request, would
    have been halted a second time (its learners stopped, were it running), the resume decided again,
    and every rejection recorded twice: each command decided again pushes the next one out."""
    async with Story(tmp_path) as story:
        halt = story.from_tenant(cmd.HaltJob(reason="for the weekend"))
        resume = story.from_tenant(cmd.ResumeJob())
        flood = [story.from_tenant(cmd.ResumeJob()) for _ in range(COMMAND_WINDOW + 16)]
        await story.tenant.send(halt, resume, *flood)
        await story.owner_crashes_before_commit()
        decided = await story.events()
        assert causes(decided, ev.HaltRequested) == [halt.command_id]
        assert len(causes(decided, ev.CommandRejected)) == len(flood)
        cancel = story.from_tenant(cmd.CancelJob(reason="after the crash"))
        await story.tenant.send(cancel)  # past the redelivered stretch: decided

        owner = await story.owner_decides_everything()
        after = await story.events()

    assert causes(after, ev.HaltRequested) == [halt.command_id], "the halt was decided again"
    assert causes(after, ev.ResumeRequested) == [resume.command_id], "the resume was decided again"
    assert after[: len(decided)] == decided
    assert [e.type for e in after[len(decided) :]] == ["CancelRequested", "JobCancelled"]
    assert causes(after, ev.CancelRequested) == [cancel.command_id]
    assert owner.dead_letters == 0
    assert owner.redelivered == 2 + len(flood)


async def test_a_redelivered_halt_that_decided_nothing_is_not_decided_in_the_state_since(
    tmp_path: Path,
) -> None:
    """A second halt of a halted job decides nothing, so no window remembers it; the tenant then
    resumes the job. Decided again on redelivery, the second halt found the job queued and halted it:
    the job the tenant resumed last stayed halted."""
    async with Story(tmp_path) as story:
        first = story.from_tenant(cmd.HaltJob(reason="for the weekend"))
        again = story.from_tenant(cmd.HaltJob(reason="for the weekend, pressed twice"))
        resume = story.from_tenant(cmd.ResumeJob())
        await story.tenant.send(first, again, resume)
        await story.owner_crashes_before_commit()
        decided = await story.events()
        assert causes(decided, ev.HaltRequested) == [first.command_id]

        owner = await story.owner_decides_everything()
        after = await story.events()

    assert causes(after, ev.HaltRequested) == [first.command_id], "the second halt was decided on redelivery"
    assert after == decided
    assert fold(after) is JobState.QUEUED
    assert owner.redelivered == 3


def fold(events: Sequence[AnyEvent]) -> JobState:
    job = None
    for event in events:
        job = JOBS.evolve(job, event)
    assert job is not None
    return job.state


async def test_a_commands_topic_made_anew_has_none_of_its_commands_taken_for_redeliveries(
    tmp_path: Path,
) -> None:
    """The last event names the offset of the command that caused it; on a commands topic made anew
    (deleted and created again, its offsets from 0 again) the commands at and below that offset are
    new ones. The owner finds there another command than the one the event names, and decides them."""
    async with Story(tmp_path) as story:
        recorded = await story.events()
        story.topics = Topics(commands="ffdl.commands.anew")
        story.senders()
        halt, resume = story.from_tenant(cmd.HaltJob(reason="new topic")), story.from_tenant(cmd.ResumeJob())
        await story.tenant.send(halt, resume)  # offsets 0 and 1, as the submission's and the admission's
        owner = await story.owner_decides_everything()
        after = await story.events()

    assert owner.redelivered == 0
    assert causes(after, ev.HaltRequested) == [halt.command_id]
    assert causes(after, ev.ResumeRequested) == [resume.command_id]
    assert after[: len(recorded)] == recorded and fold(after) is JobState.QUEUED


async def test_an_older_owners_log_whose_events_name_no_command_offset_leaves_redeliveries_to_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events an owner older than the offset header appended say nothing of how far its decisions
    reached: the owner skips nothing by offset, and the aggregates' window recognises the recent
    commands redelivered, as before."""

    def older_owners_records(events: Sequence[Any], source: str, **_: object) -> list[OutgoingRecord]:
        return event_records(events, source)

    monkeypatch.setattr(owner_module, "event_records", older_owners_records)
    async with Story(tmp_path) as story:
        halt, resume = story.from_tenant(cmd.HaltJob(reason="x")), story.from_tenant(cmd.ResumeJob())
        await story.tenant.send(halt, resume)
        await story.owner_crashes_before_commit()
        decided = await story.events()
        owner = await story.owner_decides_everything()
        after = await story.events()

    assert owner.redelivered == 0
    assert after == decided and fold(after) is JobState.QUEUED


async def test_a_redelivery_the_owner_cannot_check_is_retried_not_dead_lettered(tmp_path: Path) -> None:
    """The check of a redelivered command reads the commands partition; a read that fails says
    nothing about the command. Taken for a poison command, each redelivered command was dead-lettered
    as an internal error (and its offset committed); the fetch is handled again instead."""
    async with Story(tmp_path) as story:
        halt, resume = story.from_tenant(cmd.HaltJob(reason="x")), story.from_tenant(cmd.ResumeJob())
        await story.tenant.send(halt, resume)
        await story.owner_crashes_before_commit()
        decided = await story.events()

        bus = CommandsUnreadable(story.log, story.topics.commands)
        owner = JobOwner(bus, story.topics, story.election)  # type: ignore[arg-type]
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(
                consume(bus, GROUP, [story.topics.commands], owner, asyncio.Event(), fenced=True),  # type: ignore[arg-type]
                15,
            )
        assert owner.dead_letters == 0
        assert not [r async for r in story.log.read(story.topics.deadletter, 0)]

        owner = await story.owner_decides_everything()
        after = await story.events()

    assert owner.redelivered == 2 and owner.dead_letters == 0
    assert after == decided
