"""A relaunch names what the ranks stopped for it saved on their way out, whatever the monitor does.

The monitor reports a stopped rank's last checkpoint, but as another producer than the reactor's
``BeginLaunch``, so the two have no fixed order on the job's partition. The relaunch reads the
stopped ranks' exit records (each names its agent's last checkpoint) and sends those checkpoints
before the ``BeginLaunch``, in one append; here no monitor runs at all.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore
from ffdl.core.authorization import Principal
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.core.places import CheckpointPlaces
from ffdl.core.reconcile import ActionKind, next_action
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import Command, EventData
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.heartbeat_keys import encode_exit, exit_key
from ffdl.handlers.launching import relaunch
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.ports import HeartbeatStore, LaunchRequest, LearnerHandle, Snapshot, StoreUnavailable
from tests.job_history import folded_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PLACES = CheckpointPlaces("/learners/{job_id}/checkpoints")
PLACE = "file:///learners/job-1/checkpoints"
OLDER = Checkpoint(rank=0, attempt=1, step=20, uri=f"{PLACE}/ckpt_step_20.pt")


class Stops:
    """A launcher whose learners are already gone: it notes the stops it was asked for."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def launch(self, request: LaunchRequest) -> None:
        raise AssertionError("a relaunch launches nothing itself: the owner decides the attempt")

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.stopped.append(job_id)

    async def running(self) -> list[LearnerHandle]:
        return []

    async def close(self) -> None:
        return None


class Unreachable(EmbeddedHeartbeatStore):
    async def snapshot(self, prefix: str) -> Snapshot:
        raise StoreUnavailable("etcd does not answer")


def restarting_job() -> Job:
    """Two learners; rank 1 failed in attempt 1, and the job restarts from step 20 at once."""
    spec = JobSpec(name="gang", command="train", learners=2, gpus=1)
    placement = Placement(
        learners=tuple(LearnerPlacement(rank=rank, node="node-a", gpus=(rank,)) for rank in range(2))
    )
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
        ev.LearnerStarted(rank=0, attempt=1),
        ev.LearnerStarted(rank=1, attempt=1),
        ev.JobRunning(attempt=1),
        ev.CheckpointRecorded(checkpoint=OLDER),
        ev.LearnerExited(rank=1, attempt=1, exit_code=1),
        ev.JobRestarting(attempt=2, reason="learner 1 exited with code 1", backoff_s=0.0, resume_from=OLDER),
    ]
    return folded_job(datas, NOW)[0]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncGenerator[HeartbeatStore, None]:
    heartbeats = EmbeddedHeartbeatStore(tmp_path / "heartbeats.db")
    yield heartbeats
    await heartbeats.close()


async def relaunched(tmp_path: Path, heartbeats: HeartbeatStore | None, *, times: int = 1) -> list[Command]:
    """Run the job's relaunch ``times`` and return the commands it sent, in log order."""
    job = restarting_job()
    action = next_action(job, NOW)
    assert action is not None and action.kind is ActionKind.RELAUNCH
    bus = open_bus(f"embedded://{tmp_path / 'bus'}", 1)
    await bus.start()
    launcher = Stops()
    ctx = ReactionContext(
        sender=CommandSender(bus, Topics(), "reactor@test", Principal.platform("reactor")),
        launcher=launcher,
        checkpoints=PLACES,
        heartbeats=heartbeats,
    )
    try:
        for _ in range(times):
            await relaunch(job, action, ctx)
        sent = [command_from_json(record.value) async for record in bus.read(Topics().commands, 0)]
    finally:
        await bus.close()
    assert launcher.stopped == ["job-1"] * times
    return sent


def launched_from(commands: list[Command]) -> Checkpoint | None:
    """Where the owner starts attempt 2 once it has decided ``commands`` in order."""
    job = restarting_job()
    for command in commands:
        for event in decide(job, command, NOW, checkpoints=PLACES):
            job = evolve(job, event)
    assert job.attempt == 2 and job.state.holds_learners
    launching = [c for c in commands if isinstance(c.data, cmd.BeginLaunch)]
    assert launching, "the relaunch always asks for the attempt"
    return job.resume_from


