"""The monitor's state machine, driven directly: heartbeats, exit records, deletions, probes and ticks
in, reports and notes out, the time passed in by the test."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ffdl.core.job import Job, evolve, start
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import CommandData, Event, EventData
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.heartbeat_keys import LearnerBeat, encode_exit, exit_key, learner_key
from ffdl.handlers.heartbeat_tracker import Effect, HeartbeatTracker, Note, Report

JOB_ID = "job-1"
WALL = datetime(2024, 5, 1, 9, tzinfo=UTC)
GRACE_S = 10.0
LAUNCH_TIMEOUT_S = 60.0
PROGRESS_INTERVAL_S = 1.0
PROGRESS_TIMEOUT_S = 30.0
#: A time past the grace that following the store at time 0 starts.
AFTER_GRACE = GRACE_S


def events_of(datas: list[EventData]) -> list[Event]:
    return [
        Event(
            event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{JOB_ID}/{seq}"),
            job_id=JOB_ID,
            tenant="acme",
            seq=seq,
            occurred_at=WALL,
            producer="test",
            data=data,
        )
        for seq, data in enumerate(datas, start=1)
    ]


def job_after(datas: list[EventData]) -> Job:
    first, *rest = events_of(datas)
    job = start(first)
    for event in rest:
        job = evolve(job, event)
    return job


def launching(learners: int = 1) -> Job:
    """A job launching its first attempt, no learner started yet."""
    spec = JobSpec(
        name="tracked", command="true", learners=learners, gpus=1, progress_timeout_s=PROGRESS_TIMEOUT_S
    )
    placement = Placement(
        learners=tuple(LearnerPlacement(rank=rank, node="node-a", gpus=(rank,)) for rank in range(learners))
    )
    return job_after(
        [
            ev.JobSubmitted(spec=spec),
            ev.JobAccepted(),
            ev.JobQueued(),
            ev.GpusAllocated(placement=placement),
            ev.JobLaunching(attempt=1),
        ]
    )


def running(learners: int = 1) -> Job:
    """A job running its first attempt, every learner started."""
    job = launching(learners)
    for rank in range(learners):
        job = then(job, ev.LearnerStarted(rank=rank, attempt=1))
    return then(job, ev.JobRunning(attempt=1))


def then(job: Job, data: EventData) -> Job:
    event = Event(
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{JOB_ID}/{job.seq + 1}"),
        job_id=job.job_id,
        tenant=job.tenant,
        seq=job.seq + 1,
        occurred_at=WALL,
        producer="test",
        data=data,
    )
    return evolve(job, event)


def beat(step: int, *, attempt: int = 1, checkpoint: dict[str, object] | None = None) -> bytes:
    return LearnerBeat(attempt=attempt, pid=42, host="node-a", step=step, checkpoint=checkpoint).to_json()


def reports(effects: list[Effect]) -> list[CommandData]:
    return [effect.data for effect in effects if isinstance(effect, Report)]


def losses(effects: list[Effect]) -> list[cmd.ReportLearnerLost]:
    return [data for data in reports(effects) if isinstance(data, cmd.ReportLearnerLost)]


def notes(effects: list[Effect]) -> list[str]:
    return [effect.message for effect in effects if isinstance(effect, Note)]


def tracker() -> HeartbeatTracker:
    return HeartbeatTracker(
        grace_s=GRACE_S, launch_timeout_s=LAUNCH_TIMEOUT_S, progress_interval_s=PROGRESS_INTERVAL_S
    )


def following(job: Job, store: dict[str, bytes] | None = None) -> HeartbeatTracker:
    """A tracker that started following the store at time 0 and watches ``job`` live (no grace of its own)."""
    tracked = tracker()
    tracked.resync(store or {}, 0.0, revision=1)
    tracked.observe(job, adopted=False, now=0.0)
    return tracked


def test_a_learner_s_first_heartbeat_reports_it_started_and_its_progress() -> None:
    tracked = following(launching())

    effects = tracked.put(learner_key(JOB_ID, 0), beat(step=3), 1.0)

    assert reports(effects) == [
        cmd.ReportLearnerStarted(rank=0, attempt=1, pid=42, host="node-a"),
        cmd.ReportProgress(rank=0, attempt=1, step=3),
    ]
    assert reports(tracked.put(learner_key(JOB_ID, 0), beat(step=3), 2.0)) == [], "said once"


def test_progress_the_job_already_records_is_not_reported() -> None:
    """A learner at step 0 with no metrics (an instant job, or one that never reports) tells its
    owner nothing new: only that it started and, when it exits, how."""
    tracked = following(launching())

    started = tracked.put(learner_key(JOB_ID, 0), beat(step=0), 1.0)
    exited = tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0), 1.1)

    assert reports(started) == [cmd.ReportLearnerStarted(rank=0, attempt=1, pid=42, host="node-a")]
    assert reports(exited) == [cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)]


def test_a_watched_job_s_recorded_progress_is_not_reported_again() -> None:
    job = then(running(), ev.LearnerProgressed(rank=0, attempt=1, step=7))
    tracked = tracker()
    tracked.resync({}, 0.0, revision=1)
    tracked.observe(job, adopted=True, now=0.0)  # another monitor reported step 7

    assert reports(tracked.put(learner_key(JOB_ID, 0), beat(step=7), 1.0)) == []
    assert reports(tracked.put(learner_key(JOB_ID, 0), beat(step=8), 2.0)) == [
        cmd.ReportProgress(rank=0, attempt=1, step=8)
    ]


def test_progress_is_reported_at_most_every_interval_and_the_last_one_on_the_next_tick() -> None:
    tracked = following(running())
    key = learner_key(JOB_ID, 0)
    assert reports(tracked.put(key, beat(step=1), 1.0)) == [cmd.ReportProgress(rank=0, attempt=1, step=1)]

    assert reports(tracked.put(key, beat(step=2), 1.5)) == []
    assert reports(tracked.tick(1.9, WALL)) == []
    assert reports(tracked.tick(2.0, WALL)) == [cmd.ReportProgress(rank=0, attempt=1, step=2)]


def test_an_exit_flushes_the_last_progress_and_checkpoint_first() -> None:
    tracked = following(running())
    checkpoint = {"uri": "s3://ckpt/5", "step": 5}
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 1.0)
    reported = tracked.put(learner_key(JOB_ID, 0), beat(step=5, checkpoint=checkpoint), 1.1)
    assert [type(data) for data in reports(reported)] == [cmd.ReportCheckpoint]

    effects = tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0), 1.2)

    assert reports(effects) == [
        cmd.ReportProgress(rank=0, attempt=1, step=5),  # within the interval, but the last one
        cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0),
    ]


def test_a_checkpoint_in_the_heartbeat_is_reported_once() -> None:
    tracked = following(running())
    checkpoint = {"uri": "s3://ckpt/5", "step": 5}

    first = tracked.put(learner_key(JOB_ID, 0), beat(step=5, checkpoint=checkpoint), 1.0)
    again = tracked.put(learner_key(JOB_ID, 0), beat(step=5, checkpoint=checkpoint), 2.0)

    expected = cmd.ReportCheckpoint(checkpoint=Checkpoint(uri="s3://ckpt/5", step=5, rank=0, attempt=1))
    assert expected in reports(first)
    assert expected not in reports(again)


def test_a_checkpoint_saved_on_the_way_out_of_a_failed_attempt_reaches_the_restarting_job() -> None:
    """Rank 1 died and the job restarts; rank 0, stopped since, saves (or finds in its final scan) a
    newer checkpoint. The relaunch must know of it: a program resuming from its newest file loads it."""
    job = running(learners=2)
    tracked = following(job)
    tracked.put(learner_key(JOB_ID, 0), beat(step=20), 1.0)
    restarting = then(
        then(job, ev.LearnerExited(rank=1, attempt=1, exit_code=-9)),
        ev.JobRestarting(attempt=2, backoff_s=0.2, reason="learner 1 exited with -9"),
    )
    tracked.observe(restarting, adopted=False, now=1.5)
    on_the_way_out = beat(step=40, checkpoint={"uri": "file:///c/ckpt_step_40.pt", "step": 40})

    first = tracked.put(learner_key(JOB_ID, 0), on_the_way_out, 2.0)
    again = tracked.put(learner_key(JOB_ID, 0), on_the_way_out, 2.1)
    of_another_attempt = tracked.put(
        learner_key(JOB_ID, 1), beat(step=9, attempt=2, checkpoint={"uri": "file:///c/9", "step": 9}), 2.2
    )

    saved = Checkpoint(uri="file:///c/ckpt_step_40.pt", step=40, rank=0, attempt=1)
    assert reports(first) == [cmd.ReportCheckpoint(checkpoint=saved)]
    assert reports(again) == [] and reports(of_another_attempt) == []
    tracked.observe(then(restarting, ev.JobLaunching(attempt=2, resume_from=saved)), adopted=False, now=3.0)
    assert reports(tracked.put(learner_key(JOB_ID, 0), on_the_way_out, 3.1)) == [], "that attempt is over"


def test_an_exit_record_s_checkpoint_is_reported_before_the_exit_when_its_beat_went_unread() -> None:
    """The final beat goes with the lease: a monitor that resynced after the agent revoked it never
    read that beat, and the exit record is the last word on what the learner saved."""
    tracked = following(running())
    tracked.put(learner_key(JOB_ID, 0), beat(step=5, checkpoint={"uri": "s3://ckpt/5", "step": 5}), 1.0)
    final = {"uri": "s3://ckpt/9", "step": 9, "rank": 7, "attempt": 99}  # rank and attempt: the key's

    effects = tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0, final), 1.2)

    assert reports(effects) == [
        cmd.ReportCheckpoint(checkpoint=Checkpoint(uri="s3://ckpt/9", step=9, rank=0, attempt=1)),
        cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0),
    ]


def test_an_exit_record_naming_the_checkpoint_already_reported_reports_only_the_exit() -> None:
    tracked = following(running())
    checkpoint = {"uri": "s3://ckpt/5", "step": 5}
    tracked.put(learner_key(JOB_ID, 0), beat(step=5, checkpoint=checkpoint), 1.0)

    effects = tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0, checkpoint), 1.2)

    assert [type(data) for data in reports(effects)] == [cmd.ReportLearnerExited]


def test_an_exit_record_with_an_unreadable_checkpoint_still_reports_the_exit() -> None:
    tracked = following(running())

    effects = tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0, {"uri": "", "step": -1}), 1.0)

    assert reports(effects) == [cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)]
    assert notes(effects) == ["unreadable checkpoint in a learner's report"]


def test_the_exit_record_of_a_rank_stopped_for_a_restart_reports_what_it_saved() -> None:
    job = running(learners=2)
    tracked = following(job)
    restarting = then(
        then(job, ev.LearnerExited(rank=1, attempt=1, exit_code=1)),
        ev.JobRestarting(attempt=2, backoff_s=0.2, reason="learner 1 exited with code 1"),
    )
    tracked.observe(restarting, adopted=False, now=1.5)

    effects = tracked.put(
        exit_key(JOB_ID, 1, 0), encode_exit(-15, {"uri": "file:///c/40.pt", "step": 40}), 2.0
    )

    saved = Checkpoint(uri="file:///c/40.pt", step=40, rank=0, attempt=1)
    assert reports(effects) == [cmd.ReportCheckpoint(checkpoint=saved)]
    assert tracked.spent_exits == [exit_key(JOB_ID, 1, 0)]


def test_what_a_stopped_attempt_saved_read_before_its_restarting_job_was_folded_is_reported() -> None:
    """A monitor that starts reads the store before it folds the jobs: a job found restarting still
    gets the checkpoints its past attempt's exit records and beats name, before those are spent."""
    job = running(learners=2)
    restarting = then(
        then(job, ev.LearnerExited(rank=1, attempt=1, exit_code=1)),
        ev.JobRestarting(attempt=2, backoff_s=30.0, reason="learner 1 exited with code 1"),
    )
    tracked = tracker()
    store = {
        exit_key(JOB_ID, 1, 0): encode_exit(-15, {"uri": "file:///c/40.pt", "step": 40}),
        learner_key(JOB_ID, 1): beat(30, checkpoint={"uri": "file:///c/30.pt", "step": 30}),
    }
    tracked.resync(store, 0.0, revision=1)
    tracked.observe(restarting, adopted=True, now=0.0)

    assert reports(tracked.tick(0.1, WALL)) == [
        cmd.ReportCheckpoint(checkpoint=Checkpoint(uri="file:///c/40.pt", step=40, rank=0, attempt=1)),
        cmd.ReportCheckpoint(checkpoint=Checkpoint(uri="file:///c/30.pt", step=30, rank=1, attempt=1)),
    ]
    assert tracked.spent_exits == [exit_key(JOB_ID, 1, 0)]
    tracked.observe(restarting, adopted=True, now=0.2)
    assert reports(tracked.tick(0.3, WALL)) == [], "each once"


