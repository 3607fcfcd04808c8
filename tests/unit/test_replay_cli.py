"""The SRE commands on log files, as typed: tables or JSON, exit 0/1/2, and a clear reason on error."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from tests.golden.record import GOLDEN_DIR

RESTART = str(GOLDEN_DIR / "restart_after_kill.events.jsonl")


def ffdl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "160"})


def test_replay_prints_the_state_learners_and_a_timeline_with_reasons() -> None:
    result = ffdl("replay", RESTART, "--job", "resnet-2c91", "--until", "40")

    assert result.exit_code == 0, result.output
    assert "at seq 40" in result.stdout and "RUNNING, attempt 2, 1 restart(s)" in result.stdout
    assert "latest checkpoint: step 100" in result.stdout
    assert "learner 1 exited with code -9" in result.stdout and "(ongoing)" in result.stdout


def test_replay_diff_prints_what_changed_between_two_points() -> None:
    result = ffdl("replay", RESTART, "--job", "resnet-2c91", "--diff", "20", "45")

    assert result.exit_code == 0, result.output
    assert "attempt" in result.stdout and "checkpoint added" in result.stdout
    assert "JobRestarting x1" in result.stdout


def test_verify_of_a_clean_log_exits_0_and_says_so(tmp_path: Path) -> None:
    result = ffdl("verify", RESTART, "--json")

    assert result.exit_code == 0
    assert json.loads(result.stdout)["violations"] == []


def test_mistakes_exit_2_with_the_reason_on_stderr(tmp_path: Path) -> None:
    cases = {
        ("replay", RESTART): "say what to replay",
        ("replay", RESTART, "--rebuild", "--until", "3"): "--until and --diff replay a job",
        ("replay", RESTART, "--job", "nope"): "no event of job 'nope'",
        ("replay", RESTART, "--job", "resnet-2c91", "--until", "yesterday"): "not an ISO 8601 time",
        ("replay", str(tmp_path / "missing.jsonl"), "--job", "x"): "No such file",
        ("verify", RESTART, "--bus", "embedded:///nowhere"): "either a LOG file or --bus",
        ("export", "--type", "JobExploded"): "unknown event type(s) JobExploded",
    }
    for args, reason in cases.items():
        result = ffdl(*args)
        assert (result.exit_code, reason in result.stderr) == (2, True), (args, result.output)


def test_a_rebuild_from_a_file_reports_its_counts(tmp_path: Path) -> None:
    out = tmp_path / "projections.sqlite"

    result = ffdl("replay", RESTART, "--rebuild", "--out", str(out), "--json")

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["jobs"], report["states"], report["ignored"]) == (1, {"COMPLETED": 1}, 0)
    assert out.exists()


DRAIN = str(GOLDEN_DIR / "node_drain.events.jsonl")
DRAIN_JOB = "llama-ft-8c1d"


def test_a_rebuild_says_jobs_and_nodes_on_lines_of_their_own(tmp_path: Path) -> None:
    result = ffdl("replay", DRAIN, "--rebuild", "--out", str(tmp_path / "projections.sqlite"))

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("rebuilt ") and "events (0 ignored)" in lines[0]
    jobs, nodes = lines[1], lines[2]
    assert jobs.startswith("jobs: ") and "COMPLETED" in jobs and "READY" not in jobs, lines
    assert nodes.startswith("nodes: ") and "READY" in nodes and "COMPLETED" not in nodes, lines


def test_replay_cluster_at_a_moment_mid_run_shows_the_gpus_then_held_and_later_free() -> None:
    mid_run = ffdl("replay", DRAIN, "--cluster", "--at", "2024-05-01T09:00:30Z", "--json")
    later = ffdl("replay", DRAIN, "--cluster", "--at", "2024-05-01T09:05:00Z", "--json")

    assert mid_run.exit_code == 0 and later.exit_code == 0, mid_run.output + later.output
    then, after = json.loads(mid_run.stdout), json.loads(later.stdout)
    held = {(node["name"], gpu) for node in then["nodes"] for gpu, job in node["allocated"].items()}
    assert held == {("gpu-node-11", "0"), ("gpu-node-11", "1")}, then["nodes"]  # 2 learners x 1 GPU
    assert {job for node in then["nodes"] for job in node["allocated"].values()} == {DRAIN_JOB}
    assert [(job["job_id"], job["state"]) for job in then["jobs"]] == [(DRAIN_JOB, "RUNNING")]
    assert then["previous_event"]["type"] == "CheckpointRecorded"
    assert all(node["allocated"] == {} for node in after["nodes"])
    assert [(job["job_id"], job["state"], job["gpus_held"]) for job in after["jobs"]] == [
        (DRAIN_JOB, "COMPLETED", 0)
    ]


def test_replay_cluster_prints_the_gpu_map_and_where_in_the_log_the_moment_is() -> None:
    result = ffdl("replay", DRAIN, "--cluster", "--at", "2024-05-01T09:00:30Z")

    assert result.exit_code == 0, result.output
    assert "gpu-node-11" in result.stdout and DRAIN_JOB in result.stdout and "RUNNING" in result.stdout
    assert (
        "after 21 of 69 events; the last: CheckpointRecorded of llama-ft-8c1d at 2024-05-01T09:00:27.35"
        in result.stdout
    )
