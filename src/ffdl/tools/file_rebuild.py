"""A rebuild of the projections from a log file across processes: folding in some, SQLite in one.

A rebuild's work per event is decoding it, folding it into its job or node, and writing its history
row; on one core those add up to several times the decode alone. Aggregates are independent, so the
fold splits by aggregate: each of ``workers`` folder processes decodes and folds the events of the
aggregates whose log key falls to it (a CRC of the key). The process that started them reads the
file, and per batch of lines:

* reads each line's members that its history row holds, without decoding the event
  (:func:`~ffdl.tools.log_files.line_history_row`), which name its aggregate and position too;
* applies the positions rule (:class:`~ffdl.projections.store.Positions`) as the serial rebuild
  does, per batch of the same lines;
* hands each folder its lines, each marked with whether the rule admits it (a line it does not
  admit is still decoded, so that a bad line fails the rebuild as it fails the serial one);
* while the folders fold, writes the previous batch: its rows, less the lines a folder did not apply
  (a seq taken, a gap, an illegal event), and with the rows a folder made of the lines it decoded
  through validation (an older schema version, a line written otherwise).

What crosses between processes is the lines of a batch one way, a verdict on the lines not applied
as read the other way, and each aggregate's row once at the end: no event and no history row in the
common case. The result is the serial rebuild's (:func:`~ffdl.projections.store.rebuild`) row for
row: each aggregate is folded by one process, in log order, with the one fold step; history rows
are written in log order. A bad line fails the rebuild with the serial rebuild's error, at the first
bad line.
"""

from __future__ import annotations

import multiprocessing
import traceback
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from ffdl.core.aggregate import Aggregates, Skipped
from ffdl.core.collector import cyclic_gc_paused
from ffdl.core.kinds import KINDS, NODES
from ffdl.events.position import Position
from ffdl.projections.store import Positions, Projection, Rows, history_row
from ffdl.tools.log_files import LogFileError, line_history_row, numbered_lines, open_for_reading, read_line

#: A folder's verdict on a line it was to apply: None, not applied; else the kind's name and its row.
Verdict = tuple[str, tuple[Any, ...]] | None
#: A line handed to a folder: its number, its text, and whether the positions rule admits it.
Share = list[tuple[int, str, bool]]


class _Address(msgspec.Struct):
    """The aggregate and position of a line that has no history row of its own members."""

    job_id: str | None = None
    node: str | None = None
    position: str | None = None


_decode_address = msgspec.json.Decoder(_Address).decode


def shard_of(key: str, shards: int) -> int:
    """The folder of the aggregate with log ``key`` (the same in every process, unlike ``hash``)."""
    return zlib.crc32(key.encode()) % shards


