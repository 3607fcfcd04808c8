"""Rebuilding projections from a log file is deterministic, and ``verify`` names each violation's place.

The rebuild stores a current-version line's own JSON as the history body instead of serialising the
event again; the projections must come out byte-identical to those the live projector writes, which
serialises every event (``LoggedEvent`` without a body).
"""

from __future__ import annotations

import heapq
from pathlib import Path

import pytest

from ffdl.projections.store import LoggedEvent, Projection
from ffdl.tools.log_files import read_log, write_log
from ffdl.tools.sre import rebuild_file, verify_events
from tests.golden.record import GOLDEN_DIR, positioned

LOGS = sorted(GOLDEN_DIR.glob("*.events.jsonl"))
#: The golden logs the first platform wrote: each later one tells the same stories of the same jobs again.
OLDER_LOGS = [
    path
    for path in LOGS
    if not path.name.removesuffix(".events.jsonl").endswith(
        (
            "_direct_launch",
            "_principals",
            "_spec_v2",
            "_bounded_reports",
            "_specs_and_reports_v2",
            "_outsiders",
            "_halts_v3",
        )
    )
]


def one_log(tmp_path: Path) -> Path:
    """Every golden log of the older platform in one log file, merged by time, at the positions one log
    would give them."""
    streams = [[logged.event for logged in read_log(path)] for path in OLDER_LOGS]
    merged = tmp_path / "all.jsonl"
    with merged.open("w") as out:
        write_log(
            positioned(list(heapq.merge(*streams, key=lambda event: event.occurred_at))), out, "ffdl.events"
        )
    return merged


def dump(path: Path) -> str:
    projection = Projection(path)
    try:
        return projection.dump()
    finally:
        projection.close()


@pytest.mark.parametrize("log", LOGS, ids=lambda path: path.name.removesuffix(".events.jsonl"))
def test_the_same_log_always_rebuilds_byte_identical_projections(log: Path, tmp_path: Path) -> None:
    first = rebuild_file(log, tmp_path / "first.sqlite")
    second = rebuild_file(log, tmp_path / "second.sqlite")

    assert first["applied"] == second["applied"] == first["events"] > 0
    assert dump(tmp_path / "first.sqlite") == dump(tmp_path / "second.sqlite")


@pytest.mark.parametrize("log", LOGS, ids=lambda path: path.name.removesuffix(".events.jsonl"))
def test_a_rebuild_from_a_file_equals_the_projection_the_live_projector_writes(
    log: Path, tmp_path: Path
) -> None:
    rebuild_file(log, tmp_path / "from-file.sqlite")
    live = Projection(tmp_path / "live.sqlite")
    for logged in read_log(log):  # one event per batch, serialised by the store, as the projector does
        live.apply([LoggedEvent(logged.event, logged.partition, logged.offset)])
    live.close()

    assert dump(tmp_path / "from-file.sqlite") == dump(tmp_path / "live.sqlite")


def test_a_rebuild_reports_its_counts_and_never_overwrites_a_projection(tmp_path: Path) -> None:
    log = one_log(tmp_path)
    out = tmp_path / "projections.sqlite"

    report = rebuild_file(log, out)

    events = len(log.read_text().splitlines())
    assert report == {
        "events": events,
        "applied": events,
        "ignored": 0,
        "jobs": 10,
        "tenants": 3,
        "states": {"CANCELLED": 1, "COMPLETED": 7, "FAILED": 2},
        "nodes": 2,
        "node_statuses": {"READY": 1, "REMOVED": 1},
        "path": str(out),
    }
    with pytest.raises(FileExistsError, match="a rebuild writes a new projection file"):
        rebuild_file(log, out)


def test_verify_finds_no_violation_in_two_jobs_sharing_gpus_over_time() -> None:
    report = verify_events(read_log(GOLDEN_DIR / "preemption.events.jsonl"), "preemption")

    assert (report["violations"], report["jobs"], report["duplicates"]) == ([], 2, 0)


def test_verify_names_the_job_and_position_of_each_violation() -> None:
    events = list(read_log(GOLDEN_DIR / "preemption.events.jsonl"))
    released = next(i for i, e in enumerate(events) if e.event.type == "GpusReleased")
    reallocated = next(i for i, e in enumerate(events) if e.event.type == "GpusAllocated" and i > released)
    # The urgent job is given the GPUs before the preempted one gave them back, and a seq goes missing.
    early = [
        *events[:released],
        events[reallocated],
        *events[released:reallocated],
        *events[reallocated + 1 :],
    ]
    missing = events[reallocated].event.seq + 2
    gap = next(i for i, e in enumerate(early) if e.event.job_id == "urgent-45" and e.event.seq == missing)
    broken = [logged for i, logged in enumerate(early) if i != gap]

    report = verify_events(broken, "broken")

    found = {(v["kind"], v["job_id"], v["position"]) for v in report["violations"]}
    double_held = ("gpu-double-held", "urgent-45", events[reallocated].position)
    seq_gap = ("seq-gap", "urgent-45", early[gap + 1].position)
    assert double_held in found and seq_gap in found
    assert all(v["detail"] for v in report["violations"])
