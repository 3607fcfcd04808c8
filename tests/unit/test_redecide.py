"""``ffdl verify --redecide``: a recorded log decided again by today's deciders, as an operator runs it.

The logs are the golden logs (``tests/golden``), as recorded (with how each command was decided) and
as ``ffdl export --commands`` would have written them from the bus (each command with its position
only, so how it was decided is read off the events it caused). A clean log passes; a log with one
event changed, an event too many, or a decider changed through a parameter fails at the first
decision that differs, with the recorded and the re-decided events and their diff.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from ffdl.adapters.bus import open_bus
from ffdl.adapters.bus.partitioning import partition_for
from ffdl.cli.main import app
from ffdl.core.restart import RestartPolicy
from ffdl.events import job_commands as cmd
from ffdl.events.codec import command_to_json
from ffdl.events.envelope import Command
from ffdl.events.model import JobSpec
from ffdl.handlers.messaging import PRINCIPAL_HEADER
from ffdl.handlers.ports import OutgoingRecord
from ffdl.tools.log_files import read_log
from ffdl.tools.redecide import (
    DECISION_CHANGES,
    PRINCIPALS,
    RecordedCommand,
    command_line,
    commands_beside,
    read_commands,
    redecide,
)
from tests.golden.record import GOLDEN_DIR, SCENARIOS, START

GOLDEN = sorted(path.name.removesuffix(".case.json") for path in GOLDEN_DIR.glob("*.case.json"))
PARTITIONS = 8


def copy_log(name: str, to: Path) -> Path:
    """The golden log ``name`` copied to ``to`` as NAME.events.jsonl and NAME.commands.jsonl."""
    events = to / f"{name}.events.jsonl"
    events.write_text((GOLDEN_DIR / f"{name}.events.jsonl").read_text())
    commands_beside(events).write_text((GOLDEN_DIR / f"{name}.commands.jsonl").read_text())
    return events


def as_exported(commands: list[RecordedCommand]) -> list[str]:
    """The commands as ``ffdl export --commands`` writes them: partition after partition in offset
    order, each with its position and (a log recorded with principals) its principal, and nothing of
    how its owner decided it."""
    by_partition: dict[int, list[RecordedCommand]] = {}
    for item in commands:
        by_partition.setdefault(partition_for(item.command.key, PARTITIONS), []).append(item)
    return [
        command_line(
            item.command,
            topic="ffdl.commands",
            position=f"{partition}:{offset}",
            **({"principal": str(item.principal)} if item.principal else {}),
        )
        for partition in sorted(by_partition)
        for offset, item in enumerate(by_partition[partition])
    ]


def exported_log(name: str, to: Path, extra: list[str] | None = None) -> Path:
    """The golden log ``name`` as exported from the bus; ``extra``: command lines appended."""
    events = copy_log(name, to)
    lines = as_exported(list(read_commands(commands_beside(events)))) + (extra or [])
    commands_beside(events).write_text("".join(f"{line}\n" for line in lines))
    return events


def verify(*args: str) -> Result:
    return CliRunner().invoke(app, ["verify", "--redecide", *args])


def report_of(result: Result) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def rewrite_event(events: Path, seq: int, change: Any) -> None:
    """Change the recorded event of seq ``seq`` in place: ``change(line) -> line``."""
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    lines = [change(line) if line["seq"] == seq else line for line in lines]
    events.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))


def test_a_clean_log_passes_and_says_what_it_re_decided(tmp_path: Path) -> None:
    events = copy_log("happy_path_principals", tmp_path)

    result = verify(str(events))
    report = report_of(verify(str(events), "--json"))

    assert result.exit_code == 0, result.output
    assert "46 commands re-decided against 48 events: 46 as recorded" in result.stdout
    assert "0 divergence(s)" in result.stdout
    assert report["divergences"] == 0 and report["first_divergence"] is None
    assert (report["commands"], report["matched"], report["known_changes"]) == (46, 46, {})
    assert report["restart_policy"] == {"base_s": 1.0, "factor": 2.0, "max_backoff_s": 60.0}


def test_a_log_of_the_older_release_passes_through_the_known_change_and_only_through_it(
    tmp_path: Path,
) -> None:
    events = copy_log("node_drain", tmp_path)

    report = report_of(verify(str(events), "--json"))
    without = redecide(
        read_commands(commands_beside(events)), read_log(events), RestartPolicy(), changes=(PRINCIPALS,)
    )

    assert report["known_changes"] == {"launch-in-allocation": 2} and report["divergences"] == 0
    assert [d.recorded_command.command.type for d in without.divergences] == ["AllocateGpus"] * 2
    assert '+    "type": "JobLaunching"' in without.divergences[0].diff()


def test_what_todays_gate_refuses_in_a_log_recorded_before_principals_is_the_known_change_principals(
    tmp_path: Path,
) -> None:
    """The reactor admitted jobs then, and jobs were placed on nodes the log never had: today's owner
    refuses both, and a command recorded without a principal is decided again without the gate."""
    events = copy_log("happy_path_direct_launch", tmp_path)

    report = report_of(verify(str(events), "--json"))
    without = redecide(
        read_commands(commands_beside(events)),
        read_log(events),
        RestartPolicy(),
        changes=DECISION_CHANGES[:1],
    )

    assert report["known_changes"] == {"principals": 2} and report["divergences"] == 0
    assert [
        (d.recorded_command.command.type, [e.data.reason for e in d.redecided]) for d in without.divergences
    ] == [
        ("AdmitJob", ["platform:reactor may not send AdmitJob: only the scheduler may"]),
        ("AllocateGpus", ["node gpu-node-01 is not in the inventory"]),
    ]


def test_a_command_recorded_with_its_principal_is_decided_for_it_and_never_without_the_gate(
    tmp_path: Path,
) -> None:
    """A log of today's owner names each command's principal: the refusals of the hostile senders re-decide
    as recorded, and sent for another principal the same command decides otherwise, a divergence."""
    events = copy_log("forged_commands_halts_v3", tmp_path)
    lines = [json.loads(line) for line in commands_beside(events).read_text().splitlines()]

    clean = report_of(verify(str(events), "--json"))
    forged = next(
        i
        for i, line in enumerate(lines)
        if line["principal"] == "tenant:acme" and line["type"] == "AllocateGpus"
    )
    lines[forged]["principal"] = "scheduler"
    commands_beside(events).write_text("".join(json.dumps(line) + "\n" for line in lines))
    changed = report_of(verify(str(events), "--json"))

    assert (clean["divergences"], clean["known_changes"], clean["matched"]) == (0, {}, clean["commands"])
    first = changed["first_divergence"]
    assert changed["divergences"] >= 1 and first["command"]["type"] == "AllocateGpus"
    assert [e["data"]["reason"] for e in first["recorded"]] == [
        "tenant:acme may not send AllocateGpus: only the scheduler may"
    ]


def test_one_tampered_event_is_the_first_divergence_with_the_command_its_position_and_a_diff(
    tmp_path: Path,
) -> None:
    events = exported_log("restart_after_kill_direct_launch", tmp_path)
    restarting = next(e.event for e in read_log(events) if e.event.type == "JobRestarting")

    def slower(line: dict[str, Any]) -> dict[str, Any]:
        return {**line, "data": {**line["data"], "backoff_s": 8.0}}

    rewrite_event(events, restarting.seq, slower)
    result = verify(str(events))
    report = report_of(verify(str(events), "--json"))

    assert result.exit_code == 1
    first = report["first_divergence"]
    assert report["divergences"] == 1 and first["kind"] == "decision"
    assert first["command"]["type"] == "ReportLearnerExited"
    assert first["command"]["command_id"] == str(restarting.causation_id)
    assert first["position"] == f"{partition_for(restarting.job_id, PARTITIONS)}:{first['line'] - 1}"
    assert [e["type"] for e in first["recorded"]] == [e["type"] for e in first["redecided"]]
    assert (first["recorded"][-1]["data"]["backoff_s"], first["redecided"][-1]["data"]["backoff_s"]) == (
        8.0,
        1.0,
    )
    assert '-      "backoff_s": 8.0,' in first["diff"] and '+      "backoff_s": 1.0,' in first["diff"]
    assert first["decided_at"] == restarting.occurred_at.isoformat() and first["decided_by"] == "owner@ffdl-0"
    assert "first divergence: commands line" in result.stdout and "ReportLearnerExited" in result.stdout
    assert '+      "backoff_s": 1.0,' in result.stdout


def test_a_decider_changed_through_a_parameter_diverges_at_its_first_changed_decision() -> None:
    name = "max_restarts_failure_direct_launch"
    commands = list(read_commands(GOLDEN_DIR / f"{name}.commands.jsonl"))
    events = list(read_log(GOLDEN_DIR / f"{name}.events.jsonl"))

    found = redecide(commands, events, RestartPolicy(base_s=0.5, factor=4.0, max_backoff_s=30.0))

    assert len(found.divergences) == 1, "the first restart waits base_s either way; the second does not"
    assert found.divergences[0].redecided[-1].type == "JobRestarting"


@pytest.mark.parametrize("name", GOLDEN)
def test_every_golden_log_as_exported_from_a_bus_re_decides_from_what_its_events_tell(
    name: str, tmp_path: Path
) -> None:
    """Without the recorded clock, owner and leader token: the events tell them, including a deposed
    scheduler's refused command (whose leader the log does not name)."""
    events = exported_log(name, tmp_path)
    policy = RestartPolicy(**json.loads((GOLDEN_DIR / f"{name}.case.json").read_text())["restart_policy"])

    found = redecide(read_commands(commands_beside(events)), read_log(events), policy)

    assert not found.diverged, [divergence.headline() for divergence in found.divergences]
    assert (found.undecided, found.history, found.skipped) == ([], 0, 0)
    assert found.matched + sum(found.changes.values()) == found.commands
    assert not found.changes or name not in SCENARIOS