def test_an_exit_recorded_before_the_job_is_observed_is_reported_on_the_next_tick() -> None:
    tracked = tracker()
    tracked.resync({exit_key(JOB_ID, 1, 0): encode_exit(3)}, 0.0, revision=1)
    tracked.observe(running(), adopted=True, now=0.0)

    assert reports(tracked.tick(0.1, WALL)) == [cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=3)]
    assert reports(tracked.tick(AFTER_GRACE + 1, WALL)) == [], "an exit, not a loss"


def test_a_heartbeat_deleted_outside_a_grace_is_a_loss_at_once() -> None:
    tracked = following(running())
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 1.0)

    effects = tracked.delete(learner_key(JOB_ID, 0), AFTER_GRACE)

    assert reports(effects) == [
        cmd.ReportLearnerLost(rank=0, attempt=1, reason=LossReason.EXPIRED, detail="heartbeat lease expired")
    ]
    assert reports(tracked.tick(AFTER_GRACE + 100, WALL)) == [], "lost once"


def test_a_clean_exit_is_not_a_loss() -> None:
    tracked = following(running())
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 1.0)
    tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0), AFTER_GRACE)

    assert reports(tracked.delete(learner_key(JOB_ID, 0), AFTER_GRACE)) == []


def test_a_key_deleted_after_an_exit_read_before_its_job_was_observed_is_no_loss() -> None:
    tracked = tracker()
    store = {learner_key(JOB_ID, 0): beat(step=1), exit_key(JOB_ID, 1, 0): encode_exit(0)}
    tracked.resync(store, 0.0, revision=1)
    tracked.observe(running(), adopted=False, now=AFTER_GRACE)

    assert losses(tracked.delete(learner_key(JOB_ID, 0), AFTER_GRACE)) == []
    assert reports(tracked.tick(AFTER_GRACE, WALL)) == [
        cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0)
    ]


