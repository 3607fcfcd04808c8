"""Golden logs replayed by today's decider: a change that would decide an old log differently fails here.

Each golden log under ``tests/golden`` is a recorded history (see ``tests/golden/record.py``): the
commands the jobs' owner decided and the events it appended. Replaying one decides every recorded
command again, on the job folded from the recorded events before it, with the recorded clock, owner
and leader token, and demands exactly the events the log holds after it (a redelivered command must
decide nothing again). Events of old schema versions go through their upcasters on the way in.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.log_files import read_log
from ffdl.core.decider import decide
from ffdl.core.invariants import check
from ffdl.core.job import Job, evolve
from ffdl.core.restart import RestartPolicy
from ffdl.events.codec import event_to_dict
from ffdl.events.envelope import Event
from tests.golden.record import GOLDEN_DIR, DecidedCommand, job_summary

GOLDEN = sorted(path.name.removesuffix(".case.json") for path in GOLDEN_DIR.glob("*.case.json"))


@dataclass(frozen=True, slots=True)
class GoldenLog:
    name: str
    commands: list[DecidedCommand]
    events: list[Event]
    case: dict[str, Any]

    @classmethod
    def load(cls, name: str) -> GoldenLog:
        commands_file = GOLDEN_DIR / f"{name}.commands.jsonl"
        commands = [DecidedCommand.from_line(line) for line in commands_file.read_text().splitlines()]
        events = [logged.event for logged in read_log(GOLDEN_DIR / f"{name}.events.jsonl")]
        case = json.loads((GOLDEN_DIR / f"{name}.case.json").read_text())
        return cls(name, commands, events, case)

    @property
    def policy(self) -> RestartPolicy:
        return RestartPolicy(**self.case["restart_policy"])


def _pretty(events: list[Event]) -> list[str]:
    return json.dumps([event_to_dict(event) for event in events], indent=2, sort_keys=True).splitlines()


def replay(golden: GoldenLog, policy: RestartPolicy) -> tuple[list[str], dict[str, Job]]:
    """Decide every recorded command again; returns one diff per command that decides differently,
    and the jobs folded from the recorded events."""
    recorded: dict[str, list[Event]] = {}
    for event in golden.events:
        recorded.setdefault(event.job_id, []).append(event)
    cursor = dict.fromkeys(recorded, 0)
    jobs: dict[str, Job] = {}
    mismatches = []
    for number, decided in enumerate(golden.commands, start=1):
        command = decided.command
        job_id = command.job_id
        job = jobs.get(job_id)
        decided_now = decide(
            job,
            command,
            decided.decided_at,
            policy=policy,
            producer=decided.decided_by,
            leader_token=decided.leader_token,
        )
        history = recorded.get(job_id, [])
        start = end = cursor.get(job_id, 0)
        while end < len(history) and history[end].causation_id == command.command_id:
            end += 1
        recorded_after = history[start:end]
        if [event_to_dict(e) for e in decided_now] != [event_to_dict(e) for e in recorded_after]:
            diff = difflib.unified_diff(
                _pretty(recorded_after), _pretty(decided_now), "recorded", "decided now", lineterm=""
            )
            where = f"{golden.name}.commands.jsonl line {number}"
            mismatches.append(
                f"{where}: {command.type} {command.command_id} on job {job_id}\n" + "\n".join(diff)
            )
        for event in recorded_after:
            job = evolve(job, event)
        if job is not None:
            jobs[job_id] = job
        cursor[job_id] = end
    for job_id, history in recorded.items():
        for event in history[cursor[job_id] :]:
            mismatches.append(
                f"{golden.name}: event {job_id} seq {event.seq} ({event.type}) was caused by no command"
            )
    return mismatches, jobs


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
    } <= set(GOLDEN)


def test_todays_decider_decides_every_recorded_command_exactly_as_recorded(golden: GoldenLog) -> None:
    mismatches, _ = replay(golden, golden.policy)

    assert not mismatches, "\n\n".join(mismatches)


def test_the_recorded_events_fold_to_the_recorded_job_states(golden: GoldenLog) -> None:
    _, jobs = replay(golden, golden.policy)

    assert {job_id: job_summary(job) for job_id, job in jobs.items()} == golden.case["jobs"]


def test_every_golden_log_keeps_every_invariant(golden: GoldenLog) -> None:
    assert check((event, str(event.seq)) for event in golden.events) == []


def test_a_decider_that_would_decide_differently_fails_with_a_diff_naming_the_command() -> None:
    golden = GoldenLog.load("restart_after_kill")
    slower = RestartPolicy(base_s=4.0)

    mismatches, _ = replay(golden, slower)

    assert len(mismatches) == 1
    assert mismatches[0].startswith("restart_after_kill.commands.jsonl line ")
    assert "ReportLearnerExited" in mismatches[0]
    assert '-      "backoff_s": 1.0,' in mismatches[0]
    assert '+      "backoff_s": 4.0,' in mismatches[0]


def test_a_golden_log_missing_an_event_its_command_caused_fails() -> None:
    golden = GoldenLog.load("cancel")
    cancelled = next(i for i, e in enumerate(golden.events) if e.type == "JobCancelled")
    truncated = GoldenLog(golden.name, golden.commands, golden.events[:cancelled], golden.case)

    mismatches, _ = replay(truncated, golden.policy)

    assert mismatches and "CancelJob" in mismatches[0] and '+    "type": "JobCancelled"' in mismatches[0]


def test_the_v1_golden_log_holds_v1_halts_that_replay_through_their_upcasters() -> None:
    lines = [
        json.loads(line) for line in (GOLDEN_DIR / "halt_resume_v1.events.jsonl").read_text().splitlines()
    ]
    raw_halt = next(line for line in lines if line["type"] == "HaltRequested")
    golden = GoldenLog.load("halt_resume_v1")
    halt = next(event for event in golden.events if event.type == "HaltRequested")
    halt_command = next(d.command for d in golden.commands if d.command.type == "HaltJob")

    assert raw_halt["schema_version"] == 1 and "requeue" not in raw_halt["data"]
    assert halt.schema_version == 2 and halt.data.requeue is False  # type: ignore[attr-defined]
    assert halt_command.schema_version == 2 and halt_command.data.requeue is False  # type: ignore[attr-defined]
    assert golden_file_mentions(
        GOLDEN_DIR / "halt_resume_v1.commands.jsonl", '"type":"HaltJob"', '"schema_version":1'
    )


def golden_file_mentions(path: Path, *fragments: str) -> bool:
    return any(all(fragment in line for fragment in fragments) for line in path.read_text().splitlines())
