"""Event logs as JSON Lines files: what ``ffdl export`` writes and ``replay``, ``verify`` and ``import`` read.

One line per event, a job's or a node's (the events topic carries both): the event's JSON object
exactly as the codec gives it (``event_to_dict``), plus where it sat in the log, ``"topic"`` and
``"position": "PARTITION:OFFSET"``. Keys are sorted and there are no spaces, so exporting the same
log twice gives the same bytes, and a line minus those two keys is byte for byte the record value
the platform appended (``event_to_json``). Lines are kept in the order they were written: an export
writes the partitions merged by event time, which keeps each job's and each node's events in seq
order. Old schema versions in a file are upcast when read, like records on a bus.

Files are read and written as streams, one line at a time by one thread: a command holds only what
it folds (``replay`` one job's events, ``verify`` the checker's state), never the whole file. A line
that is not an event is an error naming its line number: an exported file is written from decoded
events, so a bad line means the file was damaged or edited, and guessing past it would replay a
different history.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import msgspec

from ffdl.core.aggregate import AnyKind
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.events.builders import instant
from ffdl.events.codec import (
    AnyEvent,
    DecodeError,
    JsonObject,
    any_event_from_dict,
    built_line,
    event_to_dict,
)
from ffdl.events.position import Position
from ffdl.projections.documents import dumps
from ffdl.projections.store import LoggedEvent

#: The path that means standard input or output.
STDIO = "-"


class LogFileError(ValueError):
    """A line of a log file that is not an exported event; ``line`` is its 1-based number."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events an export keeps: all of the given conditions hold (none given: every event).

    ``job_id`` and ``tenant`` select jobs' events (a node's event has neither), ``node`` one node's
    events, so a filter naming a node and a job or tenant would keep nothing and is refused.
    ``types`` may name job and node event types. ``since`` is inclusive and ``until`` exclusive, so
    consecutive windows never share an event.
    """

    job_id: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    types: frozenset[str] = frozenset()
    node: str | None = None

    def __post_init__(self) -> None:
        if self.node is not None and (self.job_id is not None or self.tenant is not None):
            raise ValueError("a node's events have no job or tenant: filter by node, or by job and tenant")

    def matches(self, event: AnyEvent) -> bool:
        return (
            self._selects(event)
            and (self.since is None or event.occurred_at >= self.since)
            and (self.until is None or event.occurred_at < self.until)
            and (not self.types or event.type in self.types)
        )

    def _selects(self, event: AnyEvent) -> bool:
        """Whether the event's aggregate is one the filter asks for (by its log key, and its tenant)."""
        if self.node is not None:
            return event.key == NODES.key(self.node)
        return (self.job_id is None or event.key == JOBS.key(self.job_id)) and (
            self.tenant is None or KINDS.of(event).tenant_of(event) == self.tenant
        )


