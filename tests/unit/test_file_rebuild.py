"""A rebuild from a file across processes gives the serial rebuild's projection, row for row.

The writer makes each history row from the line's own members instead of the decoded event, and the
folders decode and fold each its own aggregates; both must agree with the serial rebuild (one
process folding every event with the store's fold) on any log, including damaged ones: repeated
lines (a duplicate, or below a position already passed), a conflicting event, a missing one, lines
out of order, old schema versions, any batch size and any number of folders. A bad line fails both
alike, at the first bad line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ffdl.core.kinds import KINDS
from ffdl.projections.store import Projection, history_row, rebuild
from ffdl.tools.file_rebuild import rebuild_file_in_processes
from ffdl.tools.log_files import LogFileError, line_history_row, read_line, read_lines
from tests.golden.record import GOLDEN_DIR, write_generated_log

GOLDEN_LOGS = sorted(GOLDEN_DIR.glob("*.events.jsonl"))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A generated log of jobs of every kind of life, and nodes, with the old-version lines of a
    golden log after it."""
    path = tmp_path_factory.mktemp("generated") / "events.jsonl"
    write_generated_log(path, 1_000)
    v1 = (GOLDEN_DIR / "halt_resume_v1.events.jsonl").read_text().splitlines(keepends=True)
    return [*path.read_text().splitlines(keepends=True), *v1]


def serial_dump(path: Path, out: Path, batch_size: int) -> tuple[str, int]:
    projection = Projection(out)
    try:
        applied = rebuild(projection, (line.canonical for line in read_lines(path)), batch_size)
        return projection.dump(), applied
    finally:
        projection.close()


def parallel_dump(path: Path, out: Path, workers: int, batch_size: int) -> tuple[str, tuple[int, int]]:
    projection = Projection(out)
    try:
        counts = rebuild_file_in_processes(projection, path, workers, batch_size)
        return projection.dump(), counts
    finally:
        projection.close()


def _variants(text: str) -> list[str]:
    """The line, and the line with its ids in capitals and its time with no microseconds, zero
    microseconds or an offset: other spellings the trusted decode takes."""
    capitals = re.sub(r'"(event_id|causation_id)":"([0-9a-f-]{36})"', lambda m: m.group(0).upper(), text)
    capitals = capitals.replace('"EVENT_ID"', '"event_id"').replace('"CAUSATION_ID"', '"causation_id"')
    times = [
        re.sub(r'"occurred_at":"([^".]+)(\.[0-9]{6})?Z"', rf'"occurred_at":"\1{suffix}"', text)
        for suffix in ("Z", ".000000Z", ".000001+05:30", "-00:00")
    ]
    return [text, capitals, *times]


@pytest.mark.parametrize("path", GOLDEN_LOGS, ids=lambda path: path.name.removesuffix(".events.jsonl"))
def test_a_lines_own_history_row_is_the_row_of_its_event(path: Path) -> None:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        for variant in _variants(text):
            line = read_line(variant, number)
            made = line_history_row(variant)
            if line.logged.body is None:  # decoded through validation: a folder makes its row
                continue
            logged = line.canonical
            kind = KINDS.of(logged.event)
            expected = (
                kind,
                (logged.partition, logged.offset),
                history_row(kind.identity(logged.event), logged),
            )
            assert made == expected


@given(
    operations=st.lists(
        st.tuples(st.sampled_from(["repeat", "conflict", "drop", "swap"]), st.floats(0, 1), st.floats(0, 1)),
        max_size=6,
    ),
    workers=st.integers(1, 3),
    batch_size=st.sampled_from([5, 100, 10_000]),
)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_rebuild_across_processes_is_the_serial_rebuild(
    generated: list[str],
    tmp_path_factory: pytest.TempPathFactory,
    operations: list[tuple[str, float, float]],
    workers: int,
    batch_size: int,
) -> None:
    lines = list(generated)
    for operation, first, second in operations:
        i, j = sorted((int(first * (len(lines) - 1)), int(second * (len(lines) - 1))))
        match operation:
            case "repeat":  # redelivered later: a duplicate, or below a position already passed
                lines.insert(j + 1, lines[i])
            case "conflict":  # the same seq, another event
                lines.insert(j + 1, re.sub(r'"event_id":"[0-9a-f]', '"event_id":"f', lines[i], count=1))
            case "drop":
                del lines[i]
            case _:
                lines[i], lines[j] = lines[j], lines[i]
    work = tmp_path_factory.mktemp("rebuild")
    log = work / "log.jsonl"
    log.write_text("".join(lines))

    dump, (read, applied) = parallel_dump(log, work / "parallel.sqlite", workers, batch_size)

    assert (dump, applied) == serial_dump(log, work / "serial.sqlite", batch_size)
    assert read == len(lines)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_line_fails_the_rebuild_as_the_serial_one_at_the_first(
    generated: list[str], tmp_path: Path, workers: int
) -> None:
    lines = list(generated)
    lines[700] = lines[700].replace('"seq":', '"seq":"', 1)  # not JSON
    lines[40] = lines[40].replace('"producer":"', '"producer":1,"x":"', 1)  # not an event
    log = tmp_path / "log.jsonl"
    log.write_text("".join(lines))

    with pytest.raises(LogFileError) as serial:
        serial_dump(log, tmp_path / "serial.sqlite", 100)
    with pytest.raises(LogFileError) as parallel:
        parallel_dump(log, tmp_path / "parallel.sqlite", workers, 100)

    assert (
        (parallel.value.line, str(parallel.value))
        == (serial.value.line, str(serial.value))
        == (41, str(serial.value))
    )


@pytest.mark.parametrize("nesting", ["[" * 100_000, '{"a":' * 100_000])
def test_a_line_nested_past_the_stack_is_an_error_naming_its_line_not_a_crash(
    tmp_path: Path, nesting: str
) -> None:
    """Made by hand or damaged: ``verify`` and the rebuild ended with a ``RecursionError``."""
    path = tmp_path / "deep.jsonl"
    path.write_text(nesting + "\n")

    with pytest.raises(LogFileError, match=r"^line 1: not JSON"):
        list(read_lines(path))
    assert line_history_row(nesting) is None
    with pytest.raises(LogFileError, match=r"^line 1: not JSON"):
        rebuild_file_in_processes(Projection(tmp_path / "rebuilt.sqlite"), path, 2, 10)