def a_command(job_id: str, data: cmd.CommandData, number: int) -> Command:
    return Command(
        command_id=f"00000000-0000-4000-8000-{number:012d}",
        job_id=job_id,
        tenant="acme",
        issued_at=START,
        producer="api@ffdl-0",
        data=data,
    )


def test_a_command_after_the_last_decided_one_of_its_partition_may_not_be_decided_yet(tmp_path: Path) -> None:
    """Deleting the completed job would decide ``JobDeleted``; at the end of the export that says only
    that the owner had not read it yet, but before a command that was decided it is a divergence."""
    job = "mnist-7f3a"
    partition = partition_for(job, PARTITIONS)
    pending = a_command(job, cmd.DeleteJob(), 1)
    tail = command_line(pending, topic="ffdl.commands", position=f"{partition}:999")
    events = exported_log("happy_path_direct_launch", tmp_path, [tail])

    at_the_end = report_of(verify(str(events), "--json"))
    lines = commands_beside(events).read_text().splitlines()
    commands_beside(events).write_text("\n".join([lines[0], tail, *lines[1:-1]]) + "\n")
    in_the_middle = report_of(verify(str(events), "--json"))

    assert at_the_end["divergences"] == 0 and len(at_the_end["undecided"]) == 1
    assert at_the_end["undecided"][0].endswith(f"(position {partition}:999)")
    assert in_the_middle["divergences"] == 1 and in_the_middle["undecided"] == []
    assert in_the_middle["first_divergence"]["command"]["type"] == "DeleteJob"


