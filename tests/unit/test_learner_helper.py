"""ffdl.learner: what a training program's reports look like to the agent, and running without ffdl."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ffdl import learner
from tests.report_sink import ReportSink


@pytest.fixture
def report_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReportSink]:
    """The agent's end of the channel, as a sink that keeps every line sent."""
    sink = ReportSink(tmp_path / "report.sock")
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(sink.path))
    yield sink
    learner._disconnect()
    sink.close()


def reports(sink: ReportSink, connections: int = 1) -> list[dict[str, Any]]:
    """What reached the agent's end over this process's connection (closed to flush it) and
    ``connections`` in all."""
    learner._disconnect()
    sink.drain(connections)
    return sink.reports()


def test_progress_is_one_json_line_per_report(report_file: ReportSink) -> None:
    learner.report_progress(1, loss=2.5)
    learner.report_progress(2, loss=1.5, accuracy=0.5)

    lines = reports(report_file)
    assert [(line["type"], line["step"], line["metrics"]) for line in lines] == [
        ("progress", 1, {"loss": 2.5}),
        ("progress", 2, {"loss": 1.5, "accuracy": 0.5}),
    ]
    assert all(isinstance(line["time"], float) for line in lines)


def test_metrics_that_are_not_finite_are_left_out(report_file: ReportSink) -> None:
    learner.report_progress(3, loss=float("nan"), accuracy=0.75, grad=float("inf"))

    assert reports(report_file)[0]["metrics"] == {"accuracy": 0.75}


def test_a_checkpoint_file_is_reported_with_its_size_and_sha256(
    report_file: ReportSink, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "step-20.npz"
    checkpoint.write_bytes(b"weights" * 1000)

    learner.report_checkpoint(checkpoint, 20)

    (line,) = reports(report_file)
    assert line["type"] == "checkpoint"
    assert line["step"] == 20
    assert line["uri"] == f"file://{checkpoint}"
    assert line["size_bytes"] == 7000
    assert line["checksum"] == "sha256:" + hashlib.sha256(b"weights" * 1000).hexdigest()


def test_a_checkpoint_directory_is_summed_and_hashed_by_its_files(
    report_file: ReportSink, tmp_path: Path
) -> None:
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


def test_a_missing_checkpoint_is_an_error(report_file: ReportSink, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        learner.report_checkpoint(tmp_path / "never-written", 1)
    assert reports(report_file, connections=0) == []


def test_outside_the_platform_reports_are_dropped_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FFDL_REPORT_SOCKET", raising=False)
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


def test_a_negative_step_is_refused(report_file: ReportSink) -> None:
    with pytest.raises(ValueError, match="negative"):
        learner.report_progress(-1)


def test_each_process_keeps_its_own_connection(report_file: ReportSink) -> None:
    learner.report_progress(1)
    child = os.fork()
    if child == 0:  # the child's reports go over a connection of its own, never the parent's
        learner.report_progress(2)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    learner.report_progress(3)

    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(line["step"] for line in reports(report_file, connections=2)) == [1, 2, 3]


def test_a_report_the_agent_never_takes_is_dropped_with_a_warning_within_the_send_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that stops reading (its socket buffer full) must not hold the training program."""
    path = tmp_path / "stalled.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    monkeypatch.setenv("FFDL_REPORT_SOCKET", str(path))
    monkeypatch.setattr(learner, "SEND_TIMEOUT_S", 0.2)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    big = {f"m{index}": float(index) for index in range(60)}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(2000):  # far more than a socket buffer holds
                learner.report_progress(step, **big)
                if caught:
                    break
        assert caught and "report dropped" in str(caught[0].message)
    finally:
        learner._disconnect()
        for connection in accepted:
            connection.close()
        server.close()


def test_a_report_after_the_agent_closed_the_connection_goes_over_a_new_one(report_file: ReportSink) -> None:
    learner.report_progress(1)
    report_file.cut()
    report_file.drain(connections=1)  # the agent's end of the first connection is closed

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is dropped
        learner.report_progress(2)
        learner.report_progress(3)

    assert [line["step"] for line in reports(report_file, connections=2)] == [1, 2, 3]