async def test_the_checkpoint_a_stopped_rank_saved_on_its_way_out_is_reported_before_the_launch(
    tmp_path: Path, store: HeartbeatStore
) -> None:
    newer = {"uri": f"{PLACE}/ckpt_step_40.pt", "step": 40, "size_bytes": 9}
    await store.put(exit_key("job-1", 1, 0), encode_exit(-15, newer))  # stopped: SIGTERM, saved step 40
    await store.put(exit_key("job-1", 1, 1), encode_exit(1))  # the rank that failed, nothing new

    sent = await relaunched(tmp_path, store)

    saved = Checkpoint(rank=0, attempt=1, step=40, uri=f"{PLACE}/ckpt_step_40.pt", size_bytes=9)
    assert [command.data for command in sent] == [
        cmd.ReportCheckpoint(checkpoint=saved),
        cmd.BeginLaunch(attempt=2),
    ]
    assert launched_from(sent) == saved


async def test_a_relaunch_run_again_sends_the_very_same_commands(
    tmp_path: Path, store: HeartbeatStore
) -> None:
    await store.put(exit_key("job-1", 1, 0), encode_exit(0, {"uri": f"{PLACE}/40.pt", "step": 40}))

    sent = await relaunched(tmp_path, store, times=2)

    first, again = sent[:2], sent[2:]
    assert [c.command_id for c in first] == [c.command_id for c in again]
    assert len({c.command_id for c in first}) == 2


async def test_a_relaunch_run_again_after_the_record_went_asks_for_the_attempt_under_the_same_id(
    tmp_path: Path, store: HeartbeatStore
) -> None:
    """Re-run after a crash, once the monitor deleted the spent record: its ``BeginLaunch`` keeps
    its id (the owner drops it as a duplicate), and no id stands for two different commands."""
    await store.put(exit_key("job-1", 1, 0), encode_exit(0, {"uri": f"{PLACE}/40.pt", "step": 40}))
    first = await relaunched(tmp_path / "first", store)
    await store.delete(exit_key("job-1", 1, 0))

    again = await relaunched(tmp_path / "again", store)

    assert [command.data for command in again] == [cmd.BeginLaunch(attempt=2)]
    assert again[0].command_id == first[-1].command_id


async def test_what_an_exit_record_claims_beyond_the_job_s_ranks_and_place_changes_nothing(
    tmp_path: Path, store: HeartbeatStore
) -> None:
    """An exit record is written with the job's heartbeat login, which the tenant's program may hold
    (on Kubernetes): ranks it does not have are not read, a claimed rank or attempt is the key's,
    an unreadable record is skipped, and a checkpoint outside the job's place is refused by the owner."""
    outside = {"uri": "file:///learners/job-2/checkpoints/999.pt", "step": 999, "rank": 1, "attempt": 1}
    await store.put(exit_key("job-1", 1, 0), encode_exit(-15, outside))
    await store.put(exit_key("job-1", 1, 1), b"[" * 20_000)
    await store.put(exit_key("job-1", 1, 5), encode_exit(0, {"uri": f"{PLACE}/500.pt", "step": 500}))
    await store.put(exit_key("job-1", 1, 10), encode_exit(0, {"uri": f"{PLACE}/600.pt", "step": 600}))

    sent = await relaunched(tmp_path, store)

    claimed = Checkpoint(rank=0, attempt=1, step=999, uri=outside["uri"])
    assert [command.data for command in sent] == [
        cmd.ReportCheckpoint(checkpoint=claimed),
        cmd.BeginLaunch(attempt=2),
    ]
    assert launched_from(sent) == OLDER


@pytest.mark.parametrize("reachable", [False, True])
async def test_without_readable_exit_records_the_relaunch_goes_on_from_what_was_reported(
    tmp_path: Path, reachable: bool
) -> None:
    heartbeats = (EmbeddedHeartbeatStore if reachable else Unreachable)(tmp_path / "heartbeats.db")
    try:
        sent = await relaunched(tmp_path, heartbeats)
    finally:
        await heartbeats.close()

    assert [command.data for command in sent] == [cmd.BeginLaunch(attempt=2)]
    assert launched_from(sent) == OLDER