def test_events_of_commands_the_export_no_longer_holds_are_the_state_the_rest_start_from(
    tmp_path: Path,
) -> None:
    """A commands topic keeps less than the events topic: the oldest commands are gone."""
    events = exported_log("happy_path_direct_launch", tmp_path)
    lines = commands_beside(events).read_text().splitlines()
    commands_beside(events).write_text("".join(f"{line}\n" for line in lines[3:]))

    report = report_of(verify(str(events), "--json"))

    assert report["divergences"] == 0 and report["history_without_commands"] == 3 + 1


def test_an_event_that_no_decision_of_its_command_accounts_for_is_a_divergence(tmp_path: Path) -> None:
    events = copy_log("cancel_direct_launch", tmp_path)
    recorded = list(read_log(events))
    last = recorded[-1]
    submitted = recorded[0].event
    stray = json.loads(events.read_text().splitlines()[-1])
    stray.update(
        seq=last.event.seq + 1,
        type="JobDeleted",
        data={"requested_by": "api@ffdl-0"},
        causation_id=str(submitted.causation_id),
        event_id="00000000-0000-4000-8000-000000000001",
        position=f"{last.partition}:{last.offset + 1}",
    )
    with events.open("a") as out:
        out.write(json.dumps(stray, sort_keys=True) + "\n")

    result = verify(str(events), "--json")

    assert result.exit_code == 1
    first = report_of(result)["first_divergence"]
    assert first["kind"] == "stray-event" and first["position"] == stray["position"]
    assert f"caused by command {submitted.causation_id}" in first["summary"]


