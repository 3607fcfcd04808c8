"""``ffdl replay --job``: a job's state, timeline and changes at any point of a log, from the log alone."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from ffdl.core.kinds import JOBS
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import read_log
from ffdl.tools.sre import NotInLogError, Point, diff_job, replay
from tests.golden.record import GOLDEN_DIR


def golden(name: str) -> list[LoggedEvent]:
    return list(read_log(GOLDEN_DIR / f"{name}.events.jsonl"))


def seq_of(events: list[LoggedEvent], event_type: str, nth: int = 0) -> int:
    return [logged.event.seq for logged in events if logged.event.type == event_type][nth]


def test_point_parses_a_seq_or_an_iso_time() -> None:
    assert Point.parse("42") == Point(seq=42)
    at = Point.parse("2024-05-01T09:00:30Z").at
    assert at is not None and at.isoformat() == "2024-05-01T09:00:30+00:00"
    assert Point.parse("2024-05-01T09:00:30").at == at  # no offset: UTC
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        Point.parse("yesterday")


def test_replay_to_a_seq_gives_the_state_learners_placement_and_checkpoint_then() -> None:
    events = golden("restart_after_kill")
    running_again = seq_of(events, "JobRunning", 1)

    report = replay(events, JOBS, "resnet-2c91", Point(seq=running_again))

    state = report["state"]
    assert report["point"]["seq"] == running_again and report["point"]["state"] == "RUNNING"
    assert (state["state"], state["attempt"], state["restarts"]) == ("RUNNING", 2, 1)
    assert [learner["status"] for learner in state["learners"]] == ["RUNNING", "RUNNING"]
    assert [p["gpus"] for p in state["placement"]] == [[0, 1], [2, 3]]
    assert state["latest_checkpoint"]["step"] == 100
    assert report["events"] == {"in_log": len(events), "applied": running_again}


def test_the_timeline_gives_each_state_its_event_reason_and_duration() -> None:
    events = golden("restart_after_kill")
    restarting = seq_of(events, "JobRestarting")

    timeline = replay(events, JOBS, "resnet-2c91")["timeline"]

    assert [row["state"] for row in timeline] == [
        "SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING", "RUNNING", "RESTARTING", "LAUNCHING", "RUNNING",
        "STORING", "COMPLETED",
    ]  # fmt: skip
    row = next(row for row in timeline if row["state"] == "RESTARTING")
    assert (row["seq"], row["event"], row["reason"]) == (
        restarting,
        "JobRestarting",
        "learner 1 exited with code -9",
    )
    entered = {logged.event.seq: logged.event.occurred_at for logged in events}
    relaunch = timeline[timeline.index(row) + 1]
    assert row["duration_s"] == (entered[relaunch["seq"]] - entered[restarting]).total_seconds() > 0
    assert timeline[-1]["duration_s"] is None and not timeline[-1]["ongoing"]  # terminal: it stays


def test_replay_to_a_time_stops_before_later_events_and_the_last_state_lasts_until_then() -> None:
    events = golden("halt_resume_v1")
    halted = next(logged.event for logged in events if logged.event.type == "JobHalted")
    later = halted.occurred_at + timedelta(minutes=5)  # before the resume, ten minutes later

    report = replay(events, JOBS, "bert-5d10", Point(at=later))

    assert report["state"]["state"] == "HALTED"
    last = report["timeline"][-1]
    assert last["state"] == "HALTED" and last["ongoing"]
    assert last["duration_s"] == pytest.approx(300.0)


def test_a_job_not_in_the_log_or_not_yet_submitted_is_an_error() -> None:
    events = golden("cancel")

    with pytest.raises(NotInLogError, match="no event of job 'nope'"):
        replay(events, JOBS, "nope")
    with pytest.raises(NotInLogError, match="did not exist yet at seq 0"):
        replay(events, JOBS, "gpt-small-9e4b", Point(seq=0))


def test_duplicates_and_conflicts_are_skipped_and_listed_as_readers_skip_them() -> None:
    events = golden("cancel")
    third = events[2]
    duplicate = LoggedEvent(third.event, third.partition, len(events))
    conflict = LoggedEvent(
        third.event.model_copy(update={"event_id": uuid.uuid4()}), third.partition, len(events) + 1
    )

    clean = replay(events, JOBS, "gpt-small-9e4b")
    messy = replay([*events, duplicate, conflict], JOBS, "gpt-small-9e4b")

    assert messy["state"] == clean["state"]
    assert [(s["seq"], s["reason"]) for s in messy["skipped"]] == [
        (3, "duplicate: seq 3 is taken"),
        (3, "conflict: seq 3 is taken"),
    ]


def test_diff_between_two_points_says_what_changed() -> None:
    events = golden("restart_after_kill")
    before, after = seq_of(events, "CheckpointRecorded"), seq_of(events, "JobRunning", 1)

    report = diff_job(events, "resnet-2c91", Point(seq=before), Point(seq=after))

    changes = {change["field"]: (change["before"], change["after"]) for change in report["changes"]}
    assert changes["attempt"] == (1, 2) and changes["restarts"] == (0, 1)
    assert changes["learners[0].pid"][0] != changes["learners[0].pid"][1]
    assert changes["latest_checkpoint.step"] == (50, 100)
    assert "state" not in changes  # RUNNING then, RUNNING again now
    assert [c["step"] for c in report["checkpoints"]["added"]] == [100]
    assert [row["state"] for row in report["transitions"]] == ["RESTARTING", "LAUNCHING", "RUNNING"]
    assert sum(report["events_between"].values()) == after - before
    assert report["events_between"]["JobRestarting"] == 1


def test_diff_shows_a_state_change_and_the_gpus_given_back() -> None:
    events = golden("halt_resume_v1")
    running, released = seq_of(events, "JobRunning"), seq_of(events, "GpusReleased")

    report = diff_job(events, "bert-5d10", Point(seq=running), Point(seq=released))

    changes = {change["field"]: (change["before"], change["after"]) for change in report["changes"]}
    assert changes["state"] == ("RUNNING", "HALTED")
    assert changes["placement[0].node"] == ("gpu-node-03", None)
    assert changes["learners[0].exit_code"] == (None, -15)