def _address(text: str) -> tuple[str | None, tuple[int, int] | None]:
    """The log key and position of a line, either None where the line has none (it is no event, and
    fails in the folder it goes to)."""
    try:
        address = _decode_address(text)
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors; RecursionError: a line
        return None, None  # nested past the stack
    key = None
    if address.job_id is not None and address.node is None:
        key = address.job_id
    elif address.node is not None and address.job_id is None:
        key = NODES.key(address.node)
    try:
        return key, Position.parse_token(address.position)
    except ValueError:
        return key, None


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why a folder stopped: a bad line (its number and reason), or an error of its own (a traceback)."""

    line: int | None
    reason: str


def _fold_shard(shard: int, shards: int, lines: Connection, out: Connection) -> None:
    """A folder: decode and fold each share of lines it receives, and send back the verdicts on the
    lines admitted but not applied as the writer reads them; at the end (a None share), the rows of
    its aggregates and its count of ignored events."""
    aggregates = Aggregates(KINDS)
    ignored = 0
    try:
        with cyclic_gc_paused():
            while (share := lines.recv()) is not None:
                verdicts: dict[int, Verdict] = {}
                for number, text, admitted in share:
                    line = read_line(text, number)
                    if not admitted:
                        continue
                    logged = line.canonical
                    event = logged.event
                    if shard_of(event.key, shards) != shard:
                        raise RuntimeError(f"line {number}: the event of {event.key} is not this folder's")
                    folded = aggregates.fold(event)
                    if isinstance(folded, Skipped):
                        ignored += 1
                        verdicts[number] = None
                    elif line.logged.body is None:  # decoded through validation: the row of the event
                        kind = KINDS.of(event)
                        verdicts[number] = (kind.name, history_row(kind.identity(event), logged))
                out.send(verdicts)
    except LogFileError as exc:
        out.send(_Failure(exc.line, exc.reason))
        return
    except BaseException:
        out.send(_Failure(None, traceback.format_exc()))
        raise
    rows = Rows(ignored=ignored)
    for kind in KINDS:
        rows.add_states(kind, aggregates.of(kind))
    out.send(rows)


@dataclass(slots=True)
class _Folders:
    """The folder processes, each with the pipe of its lines and the pipe of its answers."""

    lines: list[Connection]
    answers: list[Connection]

    def send(self, shares: list[Share] | None) -> None:
        """Each folder its share of a batch; None: the end of the log."""
        for index, folder in enumerate(self.lines):
            folder.send(None if shares is None else shares[index])

    def received(self) -> Iterator[Any]:
        """One answer of each folder; the first bad line (by number) any reports fails the rebuild."""
        answers = [folder.recv() for folder in self.answers]
        failures = [answer for answer in answers if isinstance(answer, _Failure)]
        bad_lines = [failure for failure in failures if failure.line is not None]
        if bad_lines:
            first = min(bad_lines, key=lambda failure: failure.line or 0)
            raise LogFileError(first.line or 0, first.reason)
        if failures:
            raise RuntimeError(f"a rebuild's folder failed:\n{failures[0].reason}")
        return iter(answers)


def rebuild_file_in_processes(
    projection: Projection, path: Path, workers: int, batch_size: int = 10_000
) -> tuple[int, int]:
    """Fold the log file at ``path`` into the empty ``projection`` with ``workers`` folders; returns
    the events read and applied."""
    context = multiprocessing.get_context("fork")  # the folders share what this process imported
    folders = _Folders([], [])
    processes = []
    try:
        for shard in range(workers):
            lines_reader, lines_writer = context.Pipe(duplex=False)
            answers_reader, answers_writer = context.Pipe(duplex=False)
            arguments = (shard, workers, lines_reader, answers_writer)
            process = context.Process(target=_fold_shard, args=arguments, daemon=True)
            process.start()
            lines_reader.close()
            answers_writer.close()
            folders.lines.append(lines_writer)
            folders.answers.append(answers_reader)
            processes.append(process)
        return _write(projection, path, folders, batch_size)
    except BaseException:
        for process in processes:  # a failed rebuild's folders may wait for lines: they hold nothing
            process.kill()
        raise
    finally:
        for connection in (*folders.lines, *folders.answers):
            connection.close()
        for process in processes:
            process.join()


@dataclass(slots=True)
class _Batch:
    """A batch of lines as the writer read them: each line's number, whether the positions rule
    admits it, and the kind's name and history row it made of the line (None: a folder makes it)."""

    lines: list[tuple[int, bool, tuple[str, tuple[Any, ...]] | None]]


def _read(batch: list[tuple[int, str]], positions: Positions, shards: int) -> tuple[_Batch, list[Share]]:
    """What the writer reads of a batch, and the folders' shares of its lines."""
    read = _Batch([])
    shares: list[Share] = [[] for _ in range(shards)]
    for number, text in batch:
        made = line_history_row(text)
        position: tuple[int, int] | None
        if made is not None:
            kind, position, row = made
            key: str | None = kind.key(row[0])
            kind_row: tuple[str, tuple[Any, ...]] | None = (kind.name, row)
        else:
            (key, position), kind_row = _address(text), None
        admitted = position is None or positions.admits(*position)  # no position: the line fails
        shares[0 if key is None else shard_of(key, shards)].append((number, text, admitted))
        read.lines.append((number, admitted, kind_row))
    return read, shares


def _rows(read: _Batch, verdicts: dict[int, Verdict]) -> Rows:
    """The rows of a batch the folders folded."""
    rows = Rows()
    for number, admitted, made in read.lines:
        if not admitted:
            continue
        if number in verdicts:
            kind_row = verdicts[number]
            if kind_row is None:  # not applied
                continue
        elif made is None:
            raise RuntimeError(f"line {number}: decoded on the trusted path, but no row made of it")
        else:
            kind_row = made
        rows.history[kind_row[0]].append(kind_row[1])
    return rows


def _write(projection: Projection, path: Path, folders: _Folders, batch_size: int) -> tuple[int, int]:
    """The writer: each batch read and handed to the folders; the batch before it written meanwhile;
    at the end, the aggregates' rows, the positions and the count of ignored events."""
    shards = len(folders.lines)
    positions = Positions({})
    read = applied = 0
    folding: _Batch | None = None
    with projection.bulk_load(), cyclic_gc_paused(), open_for_reading(path) as stream:
        lines = numbered_lines(stream)
        while True:
            batch = list(islice(lines, batch_size))
            positions = Positions(positions.reached)
            ahead, shares = _read(batch, positions, shards) if batch else (None, None)
            if folding is not None:
                verdicts: dict[int, Verdict] = {}
                for answer in folders.received():
                    verdicts.update(answer)
            folders.send(shares)
            if folding is not None:
                rows = _rows(folding, verdicts)
                projection.write(rows)
                applied += sum(len(history) for history in rows.history.values())
            if ahead is None:
                break
            read += len(batch)
            folding = ahead
        ends: list[Rows] = list(folders.received())
        final = Rows(positions=positions.reached, ignored=sum(end.ignored for end in ends))
        for end in ends:
            for name, states in end.states.items():
                final.states[name] += states
        projection.write(final)
    return read, applied
