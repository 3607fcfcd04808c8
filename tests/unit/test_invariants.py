"""The invariant checker finds each kind of violation, on the right job or node at the right position.

Logs are written by hand, event by event, the way a broken owner or a stale scheduler could have
written them; a clean log of two jobs sharing one GPU over time, or of jobs on a node that is
cordoned and shrinks meanwhile, must come out with no violation.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from ffdl.core.invariants import InvariantChecker, Violation, ViolationKind, check
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Event, EventData, NodeEvent, NodeEventData
from ffdl.events.model import ErrorCode, JobSpec, LearnerPlacement, Placement
from ffdl.events.nodes import NodeSpec

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


def positioned(events: Sequence[AnyEvent]) -> list[tuple[AnyEvent, str]]:
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


# -- nodes: the same rules as jobs, and GPUs only where a node offered them ---------------------------

A100_4 = NodeSpec(gpus=4, gpu_type="a100", cpus=32, memory_mb=131_072)
A100_2 = NodeSpec(gpus=2, gpu_type="a100", cpus=32, memory_mb=131_072)


def node_event(
    node: str, seq: int, data: NodeEventData, *, token: int | None = None, event_id: uuid.UUID | None = None
) -> NodeEvent:
    return NodeEvent(
        event_id=event_id or uuid.uuid5(uuid.NAMESPACE_URL, f"node:{node}/{seq}"),
        node=node,
        seq=seq,
        occurred_at=AT,
        producer="test",
        fencing_token=token,
        data=data,
    )


def on(node: str, *gpus: int, gpu_type: str | None = "a100") -> Placement:
    return Placement(learners=(LearnerPlacement(rank=0, node=node, gpus=gpus, gpu_type=gpu_type),))


def test_a_clean_log_of_a_node_and_jobs_on_it_has_no_violation() -> None:
    log: list[AnyEvent] = [
        node_event("node-1", 1, nd.NodeJoined(spec=A100_4), token=1),
        *queued("job-a"),
        event("job-a", 4, ev.GpusAllocated(placement=on("node-1", 2, 3)), token=1),
        node_event("node-1", 2, nd.NodeCordoned(reason="maintenance", source=nd.CordonSource.OPERATOR)),
        node_event("node-1", 3, nd.NodeResized(spec=A100_2), token=1),  # a GPU failed: the job keeps its own
        node_event(
            "node-1",
            4,
            nd.NodeCommandRejected(command_id="c-1", command_type="ObserveNode", reason="deposed"),
            token=0,
        ),
        node_event("node-1", 5, nd.NodeUncordoned(reason="done")),
    ]

    assert check(positioned(log)) == []


def test_a_nodes_seq_gap_conflict_and_duplicate_are_told_apart() -> None:
    joined = node_event("node-1", 1, nd.NodeJoined(spec=A100_4))
    log: list[AnyEvent] = [
        joined,
        joined,  # redelivered
        node_event("node-1", 1, nd.NodeLost(reason="gone"), event_id=uuid.uuid4()),
        node_event("node-1", 3, nd.NodeLost(reason="gone")),
    ]
    checker = InvariantChecker()
    for e, position in positioned(log):
        checker.feed(e, position)

    found = [(v.kind, v.job_id, v.node, v.position) for v in checker.finish()]

    assert found == [
        (ViolationKind.SEQ_CONFLICT, None, "node-1", "ffdl.events/0@2"),
        (ViolationKind.SEQ_GAP, None, "node-1", "ffdl.events/0@3"),
    ]
    assert checker.duplicates == 1 and set(checker.nodes) == {"node-1"}


@pytest.mark.parametrize(
    ("events", "position"),
    [
        ([node_event("node-1", 1, nd.NodeResized(spec=A100_4))], 0),
        (
            [
                node_event("node-1", 1, nd.NodeJoined(spec=A100_4)),
                node_event("node-1", 2, nd.NodeUncordoned()),
            ],
            1,
        ),
        (
            [
                node_event("node-1", 1, nd.NodeJoined(spec=A100_4)),
                node_event("node-1", 2, nd.NodeRemoved(reason="decommissioned")),
                node_event("node-1", 3, nd.NodeCordoned(reason="x", source=nd.CordonSource.OPERATOR)),
            ],
            2,
        ),
    ],
    ids=["no-join-first", "uncordon-when-not-cordoned", "cordon-a-removed-node"],
)
def test_a_node_event_that_cannot_apply_is_an_illegal_transition(
    events: list[NodeEvent], position: int
) -> None:
    violation = only(check(positioned(events)))

    assert violation.kind is ViolationKind.ILLEGAL_TRANSITION
    assert (violation.job_id, violation.node, violation.position) == (
        None,
        "node-1",
        f"ffdl.events/0@{position}",
    )


def test_a_node_event_with_an_older_fencing_token_is_reported() -> None:
    log: list[AnyEvent] = [
        node_event("node-1", 1, nd.NodeJoined(spec=A100_4), token=3),
        node_event("node-1", 2, nd.NodeLost(reason="not ready"), token=2),
    ]

    violation = only(check(positioned(log)))

    assert (violation.kind, violation.node, violation.position) == (
        ViolationKind.STALE_FENCING_TOKEN,
        "node-1",
        "ffdl.events/0@1",
    )
    assert violation.detail == "fencing token 2 after 3"


def test_fencing_tokens_never_go_backwards_across_the_jobs_and_nodes_of_a_partition() -> None:
    checker = InvariantChecker()
    checker.feed(node_event("node-1", 1, nd.NodeJoined(spec=A100_4), token=7), "0:0", partition=0)
    for offset, e in enumerate(queued("job-a"), start=1):
        checker.feed(e, f"0:{offset}", partition=0)
    checker.feed(event("job-a", 4, ev.GpusAllocated(placement=on("node-1", 0)), token=6), "0:4", partition=0)
    checker.feed(node_event("node-2", 1, nd.NodeJoined(spec=A100_4), token=5), "1:0", partition=1)

    assert [(v.kind, v.job_id, v.position) for v in checker.finish()] == [
        (ViolationKind.STALE_FENCING_TOKEN, "job-a", "0:4")
    ]


def test_a_gpu_its_node_never_offered_is_reported_on_the_allocation() -> None:
    log: list[AnyEvent] = [
        *queued("job-a"),
        *queued("job-b"),
        event(
            "job-a", 4, ev.GpusAllocated(placement=on("node-1", 4, 5))
        ),  # placed before the join, by the clocks
        node_event("node-1", 1, nd.NodeJoined(spec=A100_2)),
        node_event("node-1", 2, nd.NodeResized(spec=A100_4)),
        event("job-b", 4, ev.GpusAllocated(placement=on("node-1", 0, gpu_type="h100"))),
    ]

    found = [(v.kind, v.job_id, v.node, v.position, v.detail) for v in check(positioned(log))]

    assert found == [
        (
            ViolationKind.GPU_NOT_OFFERED,
            "job-a",
            "node-1",
            "ffdl.events/0@6",
            "GPU(s) 4, 5 on node-1, which never offered more than 4",
        ),
        (
            ViolationKind.GPU_NOT_OFFERED,
            "job-b",
            "node-1",
            "ffdl.events/0@9",
            "h100 GPUs on node-1, which only ever offered a100",
        ),
    ]


def test_gpus_are_not_judged_on_a_node_with_no_event_in_the_log() -> None:
    log = [*queued("job-a"), event("job-a", 4, ev.GpusAllocated(placement=on("gpu-node-01", 12)))]

    assert check(positioned(log)) == []
