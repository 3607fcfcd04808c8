"""The SRE tools on a log that holds a node's events beside a job's: replay, verify, rebuild, as typed.

The log (``tests/node_history.py``) is decided by the real job and node deciders: a node joins,
grows, is drained, uncordoned, cordoned by its inventory, refuses an operator's uncordon, is lost
and comes back, while a job runs on it to completion.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from ffdl.core.kinds import JOBS, NODES
from ffdl.projections.store import LoggedEvent, Projection
from ffdl.tools.log_files import read_log, write_log
from ffdl.tools.sre import NotInLogError, Point, rebuild_file, replay, verify_events
from tests.golden.record import EVENTS_TOPIC
from tests.node_history import JOB, NODE, write_node_history


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("logs") / "node-history.jsonl"
    write_node_history(path)
    return path


def ffdl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def node_seq(events: list[LoggedEvent], event_type: str, nth: int = 0) -> int:
    return [e.event.seq for e in events if e.event.type == event_type and e.event.key == f"node:{NODE}"][nth]


def test_replaying_a_node_gives_its_status_spec_cordon_and_reason_at_the_end(history: Path) -> None:
    events = list(read_log(history))

    report = replay(events, NODES, NODE)

    state = report["state"]
    assert (state["status"], state["gpus"], state["cordon"]) == ("READY", 8, None)
    assert state["reason"] == "the inventory no longer cordons it"
    assert report["point"]["status"] == "READY" and report["point"]["seq"] == state["seq"] == 9
    assert report["events"] == {"in_log": 9, "applied": 9} and report["skipped"] == []


def test_replaying_a_node_to_a_seq_or_a_time_gives_its_state_then(history: Path) -> None:
    events = list(read_log(history))
    drained = node_seq(events, "NodeCordoned")
    lost = next(e.event for e in events if e.event.type == "NodeLost")

    at_drain = replay(events, NODES, NODE, Point(seq=drained))
    while_lost = replay(events, NODES, NODE, Point(at=lost.occurred_at + timedelta(milliseconds=500)))

    assert at_drain["state"]["status"] == "DRAINING"
    assert at_drain["state"]["cordon"] == {"reason": "disk failing", "source": "operator", "drain": True}
    assert while_lost["state"]["status"] == "LOST"
    assert while_lost["state"]["cordon"]["source"] == "inventory"  # a lost node keeps its cordon
    assert while_lost["timeline"][-1]["duration_s"] == pytest.approx(0.5)
    with pytest.raises(NotInLogError, match="had not joined yet"):
        replay(events, NODES, NODE, Point(at=events[0].event.occurred_at - timedelta(seconds=1)))
    with pytest.raises(NotInLogError, match=f"no event of node {JOB!r}"):
        replay(events, NODES, JOB)


def test_a_nodes_timeline_gives_each_change_its_event_reason_and_duration(history: Path) -> None:
    events = list(read_log(history))

    timeline = replay(events, NODES, NODE)["timeline"]

    assert [(row["status"], row["event"]) for row in timeline] == [
        ("READY", "NodeJoined"),
        ("READY", "NodeResized"),
        ("DRAINING", "NodeCordoned"),
        ("READY", "NodeUncordoned"),
        ("CORDONED", "NodeCordoned"),
        ("LOST", "NodeLost"),  # the rejected uncordon changed nothing: no row
        ("CORDONED", "NodeJoined"),  # back, still under its inventory's cordon
        ("READY", "NodeUncordoned"),
    ]
    assert [row["spec"]["gpus"] for row in timeline[:2]] == [4, 8]
    assert timeline[1]["reason"] == "seen by the configuration"  # the resize's own reason
    assert timeline[5]["reason"] == "kubelet stopped posting status"
    drained, uncordoned = timeline[2], timeline[3]
    assert drained["left_at"] == uncordoned["entered_at"]
    assert drained["duration_s"] == pytest.approx(1.0) and not drained["ongoing"]
    assert timeline[-1]["ongoing"] and timeline[-1]["duration_s"] == 0.0


def test_a_redelivered_node_event_is_skipped_and_listed(history: Path) -> None:
    events = list(read_log(history))
    joined = next(logged for logged in events if logged.event.type == "NodeJoined")
    again = LoggedEvent(joined.event, joined.partition, 999)

    report = replay([*events, again], NODES, NODE)

    assert report["skipped"] == [
        {"seq": 1, "type": "NodeJoined", "position": again.position, "reason": "duplicate: seq 1 is taken"}
    ]
    assert report["state"]["status"] == "READY"


def test_replaying_a_job_ignores_the_nodes_events(history: Path) -> None:
    events = list(read_log(history))

    report = replay(events, JOBS, JOB)

    assert report["state"]["state"] == "COMPLETED" and report["skipped"] == []
    assert report["events"]["in_log"] == sum(e.event.key == JOB for e in events) < len(events)


def test_verify_holds_jobs_and_nodes_to_every_invariant(history: Path) -> None:
    report = verify_events(read_log(history), "node-history")

    assert report["violations"] == []
    assert (report["jobs"], report["nodes"], report["events"]) == (
        1,
        1,
        len(history.read_text().splitlines()),
    )


def test_a_rebuild_folds_the_nodes_too_and_equals_the_live_projection(history: Path, tmp_path: Path) -> None:
    report = rebuild_file(history, tmp_path / "rebuilt.sqlite")
    live = Projection(tmp_path / "live.sqlite")
    for logged in read_log(history):  # one event per batch, serialised by the store, as the projector does
        live.apply([LoggedEvent(logged.event, logged.partition, logged.offset)])
    live_dump = live.dump()
    live.close()
    rebuilt = Projection(tmp_path / "rebuilt.sqlite")
    try:
        node, rebuilt_dump = rebuilt.node(NODE), rebuilt.dump()
    finally:
        rebuilt.close()

    assert (report["nodes"], report["node_statuses"], report["ignored"]) == (1, {"READY": 1}, 0)
    assert node is not None and (node["status"], node["gpus"]) == ("READY", 8)
    assert rebuilt_dump == live_dump


def test_a_written_log_of_node_events_reads_back_to_the_same_bytes(history: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.jsonl"

    with copy.open("w") as out:
        write_log(read_log(history), out, EVENTS_TOPIC)

    assert copy.read_bytes() == history.read_bytes()


# -- as typed --------------------------------------------------------------------------------------


def test_replay_node_prints_the_state_and_a_timeline(history: Path) -> None:
    result = ffdl("replay", str(history), "--node", NODE, "--until", "5")

    assert result.exit_code == 0, result.output
    assert f"node {NODE} at seq 5" in result.stdout and "CORDONED, 8 x a100 GPU" in result.stdout
    assert "cordon by inventory: unschedulable in the configuration" in result.stdout
    assert f"timeline of node {NODE}" in result.stdout and "(ongoing)" in result.stdout
    assert "disk failing" in result.stdout


def test_replay_node_json_is_the_report(history: Path) -> None:
    result = ffdl("replay", str(history), "--node", NODE, "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(json.dumps(replay(read_log(history), NODES, NODE)))


def test_verify_as_typed_counts_the_nodes(history: Path) -> None:
    result = ffdl("verify", str(history))

    assert result.exit_code == 0, result.output
    assert "1 jobs, 1 nodes, 0 violation(s)" in result.stdout


def test_node_mistakes_exit_2_with_the_reason(history: Path, tmp_path: Path) -> None:
    empty = f"embedded://{tmp_path / 'empty'}"
    cases = {
        ("replay", str(history), "--job", JOB, "--node", NODE): "say what to replay",
        ("replay", str(history), "--node", NODE, "--diff", "1", "2"): "--diff compares two points of a job",
        ("replay", str(history), "--node", "gpu-node-99"): "no event of node 'gpu-node-99'",
        ("export", "--bus", empty, "--node", NODE, "--job", JOB): "a node's events have no job or tenant",
        ("export", "--bus", empty, "--type", "NodeExploded"): "unknown event type(s) NodeExploded",
    }
    for args, reason in cases.items():
        result = ffdl(*args)
        assert (result.exit_code, reason in result.stderr) == (2, True), (args, result.output)


def test_export_accepts_node_event_types(tmp_path: Path) -> None:
    result = ffdl("export", "--bus", f"embedded://{tmp_path / 'empty'}", "--type", "NodeJoined", "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stderr)["written"] == 0


def test_verify_as_typed_names_the_node_of_a_violation(history: Path, tmp_path: Path) -> None:
    lines = history.read_text().splitlines()
    drain = next(i for i, line in enumerate(lines) if '"type":"NodeCordoned"' in line)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:drain] + lines[drain + 1 :]) + "\n")

    table = ffdl("verify", str(damaged))
    report = json.loads(ffdl("verify", str(damaged), "--json").stdout)

    assert table.exit_code == 1 and f"node {NODE}" in table.stdout and "seq-gap" in table.stdout
    first = report["violations"][0]
    assert (first["kind"], first["job_id"], first["node"]) == ("seq-gap", None, NODE)
    after = next(json.loads(line) for line in lines[drain + 1 :] if json.loads(line).get("node") == NODE)
    assert first["position"] == after["position"]
    assert {(v["kind"], v["node"]) for v in report["violations"]} == {("seq-gap", NODE)}  # the rest follow it