def test_redecide_needs_a_log_file_named_for_its_commands(tmp_path: Path) -> None:
    unnamed = tmp_path / "log.jsonl"
    unnamed.write_text("")

    assert verify().exit_code == 2
    refused = verify(str(unnamed))
    assert refused.exit_code == 2 and "NAME.events.jsonl" in refused.output


def test_export_of_the_commands_refuses_a_filter_and_stdout(tmp_path: Path) -> None:
    env = {"FFDL_DATA_DIR": str(tmp_path)}
    runner = CliRunner()

    filtered = runner.invoke(app, ["export", "--commands", "--job", "x", "-o", "x.events.jsonl"], env=env)
    to_stdout = runner.invoke(app, ["export", "--commands", "-o", "-"], env=env)

    assert filtered.exit_code == 2 and "exports the whole log" in filtered.output
    assert to_stdout.exit_code == 2 and "NAME.events.jsonl" in to_stdout.output


def test_an_export_of_the_commands_leaves_out_what_the_owner_dead_letters_and_says_where(
    tmp_path: Path,
) -> None:
    """Each line names the principal the owner decides the command for: its header's, or, for an older
    producer's record without one, the one the owner derives from the producer."""
    submit = a_command("job-a", cmd.SubmitJob(spec=JobSpec(name="a", command="train")), 1)
    stray = a_command("job-b", cmd.CancelJob(), 2)
    cancel = a_command("job-a", cmd.CancelJob(), 3)
    garbled = a_command("job-a", cmd.ResumeJob(), 4)

    async def publish() -> None:
        bus = open_bus(f"embedded://{tmp_path}", PARTITIONS)
        await bus.start()
        await bus.publish(
            "ffdl.commands",
            [
                OutgoingRecord("job-a", command_to_json(submit)),
                OutgoingRecord("job-a", b"{not json"),
                OutgoingRecord("job-a", command_to_json(stray)),
                OutgoingRecord("job-a", command_to_json(cancel), ((PRINCIPAL_HEADER, b"admin:ops"),)),
                OutgoingRecord("job-a", command_to_json(garbled), ((PRINCIPAL_HEADER, b"root"),)),
            ],
        )
        await bus.close()

    asyncio.run(publish())
    events = tmp_path / "out.events.jsonl"
    result = CliRunner().invoke(
        app, ["export", "--commands", "-o", str(events), "--json"], env={"FFDL_DATA_DIR": str(tmp_path)}
    )

    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)["commands"]
    where = partition_for("job-a", PARTITIONS)
    assert (exported["written"], exported["path"]) == (2, str(commands_beside(events)))
    assert [(d["position"], d["key"]) for d in exported["dead_lettered"]] == [
        (f"{where}:1", "job-a"),
        (f"{where}:2", "job-a"),
        (f"{where}:4", "job-a"),
    ]
    assert "is not the command's key 'job-b'" in exported["dead_lettered"][1]["reason"]
    assert "'root' names no kind of principal" in exported["dead_lettered"][2]["reason"]
    lines = [json.loads(line) for line in commands_beside(events).read_text().splitlines()]
    assert lines == [
        {
            **json.loads(command_to_json(submit)),
            "position": f"{where}:0",
            "topic": "ffdl.commands",
            "principal": "tenant:acme",
        },
        {
            **json.loads(command_to_json(cancel)),
            "position": f"{where}:3",
            "topic": "ffdl.commands",
            "principal": "admin:ops",
        },
    ]