def test_a_deletion_within_the_grace_waits_for_the_learner_to_re_register() -> None:
    tracked = following(running(learners=2))
    for rank in (0, 1):
        tracked.put(learner_key(JOB_ID, rank), beat(step=1), 1.0)
    for rank in (0, 1):
        assert reports(tracked.delete(learner_key(JOB_ID, rank), 2.0)) == []
    tracked.put(learner_key(JOB_ID, 0), beat(step=2), 3.0)  # only rank 0 comes back

    assert losses(tracked.tick(AFTER_GRACE - 0.1, WALL)) == []
    [loss] = losses(tracked.tick(AFTER_GRACE, WALL))
    assert (loss.rank, loss.reason) == (1, LossReason.EXPIRED)
    assert "not re-registered" in loss.detail


def test_while_the_store_does_not_answer_nothing_is_reaped_and_a_grace_follows() -> None:
    tracked = following(running())
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 1.0)

    assert notes(tracked.probe_failed("no answer")) == ["heartbeat store slow or unreachable: reaping paused"]
    assert notes(tracked.probe_failed("no answer")) == [], "said once"
    assert reports(tracked.delete(learner_key(JOB_ID, 0), 20.0)) == [], "a lease expired by the outage"
    assert not tracked.healthy
    assert notes(tracked.probe_answered(30.0)) == ["heartbeat store answers again"]

    assert reports(tracked.tick(30.0 + GRACE_S - 0.1, WALL)) == []
    [loss] = reports(tracked.tick(30.0 + GRACE_S, WALL))
    assert isinstance(loss, cmd.ReportLearnerLost) and loss.reason is LossReason.EXPIRED


