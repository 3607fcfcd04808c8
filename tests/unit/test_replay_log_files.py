"""Log files: one exported event (a job's or a node's) per line that reads back to the same event, filters,
and clear errors."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ffdl.events import job_events as ev
from ffdl.events.codec import event_to_json
from ffdl.tools.log_files import (
    EventFilter,
    LogFileError,
    decode_line,
    encode_line,
    read_lines,
    read_log,
    write_log,
)
from tests.golden.record import GOLDEN_DIR
from tests.node_history import JOB, NODE, node_and_job_events, positioned

PREEMPTION = GOLDEN_DIR / "preemption.events.jsonl"
LEGACY = GOLDEN_DIR / "halt_resume_v1.events.jsonl"
#: A log of today's versions only: an older one reads back upcast, so not byte for byte.
TODAYS = GOLDEN_DIR / "preemption_halts_v3.events.jsonl"


def test_a_written_log_reads_back_to_the_same_events_and_the_same_bytes(tmp_path: Path) -> None:
    events = list(read_log(TODAYS))
    copy = tmp_path / "copy.jsonl"

    with copy.open("w") as out:
        written = write_log(events, out, "ffdl.events")

    assert written == len(events)
    assert copy.read_bytes() == TODAYS.read_bytes()
    assert [(e.event, e.position) for e in read_log(copy)] == [(e.event, e.position) for e in events]


def test_a_line_is_the_codec_json_of_the_event_plus_its_topic_and_position() -> None:
    logged = next(read_log(PREEMPTION))

    line = json.loads(encode_line(logged, "ffdl.events"))

    assert (line.pop("topic"), line.pop("position")) == ("ffdl.events", logged.position)
    assert json.dumps(line, separators=(",", ":"), sort_keys=True).encode() == event_to_json(logged.event)


def test_every_current_line_carries_the_events_own_json_and_an_old_one_is_upcast() -> None:
    lines = list(read_lines(LEGACY))

    for line in lines:
        canonical = line.canonical
        if line.schema_version == line.logged.event.schema_version:
            assert canonical.body == event_to_json(line.logged.event).decode()
        else:
            assert canonical.body is None  # serialised again, at its current version
    old = [line for line in lines if line.schema_version == 1 and line.logged.event.type == "HaltRequested"]
    assert len(old) == 1 and old[0].logged.event.schema_version == ev.HaltRequested.VERSION


def test_a_bad_line_is_an_error_naming_its_line_number(tmp_path: Path) -> None:
    lines = PREEMPTION.read_text().splitlines()
    broken = json.loads(lines[3])
    assert broken["type"] == "GpusAllocated"
    broken["data"]["placement"] = "everywhere"
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join([*lines[:3], json.dumps(broken), *lines[4:]]) + "\n")

    with pytest.raises(LogFileError, match=r"^line 4: invalid GpusAllocated: placement"):
        list(read_log(path))
    with pytest.raises(LogFileError, match="line 3: not JSON"):
        decode_line("{", 3)
    with pytest.raises(LogFileError, match="position must look like PARTITION:OFFSET"):
        decode_line(lines[0].replace('"position":"', '"position":"x'), 1)


def test_standard_input_is_read_for_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(PREEMPTION.read_text()))

    assert len(list(read_log("-"))) == len(PREEMPTION.read_text().splitlines())


def test_filters_keep_a_job_a_tenant_a_time_window_and_types() -> None:
    events = [logged.event for logged in read_log(PREEMPTION)]
    start, end = datetime(2024, 5, 1, 9, 1, tzinfo=UTC), datetime(2024, 5, 1, 9, 2, tzinfo=UTC)

    def kept(keep: EventFilter) -> list[str]:
        return [f"{e.key}/{e.seq}" for e in events if keep.matches(e)]

    assert kept(EventFilter()) == [f"{e.key}/{e.seq}" for e in events]
    assert {e.split("/")[0] for e in kept(EventFilter(job_id="urgent-45"))} == {"urgent-45"}
    assert {e.split("/")[0] for e in kept(EventFilter(tenant="globex"))} == {"sweep-44"}
    window = [e for e in events if EventFilter(since=start, until=end).matches(e)]
    assert window and all(start <= e.occurred_at < end for e in window)
    assert len(window) == sum(start <= e.occurred_at < end for e in events)
    types = EventFilter(types=frozenset({"GpusAllocated", "GpusReleased"}))
    assert [e.type for e in events if types.matches(e)] == ["GpusAllocated", "GpusReleased"] * 3


def test_filters_keep_jobs_and_nodes_apart() -> None:
    events = [logged.event for logged in positioned(node_and_job_events())]

    def kept(keep: EventFilter) -> set[str]:
        return {e.key for e in events if keep.matches(e)}

    assert kept(EventFilter()) == {JOB, f"node:{NODE}"}
    assert kept(EventFilter(job_id=JOB)) == kept(EventFilter(tenant="acme")) == {JOB}
    assert kept(EventFilter(node=NODE)) == {f"node:{NODE}"} and kept(EventFilter(node="gpu-node-99")) == set()
    both = EventFilter(types=frozenset({"NodeJoined", "JobSubmitted"}))
    assert [e.type for e in events if both.matches(e)] == ["NodeJoined", "JobSubmitted", "NodeJoined"]
    with pytest.raises(ValueError, match="a node's events have no job or tenant"):
        EventFilter(job_id=JOB, node=NODE)
