"""A learner that names a new checkpoint in every beat cannot flood its job's log.

Every checkpoint the monitor reports becomes a ``CheckpointRecorded`` on the job's log (Kafka), in
the projections and on the dashboard, and a learner's side may name a new one in every beat: the
agent writes a beat at most four times a second, but whoever holds the job's etcd login (a learner
pod on Kubernetes holds it) writes the learner's key as fast as etcd takes writes. Before, each
became an event: 2,000 beats in two seconds made 2,000 ``CheckpointRecorded``. Now the monitor
reports at most one a learner each ``checkpoint_interval_s``, the latest of those named in
between, and the last one at once before the learner's exit or loss is reported, so a restart or a
halt still names the last checkpoint. The owner's real decider turns the reports into events here,
and the tracker observes each event as the reactor host makes it do.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from ffdl.core.decider import decide
from ffdl.core.job import evolve
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement
from ffdl.handlers.heartbeat_keys import LearnerBeat, encode_exit, exit_key, learner_key
from ffdl.handlers.heartbeat_tracker import Effect, HeartbeatTracker, Note, Report
from tests.job_history import folded_job

WALL = datetime(2026, 1, 1, tzinfo=UTC)
JOB_ID = "job-1"
INTERVAL_S = 1.0
TICK_S = 0.25  # the monitor's check interval
GRACE_S = 5.0
#: Beats a millisecond apart for two seconds, each naming a new checkpoint.
FLOOD = 2000
FLOOD_S = 2.0
#: The most a learner may have recorded in the flood: one at once, then one each interval.
MOST = 1 + round(FLOOD_S / INTERVAL_S)


def uri(step: int) -> str:
    return f"file:///learners/{JOB_ID}/checkpoints/step-{step}.pt"


def named(step: int) -> dict[str, object]:
    return {"uri": uri(step), "step": step}


def beat(step: int, *, attempt: int = 1) -> bytes:
    return LearnerBeat(attempt=attempt, pid=7, host="node-a", step=step, checkpoint=named(step)).to_json()


class Owner:
    """The job's owner and the reactor host, in one: each report the monitor makes is decided by the
    real decider, its events are folded and observed by the tracker, in order."""

    def __init__(self, learners: int) -> None:
        spec = JobSpec(name="flood", command="true", learners=learners, gpus=1, max_restarts=3)
        placement = Placement(
            learners=tuple(
                LearnerPlacement(rank=rank, node="node-a", gpus=(rank,)) for rank in range(learners)
            )
        )
        datas = [
            ev.JobSubmitted(spec=spec),
            ev.JobAccepted(),
            ev.JobQueued(),
            ev.GpusAllocated(placement=placement),
            ev.JobLaunching(attempt=1),
            *(ev.LearnerStarted(rank=rank, attempt=1) for rank in range(learners)),
            ev.JobRunning(attempt=1),
        ]
        self.job, _ = folded_job(datas, WALL, job_id=JOB_ID)
        self.events: list[Event] = []
        self.notes: list[Note] = []
        self.tracker = HeartbeatTracker(
            grace_s=GRACE_S, launch_timeout_s=60.0, progress_interval_s=0.5, checkpoint_interval_s=INTERVAL_S
        )
        self.tracker.resync({}, 0.0, revision=1)
        self.tracker.observe(self.job, adopted=False, now=0.0)

    def take(self, effects: Sequence[Effect], now: float) -> None:
        for effect in effects:
            if isinstance(effect, Note):
                self.notes.append(effect)
                continue
            assert isinstance(effect, Report)
            self.send(effect.data, now)

    def send(self, data: CommandData, now: float) -> None:
        command = Command(
            command_id=uuid.uuid4(),
            issued_at=WALL,
            job_id=self.job.job_id,
            tenant=self.job.tenant,
            producer="monitor@test",
            data=data,
        )
        for event in decide(self.job, command, WALL):
            self.job = evolve(self.job, event)
            self.events.append(event)
            self.tracker.observe(self.job, adopted=False, now=now)

    def put(self, key: str, value: bytes, now: float) -> None:
        self.take(self.tracker.put(key, value, now), now)

    def delete(self, key: str, now: float) -> None:
        self.take(self.tracker.delete(key, now), now)

    def tick(self, now: float) -> None:
        self.take(self.tracker.tick(now, WALL), now)

    def flood(self, start: float, rank: int = 0, *, attempt: int = 1) -> int:
        """``FLOOD`` beats of ``rank``, a millisecond apart from ``start``, ticked as the monitor
        ticks; the last step named."""
        for index in range(FLOOD):
            now = start + index * FLOOD_S / FLOOD
            if index and index % round(TICK_S * FLOOD / FLOOD_S) == 0:
                self.tick(now)
            self.put(learner_key(JOB_ID, rank), beat(index + 1, attempt=attempt), now)
        return FLOOD

    def recorded(self) -> list[Checkpoint]:
        return [
            event.data.checkpoint for event in self.events if isinstance(event.data, ev.CheckpointRecorded)
        ]

    def types(self) -> list[str]:
        return [event.type for event in self.events]


def test_a_new_checkpoint_in_every_beat_records_one_an_interval_and_the_last_before_the_exit() -> None:
    owner = Owner(learners=1)

    last = owner.flood(GRACE_S)

    assert len(owner.recorded()) <= MOST, f"{len(owner.recorded())} checkpoints recorded in {FLOOD_S}s"
    assert owner.recorded()[0].step == 1  # the first at once
    end = GRACE_S + FLOOD_S
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(0, named(last)), end)  # the agent's exit record
    assert owner.recorded()[-1] == Checkpoint(uri=uri(last), step=last, rank=0, attempt=1)
    assert owner.types()[-3:] == ["CheckpointRecorded", "LearnerExited", "JobStoring"]
    assert len(owner.recorded()) <= MOST + 1


def test_the_last_checkpoint_of_a_flood_is_recorded_on_the_next_tick_after_the_interval() -> None:
    owner = Owner(learners=1)
    last = owner.flood(GRACE_S)
    end = GRACE_S + FLOOD_S

    owner.tick(end + INTERVAL_S)

    assert owner.recorded()[-1].step == last
    assert owner.job.latest_checkpoint is not None and owner.job.latest_checkpoint.step == last


def test_a_learner_lost_after_a_flood_restarts_from_its_last_checkpoint() -> None:
    owner = Owner(learners=1)
    last = owner.flood(GRACE_S)
    end = GRACE_S + FLOOD_S

    owner.delete(learner_key(JOB_ID, 0), end)  # its lease expired (its node died)

    assert len(owner.recorded()) <= MOST + 1
    assert owner.types()[-3:] == ["CheckpointRecorded", "LearnerLost", "JobRestarting"]
    restarting = owner.events[-1].data
    assert isinstance(restarting, ev.JobRestarting)
    assert restarting.resume_from is not None and restarting.resume_from.step == last


def test_a_halted_learner_that_floods_on_its_way_out_is_halted_at_its_last_checkpoint() -> None:
    owner = Owner(learners=1)
    owner.send(cmd.HaltJob(reason="preempted"), GRACE_S)
    assert owner.job.state.name == "HALTING"

    last = owner.flood(GRACE_S)
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(-15), GRACE_S + FLOOD_S)  # no checkpoint in it

    assert len(owner.recorded()) <= MOST + 1
    halted = owner.events[-1].data
    assert isinstance(halted, ev.JobHalted)
    assert halted.checkpoint is not None and halted.checkpoint.step == last


def test_a_peer_stopped_after_a_failure_that_floods_on_its_way_out_is_bounded_and_its_last_is_recorded() -> (
    None
):
    """Rank 0 fails; rank 1, stopped for the relaunch, names a new checkpoint in every beat of its
    past attempt until it exits. The relaunch resumes from its last one."""
    owner = Owner(learners=2)
    owner.put(learner_key(JOB_ID, 1), beat(0), GRACE_S)
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(1), GRACE_S)
    assert owner.job.state.name == "RESTARTING"
    before = len(owner.recorded())

    last = owner.flood(GRACE_S, rank=1)

    assert len(owner.recorded()) - before <= MOST
    owner.tick(GRACE_S + FLOOD_S + INTERVAL_S)
    assert owner.recorded()[-1] == Checkpoint(uri=uri(last), step=last, rank=1, attempt=1)
    owner.send(cmd.BeginLaunch(attempt=2), GRACE_S + FLOOD_S + INTERVAL_S)
    launching = owner.events[-1].data
    assert isinstance(launching, ev.JobLaunching)
    assert launching.resume_from is not None and launching.resume_from.step == last


def test_beats_and_exit_records_under_ranks_the_job_does_not_have_report_nothing() -> None:
    """Whoever writes the job's keys may write any rank: each key once made a report the owner
    refused, a ``CommandRejected`` on the job's log for every key."""
    owner = Owner(learners=1)
    for rank in range(1, 501):
        owner.put(learner_key(JOB_ID, rank), beat(rank), GRACE_S + rank / 1000)
        owner.put(exit_key(JOB_ID, 1, rank), encode_exit(1, named(rank)), GRACE_S + rank / 1000)
    owner.tick(GRACE_S + 2)

    assert owner.events == []
    assert [note.message for note in owner.notes] == [
        "heartbeat keys of ranks the job does not have are passed over"
    ]
    assert owner.job.state.name == "RUNNING"


