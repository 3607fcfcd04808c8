"""The report channel's parsing, its bounded reading, its server, and the confinement of checkpoints:
whatever a learner sends is bounded data or dropped with a reason, never an exception of another kind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.adapters.launchers.environment import checkpoint_path, resume_path
from ffdl.events.model import Checkpoint
from ffdl.events.reports import MAX_METRICS, MAX_REPORT_BYTES
from ffdl.learner.channel import (
    BUDGET_SLICE_S,
    CONNECTION_UNITS,
    MAX_CONNECTIONS,
    MAX_DROPS_PER_CONNECTION,
    NOTES_INTERVAL_S,
    NOTES_PER_INTERVAL,
    CheckpointReport,
    Dropped,
    LearnerBudget,
    LearnerNotes,
    ProgressReport,
    Report,
    ReportChannel,
    bounded_lines,
    parse_report,
)


def test_a_progress_report_is_bounded_and_keeps_its_local_rank() -> None:
    line = b'{"type": "progress", "step": 3, "metrics": {"loss": NaN, "acc": 0.5}, "local_rank": 2}'

    report = parse_report(line)

    assert isinstance(report, ProgressReport)
    assert (report.step, report.metrics, report.local_rank) == (3, {"acc": 0.5}, 2)
    assert report.dropped and "not finite" in report.dropped[0]


def test_a_checkpoint_report_is_taken_as_data() -> None:
    line = b'{"type": "checkpoint", "step": 4, "uri": "file:///c/step-4", "size_bytes": 9, "checksum": "x"}'
    assert parse_report(line) == CheckpointReport(4, "file:///c/step-4", 9, "x")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"[" * 5000 + b"]" * 5000, "not JSON"),
        (b'{"type": "progress", "step": -1}', "out of range"),
        (b'{"type": "progress", "step": true}', "not an integer"),
        (b'{"type": "progress", "step": 1, "local_rank": "0"}', "local_rank"),
        (b'{"type": "shell", "step": 1}', "unknown report type"),
        (b'{"type": "checkpoint", "step": 1, "uri": 7}', "uri"),
        (b'{"type": "checkpoint", "step": 1, "uri": "file:///c/x\\udcff"}', "uri: .*unicode"),
        (b'{"type": "checkpoint", "step": 1, "uri": "file:///c/x\\ud800"}', "uri: .*unicode"),
        (b'{"type": "checkpoint", "step": 1, "uri": "file:///' + b"c" * 4096 + b'"}', "uri: .*4096"),
        (b'{"type": "checkpoint", "step": 1, "uri": "file:///c", "size_bytes": -1}', "size_bytes"),
        (b'{"type": "progress", "step": 1, "pad": "' + b"x" * MAX_REPORT_BYTES + b'"}', "over the limit"),
    ],
)
def test_what_is_not_a_report_is_dropped_with_its_reason(line: bytes, reason: str) -> None:
    with pytest.raises(Dropped, match=reason):
        parse_report(line)


@given(
    st.binary(max_size=300)
    | st.dictionaries(st.text(max_size=5), st.floats() | st.integers()).map(
        lambda metrics: json.dumps({"type": "progress", "step": 1, "metrics": metrics}).encode()
    )
)
def test_any_line_is_a_bounded_report_or_dropped(line: bytes) -> None:
    try:
        report = parse_report(line)
    except Dropped:
        return
    if isinstance(report, ProgressReport):
        assert len(report.metrics) <= MAX_METRICS
        assert all(math.isfinite(value) for value in report.metrics.values())


async def lines_of(*chunks: bytes) -> list[bytes | None]:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return [line async for line in bounded_lines(reader)]


async def test_a_line_over_the_limit_is_skipped_as_it_comes_and_the_next_lines_are_read() -> None:
    endless = [b"x" * 50_000 for _ in range(10)]

    lines = await lines_of(b"a\n", *endless, b"tail of the long line\nb\n", b"c")

    assert lines == [b"a", None, b"b", b"c"]


@given(st.text(alphabet="ab/.", max_size=30))
def test_a_checkpoint_path_is_inside_its_directory_or_none(suffix: str) -> None:
    root = "/learners/job/checkpoints"
    path = checkpoint_path(f"file://{root}/{suffix}", root)
    if path is not None:
        assert path.startswith(root + "/") and ".." not in path.split("/")


@pytest.mark.parametrize(
    "uri",
    [
        "file:///tmp/evil-ckpt.pt",
        "file:///learners/job/checkpoints/../../other/checkpoints/x",
        "file:///learners/job/checkpoints",
        "file:///learners/job/checkpoints-evil/x",
        "s3://bucket/x",
        "/learners/job/checkpoints/../other/x",
        "learners/job/checkpoints/x",
    ],
)
def test_no_learner_is_handed_a_checkpoint_outside_its_place(uri: str) -> None:
    checkpoint = Checkpoint(rank=0, attempt=1, step=1, uri=uri)
    assert resume_path(checkpoint, "/learners/job/checkpoints") == ""


@pytest.mark.parametrize(
    "uri", ["file:///learners/job/checkpoints/a/./step-1", "/learners/job/checkpoints/a/step-1"]
)
def test_a_checkpoint_inside_its_place_is_handed_on(uri: str) -> None:
    """A bare absolute path too: the owner records it as the job's checkpoint, so the next attempt
    must start from it (it once started from nothing)."""
    checkpoint = Checkpoint(rank=0, attempt=1, step=1, uri=uri)
    assert resume_path(checkpoint, "/learners/job/checkpoints") == "/learners/job/checkpoints/a/step-1"


class Recorder:
    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.warnings: list[dict[str, Any]] = []
        self.infos: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append({"event": event, **fields})

    def info(self, event: str, **fields: Any) -> None:
        self.infos.append({"event": event, **fields})


async def test_the_channel_takes_reports_and_closes_a_connection_that_sends_only_garbage(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    channel = ReportChannel(tmp_path, recorder.reports.append, LearnerNotes(recorder, time.monotonic))
    await channel.start()
    assert channel.path.stat().st_mode & 0o777 == 0o600

    def send(payload: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            connection.sendall(payload)

    await asyncio.to_thread(
        send, b'{"type": "progress", "step": 1}\nnot json\n{"type": "progress", "step": 2}'
    )
    await asyncio.to_thread(send, b"junk\n" * (MAX_DROPS_PER_CONNECTION + 10))
    await channel.close(drain_s=5.0)

    assert [report.step for report in recorder.reports] == [1, 2]
    events = [warning["event"] for warning in recorder.warnings]
    assert events.count("learner report dropped") == 1 + 20
    assert "report connection closed: too many bad reports" in events
    assert not channel.path.exists()


def test_what_a_learner_makes_its_agent_log_is_bounded_per_interval_and_the_rest_counted() -> None:
    recorder = Recorder()
    now = [0.0]
    notes = LearnerNotes(recorder, lambda: now[0])
    for index in range(NOTES_PER_INTERVAL + 150):
        notes.warning("learner checkpoint refused", index=index)
    assert len(recorder.warnings) == NOTES_PER_INTERVAL

    now[0] += NOTES_INTERVAL_S
    notes.info("report connection broke")
    assert recorder.warnings[-1] == {"event": "learner's notes left out of the log", "left_out": 150}
    assert recorder.infos == [{"event": "report connection broke"}]


async def test_reconnecting_does_not_start_the_log_s_bound_again(tmp_path: Path) -> None:
    recorder = Recorder()
    channel = ReportChannel(tmp_path, recorder.reports.append, LearnerNotes(recorder, time.monotonic))
    await channel.start()

    def send(payload: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            connection.sendall(payload)

    for _ in range(20):
        await asyncio.to_thread(send, b"junk\n" * 30)
    await channel.close(drain_s=5.0)

    assert len(recorder.warnings) + len(recorder.infos) == NOTES_PER_INTERVAL


async def test_a_report_the_agent_refuses_by_raising_is_a_counted_drop_and_the_connection_reads_on(
    tmp_path: Path,
) -> None:
    """Only :class:`Dropped` was caught: anything else the agent raised on a report ended the
    connection's task, a traceback in the platform's log for each connection a learner made."""
    recorder = Recorder()

    def take(report: Report) -> None:
        if report.step == 1:
            raise ValueError("refused")
        recorder.reports.append(report)

    channel = ReportChannel(tmp_path, take, LearnerNotes(recorder, time.monotonic))
    await channel.start()

    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            connection.sendall(b'{"type": "progress", "step": 1}\n{"type": "progress", "step": 2}\n')

    await asyncio.to_thread(send)
    await channel.close(drain_s=5.0)

    assert [report.step for report in recorder.reports] == [2]
    [dropped] = [warning for warning in recorder.warnings if warning["event"] == "learner report dropped"]
    assert dropped["reason"] == "not taken: ValueError('refused')"


def test_the_budget_lasts_its_burst_then_makes_each_spender_wait_its_turn_a_slice_at_a_time() -> None:
    now = [0.0]
    budget = LearnerBudget(100.0, 50.0, lambda: now[0])

    assert budget.spend(50) == 0.0
    assert budget.spend(1) == pytest.approx(BUDGET_SLICE_S + 0.01)
    assert budget.spend(1) == pytest.approx(BUDGET_SLICE_S + 0.02)  # behind the first

    now[0] += 60.0  # idle for a minute: no more than the burst is saved
    assert budget.spend(50) == 0.0
    assert budget.spend(1) > 0.0


async def test_a_flood_of_valid_reports_is_read_at_the_budget_s_rate_and_holds_the_sender(
    tmp_path: Path,
) -> None:
    """The agent runs outside the learner's cgroup: a learner limited to a tenth of a core flooded
    small valid reports, and its agent read and took them all, a whole core. Past its budget the
    channel is not read, so the learner's sends block on the full socket."""
    rate, burst = 200.0, 100.0
    taken: list[Report] = []
    recorder = Recorder()
    budget = LearnerBudget(rate, burst, time.monotonic)
    channel = ReportChannel(tmp_path, taken.append, LearnerNotes(recorder, time.monotonic), budget=budget)
    await channel.start()
    flood = b'{"type": "progress", "step": 1, "metrics": {"a": 1}}\n' * 80_000  # 4 MB
    sent = threading.Event()

    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            with contextlib.suppress(OSError):  # cut off at the channel's close
                connection.sendall(flood)
                sent.set()

    started = time.monotonic()
    sender = asyncio.create_task(asyncio.to_thread(send))
    await asyncio.sleep(1.0)
    elapsed = time.monotonic() - started

    assert not sent.is_set()  # held by the full socket
    assert 0 < len(taken) <= burst + rate * elapsed
    await channel.close(drain_s=0.1)
    await sender


