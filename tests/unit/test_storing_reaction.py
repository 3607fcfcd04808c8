"""The storing reaction stops what is left of the learners, then asks for the completion and the
release in one append, with ids that a re-run of the action sends again; the owner decides the pair
into ``JobCompleted`` and ``GpusReleased``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.core.authorization import Principal
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.core.reconcile import ActionKind, next_action
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import any_command_from_json
from ffdl.events.envelope import Command, Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.handlers import storing as storing_module
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.driver import REACTIONS
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.ports import LaunchRequest, LearnerHandle
from tests.job_history import folded_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PLACEMENT = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))


def storing() -> Job:
    datas: list[EventData] = [
        ev.JobSubmitted(spec=JobSpec(name="j", command="true", gpus=1)),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=PLACEMENT),
        ev.JobLaunching(attempt=1),
        ev.LearnerStarted(rank=0, attempt=1),
        ev.JobRunning(attempt=1),
        ev.LearnerExited(rank=0, attempt=1, exit_code=0),
        ev.JobStoring(attempt=1),
    ]
    return folded_job(datas, NOW)[0]


class StopRecorder:
    """A launcher that notes the stops it was asked for."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def launch(self, request: LaunchRequest) -> None:
        raise AssertionError("a stored job launches nothing")

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.stopped.append(job_id)

    async def running(self) -> list[LearnerHandle]:
        return []

    async def close(self) -> None:
        return None


async def test_storing_asks_for_the_completion_and_the_release_in_one_append(tmp_path: Path) -> None:
    bus = open_bus(f"embedded://{tmp_path}", 1)
    await bus.start()
    topics = Topics()
    launcher = StopRecorder()
    ctx = ReactionContext(
        sender=CommandSender(bus, topics, "reactor@test", Principal.platform("reactor")), launcher=launcher
    )
    job = storing()
    action = next_action(job, NOW)
    assert action is not None and action.kind is ActionKind.STORE
    try:
        await REACTIONS[action.kind](job, action, ctx)
        await REACTIONS[action.kind](job, action, ctx)  # run again (a crash, a redelivery)
        records = [record async for record in bus.read(topics.commands, 0)]
    finally:
        await bus.close()

    assert launcher.stopped == ["job-1", "job-1"]
    commands = [any_command_from_json(record.value) for record in records]
    assert [type(c.data) for c in commands] == [cmd.FinishStoring, cmd.ReleaseGpus] * 2
    first, again = commands[:2], commands[2:]
    assert [c.command_id for c in first] == [c.command_id for c in again], "the same commands again"
    assert first[0].command_id != first[1].command_id

    owner_events: list[Event] = []
    decided = job
    for command in first:
        assert isinstance(command, Command)
        events = decide(decided, command, NOW, producer="owner")
        for event in events:
            decided = evolve(decided, event)
        owner_events.extend(events)
    assert [type(e.data) for e in owner_events] == [ev.JobCompleted, ev.GpusReleased]
    assert decided.placement is None
    assert next_action(decided, NOW) is None, "nothing left to release"


@pytest.fixture
def nested_results(tmp_path: Path) -> Iterator[Path]:
    """A hostile learner's result directory: 1500 directories deep, a link out of it, and a file of
    5 bytes at the bottom; removed level by level (``shutil.rmtree`` recurses: pytest could not)."""
    results = tmp_path / "jobs" / "job-1" / "results"
    results.mkdir(parents=True)
    try:
        (results / "out").symlink_to("/usr")
        directory = os.open(results, os.O_RDONLY)
        for _ in range(1500):  # one level at a time, as a learner would (makedirs recurses too)
            os.mkdir("a", dir_fd=directory)
            directory, parent = os.open("a", os.O_RDONLY, dir_fd=directory), directory
            os.close(parent)
        weights = os.open("weights", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=directory)
        os.write(weights, b"12345")
        os.close(weights)
        os.close(directory)
        yield results
    finally:
        while (results / "a" / "a").is_dir():  # pull a/a up to a until one level is left
            os.rename(results / "a" / "a", results / "b")
            os.rmdir(results / "a")
            os.rename(results / "b", results / "a")
        shutil.rmtree(results)


async def test_results_nested_deeper_than_the_interpreter_recurses_are_measured(
    tmp_path: Path, nested_results: Path
) -> None:
    # os.walk recursed, and raised RecursionError in the reaction
    bus = open_bus(f"embedded://{tmp_path / 'bus'}", 1)
    await bus.start()
    topics = Topics()
    ctx = ReactionContext(
        sender=CommandSender(bus, topics, "reactor@test", Principal.platform("reactor")),
        launcher=StopRecorder(),
        job_dir=lambda job_id: nested_results.parent if job_id == "job-1" else None,
    )
    job = storing()
    action = next_action(job, NOW)
    assert action is not None
    try:
        await REACTIONS[action.kind](job, action, ctx)
        records = [record async for record in bus.read(topics.commands, 0)]
    finally:
        await bus.close()

    finish = any_command_from_json(records[0].value).data
    assert isinstance(finish, cmd.FinishStoring)
    assert (finish.result.files, finish.result.size_bytes) == (1, 5)


def test_measuring_results_reads_no_more_of_a_huge_directory_than_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of many more entries than the bound: the walk read it whole into a list before
    it counted, so a learner's millions of files cost the platform's memory."""
    for index in range(50):
        (tmp_path / f"f{index}").write_bytes(b"x")
    monkeypatch.setattr(storing_module, "MAX_FILES", 10)
    read = 0
    scandir = os.scandir

    class Counted:
        def __init__(self, path: str) -> None:
            self._listing = scandir(path)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *_: object) -> None:
            self._listing.close()

        def __iter__(self) -> Counted:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal read
            entry = next(self._listing)
            read += 1
            return entry

    monkeypatch.setattr(storing_module.os, "scandir", Counted)
    assert storing_module._measure(tmp_path) == (10, 10)
    assert read == 11
