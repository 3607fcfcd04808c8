"""Golden logs replayed by today's deciders: a change that would decide an old log differently fails here.

Each golden log under ``tests/golden`` is a recorded history (see ``tests/golden/record.py``): the
commands the owner decided, jobs' and nodes', and the events it appended. Replaying one decides every
recorded command again, with the job decider on the job or the node decider on the node folded from
the recorded events before it, with the recorded clock, owner and leader token, and demands exactly
the events the log holds after it (a redelivered command must decide nothing again). Events of old
schema versions go through their upcasters on the way in.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ffdl.core.decider import decide
from ffdl.core.invariants import check
from ffdl.core.job import Job, evolve
from ffdl.core.nodes import NodeRecord, decide_node, evolve_node
from ffdl.core.restart import RestartPolicy
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, AnyEvent, event_to_dict
from ffdl.events.envelope import Command, EventData, NodeCommand, NodeEvent, NodeEventData
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import read_log
from tests.golden.record import GOLDEN_DIR, DecidedCommand, job_summary, node_summary, record

P = TypeVar("P", bound=EventData | NodeEventData)

GOLDEN = sorted(path.name.removesuffix(".case.json") for path in GOLDEN_DIR.glob("*.case.json"))


@dataclass(frozen=True, slots=True)
class GoldenLog:
    name: str
    commands: list[DecidedCommand]
    logged: list[LoggedEvent]
    case: dict[str, Any]

    @classmethod
    def load(cls, name: str) -> GoldenLog:
        commands_file = GOLDEN_DIR / f"{name}.commands.jsonl"
        commands = [DecidedCommand.from_line(line) for line in commands_file.read_text().splitlines()]
        logged = list(read_log(GOLDEN_DIR / f"{name}.events.jsonl"))
        case = json.loads((GOLDEN_DIR / f"{name}.case.json").read_text())
        return cls(name, commands, logged, case)

    @property
    def events(self) -> list[AnyEvent]:
        return [logged.event for logged in self.logged]

    @property
    def policy(self) -> RestartPolicy:
        return RestartPolicy(**self.case["restart_policy"])


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay found: one diff per command decided differently (or event caused by none), and
    the jobs and nodes folded from the recorded events."""

    mismatches: list[str]
    jobs: dict[str, Job]
    nodes: dict[str, NodeRecord]


def _pretty(events: list[AnyEvent]) -> list[str]:
    return json.dumps([event_to_dict(event) for event in events], indent=2, sort_keys=True).splitlines()


def _aggregate(item: AnyCommand | AnyEvent) -> str:
    """The job or node a command or event is about, in words."""
    return f"node {item.node}" if isinstance(item, NodeCommand | NodeEvent) else f"job {item.job_id}"


def replay(golden: GoldenLog, policy: RestartPolicy) -> Replayed:
    """Decide every recorded command again, each with its aggregate's decider on the state folded from
    the recorded events before it."""
    recorded: dict[str, list[AnyEvent]] = {}
    for event in golden.events:
        recorded.setdefault(event.key, []).append(event)
    cursor = dict.fromkeys(recorded, 0)
    jobs: dict[str, Job] = {}
    nodes: dict[str, NodeRecord] = {}
    mismatches = []
    for number, decided in enumerate(golden.commands, start=1):
        command = decided.command
        at, producer, leader = decided.decided_at, decided.decided_by, decided.leader_token
        decided_now: list[AnyEvent] = []
        if isinstance(command, Command):
            decided_now += decide(
                jobs.get(command.job_id), command, at, policy=policy, producer=producer, leader_token=leader
            )
        else:
            decided_now += decide_node(
                nodes.get(command.node), command, at, producer=producer, leader_token=leader
            )
        history = recorded.get(command.key, [])
        start = end = cursor.get(command.key, 0)
        while end < len(history) and history[end].causation_id == command.command_id:
            end += 1
        recorded_after = history[start:end]
        if [event_to_dict(e) for e in decided_now] != [event_to_dict(e) for e in recorded_after]:
            diff = difflib.unified_diff(
                _pretty(recorded_after), _pretty(decided_now), "recorded", "decided now", lineterm=""
            )
            where = f"{golden.name}.commands.jsonl line {number}"
            mismatches.append(
                f"{where}: {command.type} {command.command_id} on {_aggregate(command)}\n" + "\n".join(diff)
            )
        for event in recorded_after:
            if isinstance(event, NodeEvent):
                nodes[event.node] = evolve_node(nodes.get(event.node), event)
            else:
                jobs[event.job_id] = evolve(jobs.get(event.job_id), event)
        cursor[command.key] = end
    for key, history in recorded.items():
        for event in history[cursor[key] :]:
            mismatches.append(
                f"{golden.name}: event of {_aggregate(event)} seq {event.seq} ({event.type}) "
                "was caused by no command"
            )
    return Replayed(mismatches, jobs, nodes)


