"""The invariant checker finds each kind of violation, on the right job at the right position.

Logs are written by hand, event by event, the way a broken owner or a stale scheduler could have
written them; a clean log of two jobs sharing one GPU over time must come out with no violation.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from ffdl.core.invariants import InvariantChecker, Violation, ViolationKind, check
from ffdl.events import types as ev
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import ErrorCode, JobSpec, LearnerPlacement, Placement

AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SPEC = JobSpec(name="mnist", command="python train.py", learners=1, gpus=1)
GPU_0 = Placement(learners=(LearnerPlacement(rank=0, node="node-1", gpus=(0,)),))
GPU_1 = Placement(learners=(LearnerPlacement(rank=0, node="node-1", gpus=(1,)),))


def event(
    job_id: str, seq: int, data: EventData, *, token: int | None = None, event_id: uuid.UUID | None = None
) -> Event:
    return Event(
        event_id=event_id or uuid.uuid5(uuid.NAMESPACE_URL, f"{job_id}/{seq}"),
        job_id=job_id,
        tenant="acme",
        seq=seq,
        occurred_at=AT,
        producer="test",
        fencing_token=token,
        data=data,
    )


def queued(job_id: str) -> list[Event]:
    """Seqs 1..3 of a job waiting for GPUs."""
    return [
        event(job_id, 1, ev.JobSubmitted(spec=SPEC)),
        event(job_id, 2, ev.JobAccepted()),
        event(job_id, 3, ev.JobQueued()),
    ]


def positioned(events: list[Event]) -> list[tuple[Event, str]]:
    return [(e, f"ffdl.events/0@{offset}") for offset, e in enumerate(events)]


def only(violations: list[Violation]) -> Violation:
    assert len(violations) == 1, violations
    return violations[0]


def test_a_clean_log_of_two_jobs_sharing_a_gpu_over_time_has_no_violation() -> None:
    log = [
        *queued("job-a"),
        *queued("job-b"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0), token=1),
        event("job-a", 5, ev.CancelRequested()),
        event("job-a", 6, ev.JobCancelled()),
        event("job-a", 7, ev.GpusReleased(placement=GPU_0)),
        event("job-b", 4, ev.GpusAllocated(placement=GPU_0), token=2),
        event("job-b", 5, ev.HaltRequested()),
        event("job-b", 6, ev.JobHalted()),  # halted jobs may keep their GPUs until the finaliser runs
    ]

    assert check(positioned(log)) == []


def test_a_seq_gap_is_reported_at_the_event_after_the_gap() -> None:
    log = [*queued("job-a")[:2], event("job-a", 4, ev.JobQueued())]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.SEQ_GAP,
        "job-a",
        "ffdl.events/0@2",
    )
    assert "expected seq 3, got 4" in violation.detail


def test_a_redelivered_event_is_a_duplicate_not_a_violation() -> None:
    log = queued("job-a")
    checker = InvariantChecker()
    for e, position in positioned([*log, log[1]]):
        checker.feed(e, position)

    assert checker.finish() == []
    assert checker.duplicates == 1


def test_another_event_with_a_taken_seq_is_a_conflict() -> None:
    log = [
        *queued("job-a"),
        event("job-a", 2, ev.JobRejected(code=ErrorCode.UNSCHEDULABLE, reason="no"), event_id=uuid.uuid4()),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.SEQ_CONFLICT,
        "job-a",
        "ffdl.events/0@3",
    )


@pytest.mark.parametrize(
    ("events", "position"),
    [
        ([event("job-a", 1, ev.JobSubmitted(spec=SPEC)), event("job-a", 2, ev.JobRunning(attempt=1))], 1),
        ([*queued("job-a"), event("job-a", 4, ev.JobCancelled()), event("job-a", 5, ev.JobQueued())], 4),
        ([event("job-a", 1, ev.JobAccepted())], 0),
    ],
    ids=["running-before-launch", "terminal-state-absorbs", "no-submission-first"],
)
def test_an_illegal_transition_is_reported_where_it_happens(events: list[Event], position: int) -> None:
    violation = only(check(positioned(events)))

    assert violation.kind is ViolationKind.ILLEGAL_TRANSITION
    assert (violation.job_id, violation.position) == ("job-a", f"ffdl.events/0@{position}")


def test_a_gpu_held_by_two_jobs_at_once_is_reported_on_the_second_job() -> None:
    log = [
        *queued("job-a"),
        *queued("job-b"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0)),
        event("job-b", 4, ev.GpusAllocated(placement=GPU_0)),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.GPU_DOUBLE_HELD,
        "job-b",
        "ffdl.events/0@7",
    )
    assert "already held by job job-a" in violation.detail


def test_different_gpus_of_one_node_are_not_double_held() -> None:
    log = [
        *queued("job-a"),
        *queued("job-b"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0)),
        event("job-b", 4, ev.GpusAllocated(placement=GPU_1)),
    ]

    assert check(positioned(log)) == []


def test_releasing_gpus_twice_is_reported_on_the_second_release() -> None:
    log = [
        *queued("job-a"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0)),
        event("job-a", 5, ev.JobCancelled()),
        event("job-a", 6, ev.GpusReleased(placement=GPU_0)),
        event("job-a", 7, ev.GpusReleased(placement=GPU_0)),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.DOUBLE_RELEASE,
        "job-a",
        "ffdl.events/0@6",
    )


def test_an_ended_job_still_holding_gpus_at_the_end_is_reported() -> None:
    log = [
        *queued("job-a"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0)),
        event("job-a", 5, ev.JobFailed(code=ErrorCode.LAUNCH_FAILED, reason="launch failed")),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.NOT_RELEASED,
        "job-a",
        "end",
    )
    assert "FAILED" in violation.detail


def test_an_event_with_an_older_fencing_token_is_reported() -> None:
    log = [
        *queued("job-a"),
        event("job-a", 4, ev.GpusAllocated(placement=GPU_0), token=3),
        event("job-a", 5, ev.HaltRequested(), token=2),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.job_id, violation.position) == (
        ViolationKind.STALE_FENCING_TOKEN,
        "job-a",
        "ffdl.events/0@4",
    )
    assert "fencing token 2 after 3" in violation.detail