async def test_what_a_learner_sent_before_it_ended_is_all_read_at_close_whatever_the_budget(
    tmp_path: Path,
) -> None:
    """The lines fit the socket's buffer, so the learner was never held, and it exited: the drain
    still read them at the budget's rate, and the checkpoint report it sent last was lost."""
    taken: list[Report] = []
    budget = LearnerBudget(100.0, 100.0, time.monotonic)
    channel = ReportChannel(tmp_path, taken.append, LearnerNotes(Recorder(), time.monotonic), budget=budget)
    await channel.start()
    last = b'{"type": "checkpoint", "step": 9, "uri": "file:///c/step-9"}\n'

    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            connection.sendall(b'{"type": "progress", "step": 1}\n' * 3000 + last)

    await asyncio.to_thread(send)
    await channel.close(drain_s=2.0)

    assert len(taken) == 3001
    assert taken[-1] == CheckpointReport(9, "file:///c/step-9", 0, "")


async def test_a_sender_that_outlives_the_learner_keeps_the_unpaced_drain_no_longer_than_its_time(
    tmp_path: Path,
) -> None:
    """Read unpaced at close, a daemon the learner left behind that sends on and on would have the
    agent read at full speed for as long as it lived: the drain ends with its time all the same."""
    taken: list[Report] = []
    budget = LearnerBudget(100.0, 100.0, time.monotonic)
    channel = ReportChannel(tmp_path, taken.append, LearnerNotes(Recorder(), time.monotonic), budget=budget)
    await channel.start()
    stop = threading.Event()

    def send_for_ever() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(channel.path))
            with contextlib.suppress(OSError):  # cut off when the drain's time is up
                while not stop.is_set():
                    connection.sendall(b'{"type": "progress", "step": 1}\n' * 100)

    sender = asyncio.create_task(asyncio.to_thread(send_for_ever))
    await asyncio.sleep(0.2)
    try:
        # a drain that read for as long as the sender sent would never end: the wait says so
        await asyncio.wait_for(channel.close(drain_s=0.5), timeout=10.0)
    finally:
        stop.set()
        await sender
    assert not channel.path.exists()