def test_a_store_followed_again_starts_a_grace_and_its_snapshot_tells_what_was_deleted() -> None:
    tracked = following(running())
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 1.0)

    assert notes(tracked.store_lost("watch broke")) == ["heartbeat store not followed: reaping paused"]
    assert notes(tracked.store_lost("watch broke")) == [], "said once"
    effects = tracked.resync({}, 50.0, revision=9)  # the key went while nobody watched

    assert notes(effects) == [
        "heartbeat store reachable: following learners",
        "heartbeat deleted during a grace period: waiting for the learner to re-register",
    ]
    assert reports(effects) == []
    assert reports(tracked.tick(50.0 + GRACE_S - 0.1, WALL)) == []
    [loss] = reports(tracked.tick(50.0 + GRACE_S, WALL))
    assert isinstance(loss, cmd.ReportLearnerLost) and "not re-registered" in loss.detail


def test_a_job_adopted_from_the_log_gets_a_grace_of_its_own() -> None:
    tracked = tracker()
    tracked.resync({}, 0.0, revision=1)
    tracked.put(learner_key(JOB_ID, 0), beat(step=1), 50.0)
    tracked.observe(running(), adopted=True, now=50.0)

    assert reports(tracked.delete(learner_key(JOB_ID, 0), 51.0)) == []
    assert reports(tracked.tick(50.0 + GRACE_S - 0.1, WALL)) == []
    [loss] = reports(tracked.tick(50.0 + GRACE_S, WALL))
    assert isinstance(loss, cmd.ReportLearnerLost) and loss.rank == 0