@pytest.mark.parametrize("requeue", [False, True], ids=["halt", "preemption"])
def test_a_restarting_job_halted_right_after_a_stopped_peers_exit_names_the_checkpoint_of_its_exit_record(
    requeue: bool,
) -> None:
    """A halt (or a preemption) of a RESTARTING job is decided at once, naming the checkpoint
    recorded by then: a stopped peer's exit record is reported at once, not a second later (the
    job halted then holds no learners, and the owner refused it: the halt named step 0)."""
    owner = Owner(learners=2)
    owner.put(learner_key(JOB_ID, 1), beat(0), GRACE_S)
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(1), GRACE_S)  # rank 0 fails
    assert owner.job.state.name == "RESTARTING"
    owner.put(learner_key(JOB_ID, 1), beat(10), GRACE_S + 0.1)  # the stopped peer saves 10
    owner.put(learner_key(JOB_ID, 1), beat(11), GRACE_S + 0.5)  # and 11 on its way out
    owner.put(exit_key(JOB_ID, 1, 1), encode_exit(-15, named(11)), GRACE_S + 0.6)

    owner.send(cmd.HaltJob(reason="halted", requeue=requeue), GRACE_S + 0.7)

    halted = next(event.data for event in owner.events if isinstance(event.data, ev.JobHalted))
    assert halted.checkpoint == Checkpoint(uri=uri(11), step=11, rank=1, attempt=1)
    assert owner.job.state.name == ("QUEUED" if requeue else "HALTED")


