"""Golden logs replayed by today's deciders: a change that would decide an old log differently fails here.

Each golden log under ``tests/golden`` is a recorded history (see ``tests/golden/record.py``): the
commands the owner decided, jobs' and nodes', and the events it appended. The product's re-decider
(``ffdl verify --redecide``, :mod:`ffdl.tools.redecide`) decides every recorded command again, with
the job decider on the job or the node decider on the node folded from the recorded events before it,
with the recorded clock, owner and leader token, and demands exactly the events the log holds after it
(a redelivered command must decide nothing again). Events of old schema versions go through their
upcasters on the way in, and decisions made before a deliberate change of decision through that
change's upcast: the logs written before the owner launched in the allocation's own decision have
each of their allocations upcast so, and the logs written before principals have what today's gate
refuses decided without it, and nothing else.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ffdl.core.authorization import PrincipalKind
from ffdl.core.invariants import check
from ffdl.core.restart import RestartPolicy
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyEvent
from ffdl.events.envelope import Event, EventData, NodeEventData
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import read_log
from ffdl.tools.redecide import RecordedCommand, Redecided, read_commands, redecide
from tests.golden.record import GOLDEN_DIR, SCENARIOS, job_summary, node_summary, record

P = TypeVar("P", bound=EventData | NodeEventData)

GOLDEN = sorted(path.name.removesuffix(".case.json") for path in GOLDEN_DIR.glob("*.case.json"))


@dataclass(frozen=True, slots=True)
class GoldenLog:
    name: str
    commands: list[RecordedCommand]
    logged: list[LoggedEvent]
    case: dict[str, Any]

    @classmethod
    def load(cls, name: str) -> GoldenLog:
        commands = list(read_commands(GOLDEN_DIR / f"{name}.commands.jsonl"))
        logged = list(read_log(GOLDEN_DIR / f"{name}.events.jsonl"))
        case = json.loads((GOLDEN_DIR / f"{name}.case.json").read_text())
        return cls(name, commands, logged, case)

    @property
    def events(self) -> list[AnyEvent]:
        return [logged.event for logged in self.logged]

    @property
    def policy(self) -> RestartPolicy:
        return RestartPolicy(**self.case["restart_policy"])

    def redecide(self, policy: RestartPolicy | None = None) -> Redecided:
        return redecide(self.commands, self.logged, policy or self.policy)


def divergences(found: Redecided) -> list[str]:
    """Each divergence in words, with its diff."""
    return ["\n".join([divergence.headline(), *divergence.diff()]) for divergence in found.divergences] + [
        stray.headline() for stray in found.strays
    ]


@pytest.fixture(params=GOLDEN)
def golden(request: pytest.FixtureRequest) -> GoldenLog:
    return GoldenLog.load(request.param)


WRITTEN_BEFORE_THE_LAUNCH_HOP_WAS_DROPPED = {
    "happy_path",
    "restart_after_kill",
    "halt_resume_v1",
    "cancel",
    "max_restarts_failure",
    "rejected_commands",
    "preemption",
    "node_drain",
}
WRITTEN_BEFORE_PRINCIPALS = (
    WRITTEN_BEFORE_THE_LAUNCH_HOP_WAS_DROPPED
    | {f"{name}_direct_launch" for name in WRITTEN_BEFORE_THE_LAUNCH_HOP_WAS_DROPPED - {"halt_resume_v1"}}
    | {"halt_resume_direct_launch"}
)
#: Today's stories, each by its name.
STORIES = {
    name.removesuffix("_specs_and_reports_v2").removesuffix("_halts_v3").removesuffix("_outsiders")
    for name in SCENARIOS
}
#: The stories with a tenant's command to an aggregate not its own, as told before the owner
#: dead-lettered its refusal instead of recording it there (``outsiders-dead-lettered``).
WRITTEN_BEFORE_OUTSIDERS = {
    f"{story}_specs_and_reports_v2" for story in ("rejected_commands", "forged_commands")
}
#: The stories with a halt, as told before halts said whether a preemption made room for a job of
#: the halted job's own tenant (``HaltJob`` and ``HaltRequested`` v2): through the v3 upcasters.
WRITTEN_BEFORE_HALTS_V3 = {
    *(f"{story}_specs_and_reports_v2" for story in ("halt_resume", "preemption", "node_drain")),
    "rejected_commands_outsiders",
    "forged_commands_outsiders",
}
#: The stories told with principals, with version 1 specs (before launcher, nproc_per_node,
#: keep_checkpoints and stop_grace_s) and unbounded reports (``LearnerProgressed`` v1): they replay
#: through both upcasters, deciding the same.
WRITTEN_BEFORE_SPEC_V2_AND_BOUNDED_REPORTS = {f"{story}_principals" for story in STORIES}
#: The same stories told with bounded reports and version 1 specs: through the spec's upcaster.
WRITTEN_BEFORE_SPEC_V2 = {f"{story}_bounded_reports" for story in STORIES}
#: The same stories told with version 2 specs and unbounded reports: through the reports' upcasters.
WRITTEN_BEFORE_BOUNDED_REPORTS = {f"{story}_spec_v2" for story in STORIES}


def test_every_recorded_scenario_of_the_issue_has_a_golden_log() -> None:
    assert (
        WRITTEN_BEFORE_PRINCIPALS
        | WRITTEN_BEFORE_SPEC_V2_AND_BOUNDED_REPORTS
        | WRITTEN_BEFORE_SPEC_V2
        | WRITTEN_BEFORE_BOUNDED_REPORTS
        | WRITTEN_BEFORE_OUTSIDERS
        | WRITTEN_BEFORE_HALTS_V3
        | SCENARIOS.keys()
    ) == set(GOLDEN)


def test_todays_deciders_decide_every_recorded_command_exactly_as_recorded(golden: GoldenLog) -> None:
    found = golden.redecide()

    assert not found.diverged, "\n\n".join(divergences(found))
    assert (found.commands, found.undecided, found.history, found.skipped) == (len(golden.commands), [], 0, 0)


def refused_by_todays_gate(golden: GoldenLog) -> set[int]:
    """The lines of a log recorded before principals that the owner then accepted and today's owner
    refuses: the reactor's admissions and rejections, the scheduler's commands checked against no
    leader, and placements on nodes the log did not have yet."""
    rejections = (ev.CommandRejected, nd.NodeCommandRejected)
    rejected = {event.causation_id for event in golden.events if isinstance(event.data, rejections)}
    joined: set[str] = set()
    refused = set()
    for item in golden.commands:
        command, decided = item.command, item.decided
        assert decided is not None
        on_unknown_nodes = isinstance(command.data, cmd.AllocateGpus) and bool(
            {learner.node for learner in command.data.placement.learners} - joined
        )
        admission = isinstance(command.data, cmd.AdmitJob | cmd.RejectJob) and command.producer.startswith(
            "reactor@"
        )
        unchecked = command.fencing_token is not None and decided.leader_token is None
        if (admission or unchecked or on_unknown_nodes) and command.command_id not in rejected:
            refused.add(item.line)
        if isinstance(command.data, nd.ObserveNode):
            joined.add(command.key.removeprefix("node:"))
    return refused


def refused_in_an_outsider_s_history(golden: GoldenLog) -> set[int]:
    """The lines of a tenant's command to another tenant's job or to a node whose refusal the log
    records there (today's owner dead-letters it)."""
    rejected = {
        event.causation_id: event.tenant if isinstance(event, Event) else None
        for event in golden.events
        if isinstance(event.data, ev.CommandRejected | nd.NodeCommandRejected)
    }
    return {
        item.line
        for item in golden.commands
        if item.command.command_id in rejected
        and item.sent_for.kind is PrincipalKind.TENANT
        and rejected[item.command.command_id] != item.sent_for.name
    }


def test_only_what_a_later_change_decides_otherwise_decides_otherwise_now(golden: GoldenLog) -> None:
    """A log recorded by today's scripts needs no upcast. An older one needs ``principals`` for each
    command today's gate refuses, ``outsiders-dead-lettered`` for each refusal of a tenant's command
    it recorded in another's history, and, if recorded before the owner launched in the allocation's
    own decision, ``launch-in-allocation`` for each of the others' allocations (``GpusAllocated``
    alone); nothing else."""
    found = golden.redecide()
    if golden.name in SCENARIOS:
        assert (dict(found.changes), found.matched) == ({}, found.commands)
        return
    refused = refused_by_todays_gate(golden)
    allocated = {event.causation_id for event in golden.events if isinstance(event.data, ev.GpusAllocated)}
    relaunched = [
        item for item in golden.commands if item.command.command_id in allocated and item.line not in refused
    ] * (golden.name in WRITTEN_BEFORE_THE_LAUNCH_HOP_WAS_DROPPED)

    outsiders = refused_in_an_outsider_s_history(golden)
    expected = Counter(
        {
            "principals": len(refused),
            "launch-in-allocation": len(relaunched),
            "outsiders-dead-lettered": len(outsiders),
        }
    )
    assert found.changes == +expected
    assert found.matched + len(refused) + len(relaunched) + len(outsiders) == found.commands


def test_the_recorded_events_fold_to_the_recorded_job_and_node_states(golden: GoldenLog) -> None:
    found = golden.redecide()

    assert {job_id: job_summary(job) for job_id, job in found.jobs.items()} == golden.case["jobs"]
    # A log recorded before the inventory was on the log has no nodes, and its case pins none.
    nodes = {name: node_summary(node) for name, node in found.nodes.items()}
    assert nodes == golden.case.get("nodes", {})


def test_every_golden_log_keeps_every_invariant(golden: GoldenLog) -> None:
    assert check((logged.event, logged.position) for logged in golden.logged) == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_recorder_still_tells_every_story_of_today_line_for_line(name: str, tmp_path: Path) -> None:
    """The scripts (which the replay benchmark's generated log shares) still send what they sent.

    The logs of an older platform are not told again: their scripts went with it.
    """
    record(name, tmp_path)

    for suffix in ("commands.jsonl", "events.jsonl", "case.json"):
        committed = (GOLDEN_DIR / f"{name}.{suffix}").read_text()
        assert (tmp_path / f"{name}.{suffix}").read_text() == committed, suffix


def test_a_decider_that_would_decide_differently_fails_with_a_diff_naming_the_command() -> None:
    golden = GoldenLog.load("restart_after_kill_direct_launch")
    slower = RestartPolicy(base_s=4.0)

    found = golden.redecide(slower)

    assert len(found.divergences) == 1 and not found.strays
    [divergence] = found.divergences
    assert divergence.headline().startswith("commands line ")
    assert divergence.recorded_command.command.type == "ReportLearnerExited"
    assert '-      "backoff_s": 1.0,' in divergence.diff()
    assert '+      "backoff_s": 4.0,' in divergence.diff()


def test_a_golden_log_missing_an_event_its_command_caused_fails() -> None:
    golden = GoldenLog.load("cancel_direct_launch")
    cancelled = next(i for i, e in enumerate(golden.events) if e.type == "JobCancelled")
    truncated = replace(golden, logged=golden.logged[:cancelled])

    found = truncated.redecide()

    first = found.divergences[0]
    assert first.recorded_command.command.type == "CancelJob"
    assert '+    "type": "JobCancelled"' in first.diff()


def test_a_node_command_decided_on_another_leaders_token_fails_with_a_diff_naming_it() -> None:
    golden = GoldenLog.load("node_drain_direct_launch")
    deposed = next(
        i
        for i, d in enumerate(golden.commands)
        if d.decided and d.command.fencing_token not in (None, d.decided.leader_token)
    )
    commands = list(golden.commands)
    decided = commands[deposed].decided
    assert decided is not None
    # As if the owner had still seen the deposed leader's token: its observation would be decided.
    as_if = replace(decided, leader_token=commands[deposed].command.fencing_token)
    commands[deposed] = replace(commands[deposed], decided=as_if)

    found = replace(golden, commands=commands).redecide()

    [divergence] = found.divergences
    assert divergence.headline().startswith(f"commands line {deposed + 1}: ObserveNode ")
    assert "on node gpu-node-12" in divergence.headline()
    assert '-    "type": "NodeCommandRejected"' in divergence.diff()
    assert '+    "type": "NodeJoined"' in divergence.diff()


def test_the_node_drain_log_moves_the_job_off_the_drained_node_and_rejects_what_it_must() -> None:
    events = GoldenLog.load("node_drain").events
    [(cordoned, _)] = [(event, data) for event, data in payloads(events, nd.NodeCordoned) if data.drain]
    [(halted, halt)] = payloads(events, ev.HaltRequested)
    placements = [data.placement for _, data in payloads(events, ev.GpusAllocated)]
    launches = [data for _, data in payloads(events, ev.JobLaunching)]
    rejections = [data for _, data in payloads(events, nd.NodeCommandRejected)]

    assert cordoned.key == "node:gpu-node-11" and cordoned.occurred_at < halted.occurred_at
    assert halt.requeue and halted.fencing_token == 8
    assert halt.reason == "node gpu-node-11 is being drained: halted to resume elsewhere from its checkpoint"
    assert [{learner.node for learner in placement.learners} for placement in placements] == [
        {"gpu-node-11"},
        {"gpu-node-12"},
    ]
    assert [
        (launch.attempt, launch.resume_from.step if launch.resume_from else None) for launch in launches
    ] == [
        (1, None),
        (2, 100),
    ]
    assert [(rejection.command_type, rejection.reason) for rejection in rejections] == [
        ("ObserveNode", "fencing token 8 is not the leader's: sender was deposed"),
        (
            "UncordonNode",
            "node gpu-node-12 is cordoned by its inventory (unschedulable in the Kubernetes nodes): "
            "lift it there",
        ),
    ]


def test_the_v1_golden_log_holds_v1_halts_that_replay_through_their_upcasters() -> None:
    lines = [
        json.loads(line) for line in (GOLDEN_DIR / "halt_resume_v1.events.jsonl").read_text().splitlines()
    ]
    raw_halt = next(line for line in lines if line["type"] == "HaltRequested")
    golden = GoldenLog.load("halt_resume_v1")
    [(halted, halt)] = payloads(golden.events, ev.HaltRequested)
    [(halt_command, halt_job)] = [
        (d.command, d.command.data) for d in golden.commands if isinstance(d.command.data, cmd.HaltJob)
    ]

    assert raw_halt["schema_version"] == 1 and "requeue" not in raw_halt["data"]
    assert halted.schema_version == ev.HaltRequested.VERSION
    assert (halt.requeue, halt.for_own_tenant) == (False, False)
    assert halt_command.schema_version == cmd.HaltJob.VERSION
    assert (halt_job.requeue, halt_job.for_own_tenant) == (False, False)
    assert golden_file_mentions(
        GOLDEN_DIR / "halt_resume_v1.commands.jsonl", '"type":"HaltJob"', '"schema_version":1'
    )


def payloads(events: Iterable[AnyEvent], kind: type[P]) -> list[tuple[AnyEvent, P]]:
    """Each event whose payload is a ``kind``, with that payload."""
    return [(event, event.data) for event in events if isinstance(event.data, kind)]


def golden_file_mentions(path: Path, *fragments: str) -> bool:
    return any(all(fragment in line for fragment in fragments) for line in path.read_text().splitlines())