def test_a_learner_that_stops_progressing_is_lost_as_hung() -> None:
    tracked = following(running())
    key = learner_key(JOB_ID, 0)
    tracked.put(key, beat(step=1), AFTER_GRACE)
    tracked.put(key, beat(step=2), AFTER_GRACE + 20)  # progress: the timeout starts again
    tracked.put(key, beat(step=2), AFTER_GRACE + 40)  # alive, not progressing

    assert reports(tracked.tick(AFTER_GRACE + 20 + PROGRESS_TIMEOUT_S, WALL)) == []
    [hung] = reports(tracked.tick(AFTER_GRACE + 20 + PROGRESS_TIMEOUT_S + 0.1, WALL))
    assert hung == cmd.ReportLearnerLost(
        rank=0,
        attempt=1,
        reason=LossReason.HUNG,
        detail="the gang made no progress for 30s (rank 0 at step 2)",
    )


def test_a_learner_that_never_beats_is_lost_after_the_launch_timeout_on_the_wall_clock() -> None:
    tracked = following(launching())

    assert reports(tracked.tick(AFTER_GRACE, WALL + timedelta(seconds=LAUNCH_TIMEOUT_S))) == []
    [lost] = reports(tracked.tick(AFTER_GRACE, WALL + timedelta(seconds=LAUNCH_TIMEOUT_S + 1)))
    assert lost == cmd.ReportLearnerLost(
        rank=0, attempt=1, reason=LossReason.EXPIRED, detail="no heartbeat within 60s"
    )