def test_a_stopped_peers_exit_record_without_its_checkpoint_reports_the_one_its_beat_named_at_once() -> None:
    """The agent leaves a checkpoint too large for the record out of it: the final beat named it,
    and it waits no longer than the exit record."""
    owner = Owner(learners=2)
    owner.put(learner_key(JOB_ID, 1), beat(0), GRACE_S)
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(1), GRACE_S)
    owner.put(learner_key(JOB_ID, 1), beat(10), GRACE_S + 0.1)
    owner.put(learner_key(JOB_ID, 1), beat(11), GRACE_S + 0.5)
    owner.put(exit_key(JOB_ID, 1, 1), encode_exit(-15), GRACE_S + 0.6)  # no checkpoint in it

    owner.send(cmd.HaltJob(reason="halted"), GRACE_S + 0.7)

    halted = next(event.data for event in owner.events if isinstance(event.data, ev.JobHalted))
    assert halted.checkpoint is not None and halted.checkpoint.step == 11


def test_a_stopped_peers_exit_record_rewritten_with_a_new_checkpoint_each_time_is_bounded() -> None:
    """Only the first exit record of a rank is reported at once: whoever holds the job's login may
    rewrite it as fast as etcd takes writes."""
    owner = Owner(learners=2)
    owner.put(learner_key(JOB_ID, 1), beat(0), GRACE_S)
    owner.put(exit_key(JOB_ID, 1, 0), encode_exit(1), GRACE_S)
    assert owner.job.state.name == "RESTARTING"
    before = len(owner.recorded())

    for index in range(FLOOD):
        now = GRACE_S + index * FLOOD_S / FLOOD
        if index and index % round(TICK_S * FLOOD / FLOOD_S) == 0:
            owner.tick(now)
        owner.put(exit_key(JOB_ID, 1, 1), encode_exit(-15, named(index + 1)), now)
    owner.tick(GRACE_S + FLOOD_S + INTERVAL_S)

    assert len(owner.recorded()) - before <= MOST + 1
    assert owner.recorded()[-1].step == FLOOD


def test_a_key_of_a_rank_the_job_does_not_have_read_before_the_job_and_deleted_after_is_passed_over() -> None:
    """A monitor that starts reads the store before it folds the jobs: beats of ranks the job does
    not have were kept, and their deletion (the lease expired) once the job was watched was
    reported lost, each refused by the owner (50 keys, 50 ``CommandRejected``)."""
    owner = Owner(learners=1)
    strays = {learner_key(JOB_ID, rank): beat(1) for rank in range(1, 51)}
    tracker = HeartbeatTracker(grace_s=GRACE_S, launch_timeout_s=60.0, progress_interval_s=0.5)
    owner.take(tracker.resync({learner_key(JOB_ID, 0): beat(1), **strays}, 0.0, revision=1), 0.0)
    tracker.observe(owner.job, adopted=True, now=0.0)
    owner.tracker = tracker
    owner.tick(GRACE_S + 1)  # the grace is over: a deletion is a loss at once
    before = len(owner.events)

    for key in strays:
        owner.delete(key, GRACE_S + 2)

    assert owner.events[before:] == []
    assert owner.job.state.name == "RUNNING"
    assert [note.message for note in owner.notes].count(
        "heartbeat keys of ranks the job does not have are passed over"
    ) == 1