def test_a_schedulers_command_refused_while_no_scheduler_led_re_decides_to_the_same_refusal(
    tmp_path: Path,
) -> None:
    """Found by the nemesis: etcd paused past the leader's lease, the owner read no leader and refused
    the leader's admission ('no scheduler leads'); the log does not say that none led, so the
    refusal is tried that way too, not only as the sender's or another's leadership."""
    job = "nem-26-99cf0bba"
    spec = {"name": "nem-26", "command": "true", "learners": 1, "gpus": 1}
    submit = {
        "command_id": "f142318c-28d7-4c43-9e09-a9759dc13ba9",
        "correlation_id": None,
        "data": {"spec": spec},
        "fencing_token": None,
        "issued_at": "2026-12-04T16:58:57.870874Z",
        "job_id": job,
        "position": "0:128",
        "principal": "tenant:acme",
        "producer": "api@vm-7639",
        "schema_version": 1,
        "tenant": "acme",
        "topic": "ffdl.commands",
        "type": "SubmitJob",
    }
    admit = {
        **submit,
        "command_id": "30b53d87-76ee-49bf-8442-6cff96987c82",
        "data": {},
        "fencing_token": 263,
        "issued_at": "2026-12-04T16:58:58.182032Z",
        "position": "0:129",
        "principal": "scheduler",
        "producer": "scheduler@vm-7637",
        "type": "AdmitJob",
    }
    submitted = {
        "causation_id": submit["command_id"],
        "correlation_id": submit["command_id"],
        "data": {"spec": spec, "submitted_by": "api@vm-7639"},
        "event_id": "27affab7-516d-56ec-abbc-a3c26e427685",
        "fencing_token": None,
        "job_id": job,
        "occurred_at": "2026-12-04T16:58:58.176355Z",
        "position": "0:151",
        "producer": "owner@vm-7634",
        "schema_version": 1,
        "seq": 1,
        "tenant": "acme",
        "topic": "ffdl.events",
        "type": "JobSubmitted",
    }
    refused = {
        **submitted,
        "causation_id": admit["command_id"],
        "correlation_id": admit["command_id"],
        "data": {
            "command_id": admit["command_id"],
            "command_type": "AdmitJob",
            "reason": "fencing token 263 cannot be the leader's: no scheduler leads",
        },
        "event_id": "1c98aad4-154c-592f-b54e-bf12a543e765",
        "occurred_at": "2026-12-04T16:59:01.495138Z",
        "position": "0:152",
        "seq": 2,
        "type": "CommandRejected",
    }
    events = tmp_path / "outage.events.jsonl"
    events.write_text("".join(json.dumps(line) + "\n" for line in (submitted, refused)))
    commands_beside(events).write_text("".join(json.dumps(line) + "\n" for line in (submit, admit)))

    found = redecide(read_commands(commands_beside(events)), read_log(events), RestartPolicy())

    assert not found.diverged, [divergence.headline() for divergence in found.divergences]
    assert found.matched == 2