def test_exit_records_are_spent_once_the_job_has_moved_past_their_attempt() -> None:
    job = running(learners=2)
    tracked = following(job)
    for rank in (0, 1):
        tracked.put(exit_key(JOB_ID, 1, rank), encode_exit(0), 1.0)
    assert tracked.spent_exits == [], "kept while the job is on that attempt"

    tracked.observe(then(job, ev.JobStoring(attempt=1)), adopted=False, now=2.0)
    assert tracked.spent_exits == [exit_key(JOB_ID, 1, 0), exit_key(JOB_ID, 1, 1)]
    for key in tracked.spent_exits:
        tracked.exit_deleted(key)

    tracked.put(exit_key(JOB_ID, 1, 1), encode_exit(-15), 3.0)  # a learner stopped late
    assert tracked.spent_exits == [exit_key(JOB_ID, 1, 1)]


def test_a_heartbeat_of_another_attempt_or_an_unreadable_one_reports_nothing() -> None:
    tracked = following(running())

    assert reports(tracked.put(learner_key(JOB_ID, 0), beat(step=1, attempt=2), 1.0)) == []
    effects = tracked.put(learner_key(JOB_ID, 0), b"not json", 1.0)
    assert reports(effects) == [] and notes(effects) == ["unreadable heartbeat ignored"]


# -- properties ---------------------------------------------------------------------------------

RANKS = 2

Step = st.one_of(
    st.tuples(st.just("beat"), st.integers(0, RANKS - 1), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.integers(0, RANKS - 1)),
    st.tuples(st.just("exit"), st.integers(0, RANKS - 1), st.integers(-15, 2)),
    st.tuples(st.just("wait"), st.floats(0, 2 * GRACE_S)),
    st.tuples(st.just("tick")),
    st.tuples(st.just("probe_failed")),
    st.tuples(st.just("probe_answered")),
    st.tuples(st.just("store_lost")),
    st.tuples(st.just("resync")),
)


@dataclass
class Model:
    """What the test knows: the store's keys, the time, and when reaping may start at the earliest."""

    tracked: HeartbeatTracker
    store: dict[str, bytes] = field(default_factory=dict)
    now: float = 0.0
    reap_from: float = 0.0
    losses: list[cmd.ReportLearnerLost] = field(default_factory=list)
    exits: list[cmd.ReportLearnerExited] = field(default_factory=list)
    exit_written: set[int] = field(default_factory=set)

    def take(self, effects: list[Effect]) -> None:
        errors = [effect for effect in effects if isinstance(effect, Note) and effect.level == "error"]
        assert errors == [], "a key the tracker could not read (it skips them, so a bug would hide)"
        for data in reports(effects):
            if isinstance(data, cmd.ReportLearnerLost):
                assert self.tracked.healthy, "a loss decided while the store is not healthy"
                assert self.now >= self.reap_from, "a loss decided within a grace"
                assert data.rank not in self.exit_written, "a learner lost after its exit was recorded"
                self.losses.append(data)
            elif isinstance(data, cmd.ReportLearnerExited):
                self.exits.append(data)

    def became_healthy_if(self, was_healthy: bool) -> None:
        if not was_healthy and self.tracked.healthy:
            self.reap_from = max(self.reap_from, self.now + GRACE_S)

    def step(self, step: tuple[object, ...]) -> None:
        was_healthy = self.tracked.healthy
        match step:
            case ("beat", int(rank), int(steps)):
                self.store[learner_key(JOB_ID, rank)] = beat(step=steps)
                self.take(self.tracked.put(learner_key(JOB_ID, rank), beat(step=steps), self.now))
            case ("delete", int(rank)):
                if self.store.pop(learner_key(JOB_ID, rank), None) is not None:
                    self.take(self.tracked.delete(learner_key(JOB_ID, rank), self.now))
            case ("exit", int(rank), int(code)):
                if exit_key(JOB_ID, 1, rank) not in self.store:
                    self.store[exit_key(JOB_ID, 1, rank)] = encode_exit(code)
                    self.exit_written.add(rank)
                    self.take(self.tracked.put(exit_key(JOB_ID, 1, rank), encode_exit(code), self.now))
            case ("wait", float(seconds)):
                self.now += seconds
            case ("tick",):
                self.take(self.tracked.tick(self.now, WALL))
            case ("probe_failed",):
                self.take(self.tracked.probe_failed("slow"))
            case ("probe_answered",):
                self.take(self.tracked.probe_answered(self.now))
            case ("store_lost",):
                self.take(self.tracked.store_lost("broke"))
            case ("resync",):
                self.take(self.tracked.resync(dict(self.store), self.now, revision=1))
        self.became_healthy_if(was_healthy)


