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
