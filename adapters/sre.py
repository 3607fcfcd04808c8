"""SRE tools over an event log: export, import, replay any job to any point, verify, rebuild projections.

The log is the truth, so every question about a job is answered from the log alone, offline, for
any point in time. A log is a JSON Lines file (:mod:`ffdl.adapters.log_files`, what ``export``
writes) or a live bus (embedded or Kafka, through the Bus port). Either gives :class:`LoggedEvent`
in one order: a file in its line order, a bus with its partitions merged by event time (which is
what an export writes, so a file and the bus it came from read the same).

Replaying folds a job's events with the very ``evolve`` the owners use and renders the result with
the very ``job_document`` the projections store, so a replayed state is what ``ffdl status`` showed
at that point. Events that cannot apply (a seq already taken, a gap, an illegal transition) are
skipped and listed, as every reader does (DESIGN §5); judging them is ``verify``'s job, which runs
the one invariant checker of :mod:`ffdl.core.invariants`. A rebuild folds a log into a fresh
projection file; projections are a pure function of the log, so a rebuild of the live log must be
byte-for-byte the live projection.

Concurrency: each function is one pass by one task. Bus reads and writes are awaited on the event
loop; folding and file I/O are synchronous (a CLI run has nothing else to do meanwhile), except the
SQLite work of a bus rebuild, which runs in a worker thread like the projector's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import structlog

from ffdl.adapters.bus import open_bus
from ffdl.adapters.config import Settings
from ffdl.adapters.log_files import EventFilter, LogLine, encode_line, parse_time, read_lines
from ffdl.adapters.log_reading import merged_events
from ffdl.core.invariants import InvariantChecker
from ffdl.core.job import EvolveError, Job, evolve
from ffdl.events.codec import cloudevent_headers
from ffdl.handlers.messaging import Topics
from ffdl.handlers.ports import Bus, OutgoingRecord
from ffdl.projections.documents import JsonObject, job_document
from ffdl.projections.store import LoggedEvent, Projection, cyclic_gc_paused, rebuild

log = structlog.get_logger(__name__)

#: Records per publish when importing.
IMPORT_BATCH = 500


class TargetNotEmptyError(RuntimeError):
    """An import target that already holds records: an import never mixes two histories."""


class JobNotInLogError(LookupError):
    """A job with no event in the log."""


# -- where a log comes from -----------------------------------------------------------------------


def events_topic(settings: Settings) -> str:
    return Topics.with_prefix(settings.topic_prefix).events


async def _started(bus_url: str, partitions: int, topic: str) -> Bus:
    """The bus at ``bus_url``, started; on Kafka ``topic`` is created (with ``partitions``) if missing."""
    bus = open_bus(bus_url, partitions, topics=(topic,))
    await bus.start()
    return bus


async def bus_events(bus_url: str, partitions: int, topic: str) -> list[LoggedEvent]:
    """Every decodable event of ``topic``, its partitions merged by event time."""
    bus = await _started(bus_url, partitions, topic)
    try:
        return [logged async for logged in merged_events(bus, topic)]
    finally:
        await bus.close()


# -- export and import ----------------------------------------------------------------------------


async def export_log(bus_url: str, partitions: int, topic: str, keep: EventFilter, out: TextIO) -> JsonObject:
    """Write the events of ``topic`` that ``keep`` matches to ``out`` as JSON Lines, in time order."""
    bus = await _started(bus_url, partitions, topic)
    read = written = 0
    try:
        async for logged in merged_events(bus, topic):
            read += 1
            if keep.matches(logged.event):
                out.write(encode_line(logged, topic))
                out.write("\n")
                written += 1
    finally:
        await bus.close()
    log.info("log exported", bus=bus_url, topic=topic, events=read, written=written)
    return {"source": bus_url, "topic": topic, "events": read, "written": written}


def _record(line: LogLine) -> OutgoingRecord:
    """The record of one imported line: its JSON as written (old schema versions stay old), keyed by job."""
    event = line.logged.event
    headers = [
        (name, f"io.ffdl.{event.type}.v{line.schema_version}".encode() if name == "ce_type" else value)
        for name, value in cloudevent_headers(event, event.producer)
    ]
    return OutgoingRecord(event.job_id, line.event_json.encode(), tuple(headers))


async def import_log(path: Path | str, bus_url: str, partitions: int, topic: str) -> JsonObject:
    """Append every event of a log file to an empty ``topic``, in file order, each on its job's partition.

    File order keeps each job's events in seq order (an export writes them so), and a job's events
    all go to its key's partition, so the imported log has the file's per-job order. With the same
    partition count as the exported log, every event lands at the position the file gives it.
    """
    bus = await _started(bus_url, partitions, topic)
    imported = moved = 0
    try:
        held = sum((await bus.end_offsets(topic)).values())
        if held:
            raise TargetNotEmptyError(
                f"{topic} on {bus_url} already holds {held} record(s); import only into an empty log"
            )
        batch: list[tuple[OutgoingRecord, str]] = []
        for line in read_lines(path):
            batch.append((_record(line), line.logged.position))
            if len(batch) >= IMPORT_BATCH:
                moved += await _publish(bus, topic, batch)
                imported += len(batch)
                batch = []
        moved += await _publish(bus, topic, batch)
        imported += len(batch)
    finally:
        await bus.close()
    log.info("log imported", bus=bus_url, topic=topic, events=imported, moved=moved)
    return {"target": bus_url, "topic": topic, "events": imported, "moved": moved}


async def _publish(bus: Bus, topic: str, batch: list[tuple[OutgoingRecord, str]]) -> int:
    """Publish a batch; returns how many records landed at another position than the file's."""
    positions = await bus.publish(topic, [record for record, _ in batch])
    return sum(position.token != was for position, (_, was) in zip(positions, batch, strict=True))