def parse_time(text: str) -> datetime:
    """An ISO 8601 instant (``2024-05-01T12:00:00Z``, an offset, or none: UTC)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not an ISO 8601 time: {text!r}") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def line_object(logged: LoggedEvent, topic: str) -> JsonObject:
    """The JSON object of one exported line."""
    return {**event_to_dict(logged.event), "position": logged.position, "topic": topic}


def encode_line(logged: LoggedEvent, topic: str) -> str:
    """One exported line, without its newline."""
    return dumps(line_object(logged, topic))


def json_line(text: str, number: int) -> JsonObject:
    """One line of an exported file as a JSON object, without the ``topic`` every line carries."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:  # nested past the stack: a damaged or made-up line
        raise LogFileError(number, f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise LogFileError(number, "not a JSON object")
    raw.pop("topic", None)
    return raw


def split_line(text: str, number: int) -> tuple[JsonObject, tuple[int, int]]:
    """A line's event object (without ``position`` and ``topic``) and its position."""
    raw = json_line(text, number)
    try:
        position = Position.parse_token(raw.pop("position", None))
    except ValueError as exc:
        raise LogFileError(number, str(exc)) from exc
    return raw, position


def decode_line(text: str, number: int = 0) -> LoggedEvent:
    """The job's or node's event of one exported line, upcast to the current schema, with its position.

    The events of a log were validated by the owners that appended them: a line as ``export`` writes
    it is decoded without validating it again (:func:`~ffdl.events.codec.built_line`), any other
    through validation, which upcasts an older version or says what is wrong with the line.
    """
    built = _built(text)
    if built is not None:
        event, partition, offset, _, _ = built
        return LoggedEvent(event, partition, offset)
    raw, position = split_line(text, number)
    return _logged(raw, position, number)


def _built(text: str) -> tuple[AnyEvent, int, int, str, str] | None:
    """The event of a line as ``export`` writes it, where it sits, and the line's ``position`` and
    ``topic`` as written."""
    built = built_line(text)
    if built is None:
        return None
    event, position, topic = built
    try:
        partition, offset = Position.parse_token(position)
    except ValueError:
        return None  # validation's path reports it
    return event, partition, offset, position, topic


def _logged(raw: JsonObject, position: tuple[int, int], number: int) -> LoggedEvent:
    try:
        return LoggedEvent(any_event_from_dict(raw), *position)
    except DecodeError as exc:
        raise LogFileError(number, exc.reason) from exc


def numbered_lines(stream: TextIO) -> Iterator[tuple[int, str]]:
    """The non-blank lines of ``stream`` with their 1-based numbers."""
    for number, text in enumerate(stream, start=1):
        if text and not text.isspace():  # as ``text.strip()``, without copying the line
            yield number, text


@contextmanager
def open_for_reading(path: Path | str) -> Iterator[TextIO]:
    """``path`` as a text stream; ``-`` is standard input."""
    if str(path) == STDIO:
        yield sys.stdin
        return
    with Path(path).open(encoding="utf-8") as stream:
        yield stream


@contextmanager
def open_for_writing(path: Path | str) -> Iterator[TextIO]:
    """``path`` as a text stream, created or truncated; ``-`` is standard output."""
    if str(path) == STDIO:
        yield sys.stdout
        sys.stdout.flush()
        return
    with Path(path).open("w", encoding="utf-8") as stream:
        yield stream


def read_log(path: Path | str) -> Iterator[LoggedEvent]:
    """Every event of a log file, in file order; raises :class:`LogFileError` at a bad line."""
    with open_for_reading(path) as stream:
        for number, text in numbered_lines(stream):
            yield decode_line(text, number)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a log file: its event decoded, and the event's JSON as the line has it."""

    number: int
    event_json: str  # without position and topic, keys sorted, no spaces
    schema_version: int  # as written, before any upcasting
    logged: LoggedEvent

    @property
    def canonical(self) -> LoggedEvent:
        """The event carrying its JSON as ``body`` when that is the codec's encoding of it.

        A line of the current schema version holds exactly ``event_to_dict`` of its event (that is
        what :func:`encode_line` writes), so its JSON is the event's ``event_to_json``; an old
        version is not, and is serialised again after upcasting.
        """
        logged = self.logged
        if logged.body is not None or self.schema_version != logged.event.schema_version:
            return logged
        return LoggedEvent(logged.event, logged.partition, logged.offset, self.event_json)


def read_lines(path: Path | str) -> Iterator[LogLine]:
    """Every line of a log file with its decoded event, for readers that keep the JSON as written."""
    with open_for_reading(path) as stream:
        for number, text in numbered_lines(stream):
            yield read_line(text, number)


def read_line(text: str, number: int) -> LogLine:
    """One line with its decoded event (see :func:`decode_line`) and the event's JSON as written."""
    built = _built(text)
    if built is not None:
        event, partition, offset, position, topic = built
        event_json = _event_json(text, position, topic)
        if event_json is not None:  # of the current version, as built: its JSON is the event's own
            logged = LoggedEvent(event, partition, offset, event_json)
            return LogLine(number, event_json, event.schema_version, logged)
    raw, token = split_line(text, number)
    logged = _logged(raw, token, number)
    return LogLine(number, dumps(raw), raw.get("schema_version", 1), logged)


_TOPIC_MEMBERS: dict[str, str] = {}


def _event_json(text: str, position: str, topic: str) -> str | None:
    """The line without its ``position`` and ``topic`` members: the event's JSON, cut out of a line as
    ``export`` writes it (keys sorted, so ``position`` comes right before ``producer`` and ``topic``
    right before ``type``, the last key) instead of parsed and serialised again; None for a line
    written otherwise."""
    topic_member = _TOPIC_MEMBERS.get(topic)
    if topic_member is None:
        topic_member = _TOPIC_MEMBERS.setdefault(topic, f',"topic":{json.dumps(topic)}')
    position_member = f',"position":"{position}"'
    line = text.rstrip("\r\n")
    at_position = line.rfind(position_member + ',"producer":')
    at_topic = line.rfind(topic_member + ',"type":')
    if at_position < 0 or at_topic < at_position:
        return None
    after_position = at_position + len(position_member)
    return line[:at_position] + line[after_position:at_topic] + line[at_topic + len(topic_member) :]


class _Head(msgspec.Struct):
    """The members of a line that its history row holds, read without decoding its event (the other
    members are skipped by the parser)."""

    causation_id: str | None
    event_id: str
    occurred_at: str
    position: str
    seq: int
    topic: str
    type: str
    job_id: str | None = None
    node: str | None = None


_decode_head = msgspec.json.Decoder(_Head).decode


def line_history_row(text: str) -> tuple[AnyKind, tuple[int, int], tuple[Any, ...]] | None:
    """The history row of a line as ``export`` writes it, with its kind and position, read from the
    line's own members: for a line :func:`read_line` decodes on the trusted path, the row
    :func:`~ffdl.projections.store.history_row` makes of its event, without making the event (ids and
    time as text, body cut out of the line). None for a line written otherwise.

    A rebuild's writer makes the rows of the lines that processes of their own decode and fold.
    """
    try:
        head = _decode_head(text)
        partition, offset = Position.parse_token(head.position)
        if (head.job_id is None) == (head.node is None):
            return None
        body = _event_json(text, head.position, head.topic)
        if body is None:
            return None
        kind, identity = (JOBS, head.job_id) if head.job_id is not None else (NODES, head.node)
        cause = head.causation_id
        return (
            kind,
            (partition, offset),
            (
                identity,
                head.seq,
                _uuid_text(head.event_id),
                head.type,
                _instant_text(head.occurred_at),
                Position.format_token(partition, offset),
                None if cause is None else _uuid_text(cause),
                body,
            ),
        )
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors; a line nested past the
        return None  # stack is read the slow way, which says why it is no event


def _uuid_text(text: str) -> str:
    """A UUID as ``str(UUID)`` writes it: already, when in lower case with its hyphens (a JSON UUID the
    trusted decode takes is of 32 digits or of 36 characters with hyphens in their places)."""
    return text if len(text) == 36 and text == text.lower() else str(uuid.UUID(text))


def _instant_text(text: str) -> str:
    """An instant as the trusted decode writes it, as ``datetime.isoformat`` writes what it decodes
    to: a ``Z`` is ``+00:00``, and microseconds of 0 are left out (the general case decodes it)."""
    if text[-1] == "Z" and not text.endswith(".000000Z"):
        return text[:-1] + "+00:00"
    return instant(text).isoformat()


def write_log(events: Iterable[LoggedEvent], stream: TextIO, topic: str) -> int:
    """Write ``events`` as lines of ``topic``; returns how many were written."""
    written = 0
    for logged in events:
        stream.write(encode_line(logged, topic))
        stream.write("\n")
        written += 1
    return written