@pytest.fixture(params=GOLDEN)
def golden(request: pytest.FixtureRequest) -> GoldenLog:
    return GoldenLog.load(request.param)


def test_every_recorded_scenario_of_the_issue_has_a_golden_log() -> None:
    assert {
        "happy_path",
        "restart_after_kill",
        "halt_resume_v1",
        "cancel",
        "max_restarts_failure",
        "rejected_commands",
        "preemption",
        "node_drain",
    } <= set(GOLDEN)


def test_todays_deciders_decide_every_recorded_command_exactly_as_recorded(golden: GoldenLog) -> None:
    mismatches = replay(golden, golden.policy).mismatches

    assert not mismatches, "\n\n".join(mismatches)


def test_the_recorded_events_fold_to_the_recorded_job_and_node_states(golden: GoldenLog) -> None:
    replayed = replay(golden, golden.policy)

    assert {job_id: job_summary(job) for job_id, job in replayed.jobs.items()} == golden.case["jobs"]
    # A log recorded before the inventory was on the log has no nodes, and its case pins none.
    nodes = {name: node_summary(node) for name, node in replayed.nodes.items()}
    assert nodes == golden.case.get("nodes", {})


def test_every_golden_log_keeps_every_invariant(golden: GoldenLog) -> None:
    assert check((logged.event, logged.position) for logged in golden.logged) == []


def test_the_recorder_still_tells_every_committed_story_event_for_event(
    golden: GoldenLog, tmp_path: Path
) -> None:
    """The scripts (which the replay benchmark's generated log shares) still send what they sent.

    Only the events and the case are compared: the recorder now checks every fenced command against
    the leader, as ``handlers/owner.py`` does, where it once checked only ``AllocateGpus``, so a
    re-recorded command line may name the leader's token where the committed line has none.
    """
    record(golden.name, tmp_path)

    for suffix in ("events.jsonl", "case.json"):
        committed = (GOLDEN_DIR / f"{golden.name}.{suffix}").read_text()
        assert (tmp_path / f"{golden.name}.{suffix}").read_text() == committed, suffix


def test_a_decider_that_would_decide_differently_fails_with_a_diff_naming_the_command() -> None:
    golden = GoldenLog.load("restart_after_kill")
    slower = RestartPolicy(base_s=4.0)

    mismatches = replay(golden, slower).mismatches

    assert len(mismatches) == 1
    assert mismatches[0].startswith("restart_after_kill.commands.jsonl line ")
    assert "ReportLearnerExited" in mismatches[0]
    assert '-      "backoff_s": 1.0,' in mismatches[0]
    assert '+      "backoff_s": 4.0,' in mismatches[0]


def test_a_golden_log_missing_an_event_its_command_caused_fails() -> None:
    golden = GoldenLog.load("cancel")
    cancelled = next(i for i, e in enumerate(golden.events) if e.type == "JobCancelled")
    truncated = GoldenLog(golden.name, golden.commands, golden.logged[:cancelled], golden.case)

    mismatches = replay(truncated, golden.policy).mismatches

    assert mismatches and "CancelJob" in mismatches[0] and '+    "type": "JobCancelled"' in mismatches[0]


def test_a_node_command_decided_on_another_leaders_token_fails_with_a_diff_naming_it() -> None:
    golden = GoldenLog.load("node_drain")
    deposed = next(
        i for i, d in enumerate(golden.commands) if d.command.fencing_token not in (None, d.leader_token)
    )
    commands = list(golden.commands)
    # As if the owner had still seen the deposed leader's token: its observation would be decided.
    commands[deposed] = replace(commands[deposed], leader_token=commands[deposed].command.fencing_token)

    mismatches = replay(replace(golden, commands=commands), golden.policy).mismatches

    assert len(mismatches) == 1
    assert mismatches[0].startswith(f"node_drain.commands.jsonl line {deposed + 1}: ObserveNode ")
    assert "on node gpu-node-12" in mismatches[0]
    assert '-    "type": "NodeCommandRejected"' in mismatches[0]
    assert '+    "type": "NodeJoined"' in mismatches[0]


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
    assert halted.schema_version == 2 and halt.requeue is False
    assert halt_command.schema_version == 2 and halt_job.requeue is False
    assert golden_file_mentions(
        GOLDEN_DIR / "halt_resume_v1.commands.jsonl", '"type":"HaltJob"', '"schema_version":1'
    )


def payloads(events: Iterable[AnyEvent], kind: type[P]) -> list[tuple[AnyEvent, P]]:
    """Each event whose payload is a ``kind``, with that payload."""
    return [(event, event.data) for event in events if isinstance(event.data, kind)]


def golden_file_mentions(path: Path, *fragments: str) -> bool:
    return any(all(fragment in line for fragment in fragments) for line in path.read_text().splitlines())