_PAST_GRACE = ("wait", 2 * GRACE_S)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(Step, max_size=60))
# losses, which random steps seldom reach (the store is often unhealthy or in its grace): the
# checks on a loss run on these in every session
@example(steps=[("beat", 0, 1), ("beat", 1, 1), _PAST_GRACE, ("delete", 0), ("tick",), ("tick",)])
@example(
    steps=[("beat", 0, 1), _PAST_GRACE, ("delete", 0), ("tick",), ("beat", 0, 2), ("delete", 0), ("tick",)]
)
@example(steps=[("beat", 0, 1), ("exit", 0, 0), _PAST_GRACE, ("delete", 0), ("tick",)])
@example(
    steps=[("beat", 0, 1), _PAST_GRACE, ("store_lost",), ("delete", 0), ("tick",), ("resync",), ("tick",)]
)
def test_losses_wait_for_a_healthy_store_and_its_grace_and_each_learner_is_reported_once(
    steps: list[tuple[object, ...]],
) -> None:
    model = Model(following(running(learners=RANKS)), reap_from=GRACE_S)
    for step in steps:
        model.step(step)

    lost_ranks = [loss.rank for loss in model.losses]
    exited_ranks = [exited.rank for exited in model.exits]
    assert len(lost_ranks) == len(set(lost_ranks)), "a learner lost twice"
    assert len(exited_ranks) == len(set(exited_ranks)), "an exit reported twice"
    assert set(exited_ranks) == model.exit_written, "every exit recorded is reported"


@settings(max_examples=100, deadline=None)
@given(waits=st.lists(st.floats(0, PROGRESS_TIMEOUT_S / 2), min_size=1, max_size=40))
def test_a_learner_that_beats_with_progress_is_never_lost(waits: list[float]) -> None:
    tracked = following(running())
    now = AFTER_GRACE
    for step, wait in enumerate(waits):
        effects = tracked.put(learner_key(JOB_ID, 0), beat(step=step), now)
        now += wait
        effects += tracked.tick(now, WALL + timedelta(seconds=now))
        assert losses(effects) == []


def test_a_quiet_rank_whose_gang_progresses_is_not_hung() -> None:
    """Only rank 0 logs, as is normal practice: rank 1's beat never changes after it started."""
    tracked = following(running(learners=2))
    tracked.put(learner_key(JOB_ID, 1), beat(step=0), AFTER_GRACE)
    for second in range(0, 3 * int(PROGRESS_TIMEOUT_S), 5):
        tracked.put(learner_key(JOB_ID, 0), beat(step=second), AFTER_GRACE + second)
        assert losses(tracked.tick(AFTER_GRACE + second + 1, WALL)) == []