async def test_connections_are_taken_at_the_budget_s_rate_and_the_learner_s_connects_wait(
    tmp_path: Path,
) -> None:
    """Setting up a connection's reader costs the agent about what 16 lines do: a learner that only
    connects, sends a line and closes spends nothing of the budget's lines, but its connections."""
    rate, burst = 10.0 * CONNECTION_UNITS, 5.0 * CONNECTION_UNITS  # ten connections a second, five at once
    taken: list[Report] = []
    recorder = Recorder()
    budget = LearnerBudget(rate, burst, time.monotonic)
    channel = ReportChannel(tmp_path, taken.append, LearnerNotes(recorder, time.monotonic), budget=budget)
    await channel.start()
    stop = threading.Event()
    connected = [0]

    def connect_again_and_again() -> None:
        while not stop.is_set():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(0.05)
                with contextlib.suppress(OSError):
                    connection.connect(str(channel.path))
                    connection.sendall(b'{"type": "progress", "step": 1}\n')
                    connected[0] += 1

    started = time.monotonic()
    learner = asyncio.create_task(asyncio.to_thread(connect_again_and_again))
    await asyncio.sleep(1.0)
    elapsed, read = time.monotonic() - started, len(taken)
    stop.set()
    await learner
    await channel.close(drain_s=0.1)

    assert 0 < read <= (burst + rate * elapsed) / CONNECTION_UNITS + 1
    assert read < connected[0] <= read + MAX_CONNECTIONS + 2  # the rest waited in the socket's backlog
