"""ffdl.learner: what a training program's reports look like to the agent, and running without ffdl."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from ffdl import learner


@pytest.fixture
def report_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "learner.reports.jsonl"
    monkeypatch.setenv("FFDL_REPORT_FILE", str(path))
    return path


def reports(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_progress_is_one_json_line_per_report(report_file: Path) -> None:
    learner.report_progress(1, loss=2.5)
    learner.report_progress(2, loss=1.5, accuracy=0.5)

    lines = reports(report_file)
    assert [(line["type"], line["step"], line["metrics"]) for line in lines] == [
        ("progress", 1, {"loss": 2.5}),
        ("progress", 2, {"loss": 1.5, "accuracy": 0.5}),
    ]
    assert all(isinstance(line["time"], float) for line in lines)


def test_metrics_that_are_not_finite_are_left_out(report_file: Path) -> None:
    learner.report_progress(3, loss=float("nan"), accuracy=0.75, grad=float("inf"))

    assert reports(report_file)[0]["metrics"] == {"accuracy": 0.75}


def test_a_checkpoint_file_is_reported_with_its_size_and_sha256(report_file: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-20.npz"
    checkpoint.write_bytes(b"weights" * 1000)

    learner.report_checkpoint(checkpoint, 20)

    (line,) = reports(report_file)
    assert line["type"] == "checkpoint"
    assert line["step"] == 20
    assert line["uri"] == f"file://{checkpoint}"
    assert line["size_bytes"] == 7000
    assert line["checksum"] == "sha256:" + hashlib.sha256(b"weights" * 1000).hexdigest()


def test_a_checkpoint_directory_is_summed_and_hashed_by_its_files(report_file: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for directory, shard in ((first, b"b"), (second, b"c")):
        (directory / "shards").mkdir(parents=True)
        (directory / "model.bin").write_bytes(b"aaaa")
        (directory / "shards" / "0.bin").write_bytes(shard * 3)

    learner.report_checkpoint(first, 5)
    learner.report_checkpoint(first, 5)
    learner.report_checkpoint(second, 5)

    one, again, two = reports(report_file)
    assert one["size_bytes"] == 7
    assert one["checksum"] == again["checksum"] != two["checksum"]


def test_a_missing_checkpoint_is_an_error(report_file: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        learner.report_checkpoint(tmp_path / "never-written", 1)
    assert not report_file.exists()


def test_outside_the_platform_reports_are_dropped_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FFDL_REPORT_FILE", raising=False)
    monkeypatch.setattr(learner, "_warned_unreported", False)
    monkeypatch.chdir(tmp_path)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner.report_progress(1, loss=1.0)
        learner.report_progress(2, loss=0.5)

    assert [type(warning.message) for warning in caught] == [RuntimeWarning]
    assert list(tmp_path.iterdir()) == []


def test_resume_from_is_none_on_a_fresh_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FFDL_RESUME_FROM", "")
    assert learner.resume_from() is None
    monkeypatch.setenv("FFDL_RESUME_FROM", str(tmp_path / "step-40.npz"))
    assert learner.resume_from() == tmp_path / "step-40.npz"


def test_the_checkpoint_dir_comes_from_the_environment_and_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FFDL_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))

    assert learner.checkpoint_dir() == tmp_path / "checkpoints"
    assert (tmp_path / "checkpoints").is_dir()


def test_a_negative_step_is_refused(report_file: Path) -> None:
    with pytest.raises(ValueError, match="negative"):
        learner.report_progress(-1)