def test_a_gang_stuck_behind_one_stopped_rank_is_hung_once_naming_the_rank_quiet_the_longest() -> None:
    tracked = following(running(learners=3))
    for rank in range(3):
        tracked.put(learner_key(JOB_ID, rank), beat(step=10), AFTER_GRACE)
    tracked.put(learner_key(JOB_ID, 0), beat(step=11), AFTER_GRACE + 2)
    tracked.put(learner_key(JOB_ID, 2), beat(step=11), AFTER_GRACE + 3)  # rank 1 stopped before step 11

    assert losses(tracked.tick(AFTER_GRACE + 3 + PROGRESS_TIMEOUT_S, WALL)) == []
    [hung] = losses(tracked.tick(AFTER_GRACE + 3 + PROGRESS_TIMEOUT_S + 0.1, WALL))
    assert (hung.rank, hung.reason) == (1, LossReason.HUNG)
    assert hung.detail == "the gang made no progress for 30s (rank 1 at step 10)"
    assert losses(tracked.tick(AFTER_GRACE + 10 * PROGRESS_TIMEOUT_S, WALL)) == []  # one report


def test_a_new_checkpoint_is_progress() -> None:
    tracked = following(running())
    key = learner_key(JOB_ID, 0)
    tracked.put(key, beat(step=5), AFTER_GRACE)
    checkpoint = {"step": 5, "uri": "file:///ckpt/5.pt"}
    tracked.put(key, beat(step=5, checkpoint=checkpoint), AFTER_GRACE + 20)
    assert losses(tracked.tick(AFTER_GRACE + PROGRESS_TIMEOUT_S + 5, WALL)) == []


def test_a_learner_left_alone_by_its_exited_peers_is_still_watched_from_when_they_finished() -> None:
    """Rank 0 trains and logs, rank 1 is silent: when rank 0 finishes, rank 1 (still tearing down)
    has the timeout from then to finish too, and is hung only after it."""
    tracked = following(running(learners=2))
    tracked.put(learner_key(JOB_ID, 0), beat(step=3), AFTER_GRACE)
    tracked.put(learner_key(JOB_ID, 1), beat(step=0), AFTER_GRACE)
    finished = AFTER_GRACE + 2 * PROGRESS_TIMEOUT_S
    tracked.put(learner_key(JOB_ID, 0), beat(step=4), finished - 1)
    tracked.put(exit_key(JOB_ID, 1, 0), encode_exit(0), finished)
    assert losses(tracked.tick(finished + PROGRESS_TIMEOUT_S, WALL)) == []
    [hung] = losses(tracked.tick(finished + PROGRESS_TIMEOUT_S + 0.1, WALL))
    assert hung.rank == 1


@settings(max_examples=60, deadline=None)
@given(
    learners=st.integers(min_value=1, max_value=4),
    progress=st.lists(
        st.tuples(st.floats(min_value=0, max_value=200), st.integers(min_value=0, max_value=3)), max_size=30
    ),
    ticks=st.lists(st.floats(min_value=0, max_value=300), min_size=1, max_size=20),
)
def test_the_gang_is_hung_exactly_when_no_rank_progressed_for_the_timeout(
    learners: int, progress: list[tuple[float, int]], ticks: list[float]
) -> None:
    """Every learner beats at the start; later beats of any rank are progress (a new step each).
    Whatever the interleaving, a hang is reported at the first tick that finds the gang's last
    progress more than the timeout ago, and never before."""
    tracked = following(running(learners=learners))
    steps = dict.fromkeys(range(learners), 0)
    for rank in range(learners):
        tracked.put(learner_key(JOB_ID, rank), beat(step=0), AFTER_GRACE)
    inputs = sorted(
        [(AFTER_GRACE + at, "beat", rank % learners) for at, rank in progress]
        + [(AFTER_GRACE + at, "tick", -1) for at in ticks]
    )
    last_progress = AFTER_GRACE
    reported = False
    for at, kind, rank in inputs:
        if kind == "beat":
            if reported:
                continue
            steps[rank] += 1
            tracked.put(learner_key(JOB_ID, rank), beat(step=steps[rank]), at)
            last_progress = at
            continue
        found = losses(tracked.tick(at, WALL))
        expected = not reported and at - last_progress > PROGRESS_TIMEOUT_S
        assert bool(found) == expected, (at, last_progress)
        reported = reported or expected