# -- replaying one job ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """A point in a job's life: after its event ``seq``, or at instant ``at`` (after every event until it)."""

    seq: int | None = None
    at: datetime | None = None

    @classmethod
    def parse(cls, text: str) -> Point:
        """``SEQ`` (digits) or an ISO 8601 time."""
        return cls(seq=int(text)) if text.isdigit() else cls(at=parse_time(text))

    def passed_by(self, event: LoggedEvent) -> bool:
        """Whether ``event`` comes after this point."""
        if self.seq is not None:
            return event.event.seq > self.seq
        return self.at is not None and event.event.occurred_at > self.at

    def __str__(self) -> str:
        return (
            f"seq {self.seq}" if self.seq is not None else f"{self.at.isoformat() if self.at else 'the end'}"
        )


@dataclass(frozen=True, slots=True)
class Skipped:
    logged: LoggedEvent
    reason: str

    def as_json(self) -> JsonObject:
        event = self.logged.event
        return {"seq": event.seq, "type": event.type, "position": self.logged.position, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Replayed:
    """A job folded up to a point: the events applied, and those skipped as readers skip them."""

    job: Job | None
    applied: tuple[LoggedEvent, ...]
    skipped: tuple[Skipped, ...]


def job_events(events: Iterable[LoggedEvent], job_id: str) -> list[LoggedEvent]:
    """One job's events in log order; :class:`JobNotInLogError` if it has none."""
    mine = [logged for logged in events if logged.event.job_id == job_id]
    if not mine:
        raise JobNotInLogError(f"no event of job {job_id!r} in the log")
    return mine


def fold_until(history: Iterable[LoggedEvent], point: Point | None = None) -> Replayed:
    """Fold a job's events in log order up to ``point`` (``None``: all of them)."""
    job: Job | None = None
    applied: list[LoggedEvent] = []
    skipped: list[Skipped] = []
    for logged in history:
        if point is not None and point.passed_by(logged):
            break
        event = logged.event
        if job is not None and event.seq <= job.seq:
            kind = "duplicate" if any(a.event.event_id == event.event_id for a in applied) else "conflict"
            skipped.append(Skipped(logged, f"{kind}: seq {event.seq} is taken"))
            continue
        try:
            job = evolve(job, event)
        except EvolveError as exc:
            skipped.append(Skipped(logged, str(exc)))
            continue
        applied.append(logged)
    return Replayed(job, tuple(applied), tuple(skipped))


def _at(history: list[LoggedEvent], job_id: str, point: Point | None) -> Replayed:
    replayed = fold_until(history, point)
    if replayed.job is None:
        raise JobNotInLogError(f"job {job_id!r} did not exist yet at {point}")
    return replayed


def timeline(replayed: Replayed, until: datetime | None = None) -> list[JsonObject]:
    """Each state the job entered: when, why (the event and its reason), and for how long.

    The last state lasts until ``until`` (default: the last event applied) and is ``ongoing``
    unless it is terminal.
    """
    job = replayed.job
    assert job is not None
    cause = {logged.event.seq: logged for logged in replayed.applied}
    end = until or job.updated_at
    rows = []
    for index, entry in enumerate(job.history):
        last = index + 1 == len(job.history)
        left_at = None if last else job.history[index + 1].at
        ongoing = last and not entry.state.terminal
        until_then = left_at or (end if ongoing else None)
        logged = cause[entry.seq]
        rows.append(
            {
                "seq": entry.seq,
                "state": str(entry.state),
                "entered_at": entry.at.isoformat(),
                "left_at": left_at.isoformat() if left_at else None,
                "duration_s": (until_then - entry.at).total_seconds() if until_then else None,
                "ongoing": ongoing,
                "event": logged.event.type,
                "position": logged.position,
                "reason": entry.reason,
            }
        )
    return rows


def _point_of(replayed: Replayed) -> JsonObject:
    job = replayed.job
    assert job is not None
    last = replayed.applied[-1]
    return {
        "seq": job.seq,
        "at": job.updated_at.isoformat(),
        "position": last.position,
        "state": str(job.state),
    }


def replay_job(events: Iterable[LoggedEvent], job_id: str, until: Point | None = None) -> JsonObject:
    """A job's state at ``until`` (default: the end of the log), its timeline and what was skipped."""
    history = job_events(events, job_id)
    replayed = _at(history, job_id, until)
    job = replayed.job
    assert job is not None
    return {
        "job_id": job_id,
        "tenant": job.tenant,
        "until": str(until) if until else None,
        "point": _point_of(replayed),
        "events": {"in_log": len(history), "applied": len(replayed.applied)},
        "skipped": [skip.as_json() for skip in replayed.skipped],
        "state": job_document(job),
        "timeline": timeline(replayed, until.at if until else None),
    }


#: The parts of a job's document that a diff compares (the timeline is listed apart).
_COMPARED = (
    "state",
    "attempt",
    "restarts",
    "reason",
    "failure_code",
    "placement",
    "learners",
    "latest_checkpoint",
    "result",
)


def _flatten(value: Any, path: str, into: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for key in sorted(value):
            _flatten(value[key], f"{path}.{key}", into)
    elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
        for index, item in enumerate(value):
            _flatten(item, f"{path}[{index}]", into)
    else:
        into[path] = value
    return into


def _changes(before: JsonObject, after: JsonObject) -> list[JsonObject]:
    changes = []
    for key in _COMPARED:
        old, new = _flatten(before[key], key, {}), _flatten(after[key], key, {})
        for field in sorted(old.keys() | new.keys()):
            if old.get(field) != new.get(field):
                changes.append({"field": field, "before": old.get(field), "after": new.get(field)})
    return changes


def diff_job(events: Iterable[LoggedEvent], job_id: str, first: Point, second: Point) -> JsonObject:
    """What changed in a job between two points: state, attempt, learners, placement, checkpoints."""
    history = job_events(events, job_id)
    a, b = _at(history, job_id, first), _at(history, job_id, second)
    assert a.job is not None and b.job is not None
    doc_a, doc_b = job_document(a.job), job_document(b.job)
    uris_a = {c["uri"] for c in doc_a["checkpoints"]}
    uris_b = {c["uri"] for c in doc_b["checkpoints"]}
    low, high = sorted((a.job.seq, b.job.seq))
    longer = b if len(b.applied) >= len(a.applied) else a
    between = [logged.event.type for logged in longer.applied if low < logged.event.seq <= high]
    return {
        "job_id": job_id,
        "from": {"until": str(first), **_point_of(a)},
        "to": {"until": str(second), **_point_of(b)},
        "changes": _changes(doc_a, doc_b),
        "checkpoints": {
            "added": [c for c in doc_b["checkpoints"] if c["uri"] not in uris_a],
            "removed": [c for c in doc_a["checkpoints"] if c["uri"] not in uris_b],
        },
        "transitions": [row for row in timeline(longer) if low < row["seq"] <= high],
        "events_between": dict(sorted(Counter(between).items())),
    }


# -- verifying ------------------------------------------------------------------------------------


def _report(checker: InvariantChecker, source: str) -> JsonObject:
    violations = checker.finish()
    return {
        "source": source,
        "events": checker.events,
        "jobs": len(checker.jobs),
        "duplicates": checker.duplicates,
        "violations": [{k: str(v) for k, v in dataclasses.asdict(v).items()} for v in violations],
    }


def verify_events(events: Iterable[LoggedEvent], source: str) -> JsonObject:
    """Every invariant of DESIGN §5 over a log in its order; each violation with its job and position."""
    checker = InvariantChecker()
    with cyclic_gc_paused():
        for logged in events:
            checker.feed(logged.event, logged.position, partition=logged.partition)
    return _report(checker, source)


async def verify_log(settings: Settings, bus_url: str | None = None) -> JsonObject:
    """:func:`verify_events` over a bus (default: the configured one), partitions merged by time."""
    url = bus_url or settings.bus_url
    return verify_events(await bus_events(url, settings.partitions, events_topic(settings)), url)


# -- rebuilding projections -----------------------------------------------------------------------


def _fresh(path: Path) -> Projection:
    """A new, empty projection at ``path``; refuses to fold into an existing file."""
    if path.exists():
        raise FileExistsError(f"{path} exists; a rebuild writes a new projection file")
    return Projection(path)


class _Tally:
    """The events of a stream, counted as they pass."""

    def __init__(self, events: Iterable[LoggedEvent]) -> None:
        self._events = events
        self.count = 0

    def __iter__(self) -> Iterator[LoggedEvent]:
        for logged in self._events:
            self.count += 1
            yield logged


def _summary(projection: Projection, path: Path, read: int, applied: int) -> JsonObject:
    states: Counter[str] = Counter()
    tenants = set()
    for (tenant, state), count in projection.counts().items():
        states[state] += count
        tenants.add(tenant)
    return {
        "events": read,
        "applied": applied,
        "ignored": read - applied,
        "jobs": sum(states.values()),
        "tenants": len(tenants),
        "states": dict(sorted(states.items())),
        "path": str(path),
    }


def rebuild_file(log_path: Path | str, out: Path) -> JsonObject:
    """Fold every event of a log file into a new projection file at ``out``; returns the counts."""
    projection = _fresh(out)
    read = _Tally(line.canonical for line in read_lines(log_path))
    try:
        applied = rebuild(projection, read)
        report = _summary(projection, out, read.count, applied)
    finally:
        projection.close()
    log.info("projections rebuilt", log=str(log_path), path=str(out), events=read.count, applied=applied)
    return report


async def rebuild_projections(
    settings: Settings, bus_url: str | None = None, out: Path | None = None
) -> JsonObject:
    """Rebuild the projections from a bus into a new file and compare with the live projections.

    Default: the configured bus, into ``projections.rebuilt.sqlite`` beside the live file (replaced
    if there), compared with the live projection (``identical``: None when there is none, or when
    the bus is not the configured one).
    """
    url = bus_url or settings.bus_url
    events = await bus_events(url, settings.partitions, events_topic(settings))
    live_path = settings.projection_path
    path = out or live_path.with_name("projections.rebuilt.sqlite")
    if out is None:
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    rebuilt = _fresh(path)
    try:
        applied = await asyncio.to_thread(rebuild, rebuilt, events)
        report = await asyncio.to_thread(_summary, rebuilt, path, len(events), applied)
        rebuilt_dump = await asyncio.to_thread(rebuilt.dump)
    finally:
        rebuilt.close()
    identical = None
    if url == settings.bus_url and live_path.exists():
        live = Projection(live_path)
        try:
            identical = await asyncio.to_thread(live.dump) == rebuilt_dump
        finally:
            live.close()
    return {**report, "source": url, "identical": identical}
