"""SRE tools over an event log: export, import, replay any job or node to any point, verify, rebuild.

The log is the truth, so every question about a job, or a node of the inventory, is answered from
the log alone, offline, for any point in time. A log is a JSON Lines file
(:mod:`ffdl.tools.log_files`, what ``export`` writes) or a live bus (embedded or Kafka, through
the Bus port). Either gives :class:`LoggedEvent` in one order: a file in its line order, a bus with
its partitions merged by event time (which is what an export writes, so a file and the bus it came
from read the same). The events topic carries jobs' and nodes' events alike; every tool reads both
and keeps them apart by their envelope (a node's event has no job or tenant). A bus record that is
no event is never dropped unseen: an export counts it, a rebuild counts it, and ``verify`` reports
it as a finding at its position.

Replaying folds an aggregate's events with the fold step every reader takes
(:func:`~ffdl.core.aggregate.fold_step`, with the kind's ``evolve`` the owners use) and renders the
result with the very ``job_document`` (``node_document``) the projections store, so a replayed
state is what ``ffdl status`` (the nodes view) showed at that point. Events that cannot apply (a
seq already taken, a gap, an illegal transition) are skipped and listed, as every reader does;
judging them is ``verify``'s job, which runs the one invariant checker of
:mod:`ffdl.core.invariants`. A rebuild folds a log into a fresh projection file (jobs and nodes);
projections are a pure function of the log, so a rebuild of the live log must be byte-for-byte the
live projection.

Concurrency: each function is one pass by one task. Bus reads and writes are awaited on the event
loop; folding and file I/O are synchronous (a CLI run has nothing else to do meanwhile), except the
SQLite work of a bus rebuild, which runs in a worker thread like the projector's.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TextIO, TypeVar, cast

import structlog

from ffdl.adapters.bus import open_bus
from ffdl.core.aggregate import AggregateKind, AggregateState, AnyKind, Skip, Skipped, fold_step
from ffdl.core.collector import cyclic_gc_paused
from ffdl.core.invariants import InvariantChecker, Violation, ViolationKind
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, NODES
from ffdl.core.nodes import NodeRecord
from ffdl.events import nodes as nd
from ffdl.events.codec import cloudevent_headers
from ffdl.events.envelope import NODE_KEY_PREFIX, NodeEvent
from ffdl.handlers.messaging import Topics
from ffdl.handlers.ports import Bus, OutgoingRecord
from ffdl.projections.documents import JsonObject, job_document, node_document
from ffdl.projections.store import LoggedEvent, Projection, rebuild
from ffdl.tools.file_rebuild import rebuild_file_in_processes
from ffdl.tools.log_files import STDIO, EventFilter, LogLine, parse_time, read_lines, write_log
from ffdl.tools.log_reading import TopicLog, UndecodableRecord, read_topic
from ffdl.wiring.config import Settings

log = structlog.get_logger(__name__)

#: Records per publish when importing.
IMPORT_BATCH = 500


class TargetNotEmptyError(RuntimeError):
    """An import target that already holds records: an import never mixes two histories."""


class NotInLogError(LookupError):
    """An aggregate the log does not hold (at the point asked for)."""


# -- where a log comes from -----------------------------------------------------------------------


def events_topic(settings: Settings) -> str:
    return Topics.with_prefix(settings.topic_prefix).events


async def started_bus(bus_url: str, partitions: int, topic: str) -> Bus:
    """The bus at ``bus_url``, started; on Kafka ``topic`` is created (with ``partitions``) if missing."""
    bus = open_bus(bus_url, partitions, kafka=Settings().kafka, topics=(topic,))
    await bus.start()
    return bus


async def read_bus(bus_url: str, partitions: int, topic: str) -> TopicLog:
    """Every event of ``topic``, its partitions merged by event time, and every record that is no event."""
    bus = await started_bus(bus_url, partitions, topic)
    try:
        return await read_topic(bus, topic)
    finally:
        await bus.close()


# -- export and import ----------------------------------------------------------------------------


async def export_log(bus_url: str, partitions: int, topic: str, keep: EventFilter, out: TextIO) -> JsonObject:
    """Write the events of ``topic`` that ``keep`` matches to ``out`` as JSON Lines, in time order.

    A record that is no event cannot be a line of a log file: it is left out, and the report lists
    it (``undecodable``: position, key, reason).
    """
    topic_log = await read_bus(bus_url, partitions, topic)
    written = write_log((logged for logged in topic_log.events if keep.matches(logged.event)), out, topic)
    read, undecodable = len(topic_log.events), len(topic_log.undecodable)
    log.info("log exported", bus=bus_url, topic=topic, events=read, written=written, undecodable=undecodable)
    return {
        "source": bus_url,
        "topic": topic,
        "events": read,
        "written": written,
        "undecodable": [record.as_json() for record in topic_log.undecodable],
    }


def _record(line: LogLine) -> OutgoingRecord:
    """The record of one imported line: its JSON as written (old schema versions stay old), under its
    log key (the job id, or ``node:<name>``)."""
    event = line.logged.event
    headers = [
        (name, f"io.ffdl.{event.type}.v{line.schema_version}".encode() if name == "ce_type" else value)
        for name, value in cloudevent_headers(event, event.producer)
    ]
    return OutgoingRecord(event.key, line.event_json.encode(), tuple(headers))


async def import_log(path: Path | str, bus_url: str, partitions: int, topic: str) -> JsonObject:
    """Append every event of a log file to an empty ``topic``, in file order, each on its key's partition.

    File order keeps each job's and each node's events in seq order (an export writes them so), and
    an aggregate's events all go to its key's partition, so the imported log has the file's order per
    job and per node. With the same partition count as the exported log, every event lands at the
    position the file gives it.
    """
    bus = await started_bus(bus_url, partitions, topic)
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


# -- replaying one job or node ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """A point in an aggregate's life: after its event ``seq``, or at instant ``at`` (after every
    event until it)."""

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
class SkippedEvent:
    logged: LoggedEvent
    reason: str

    def as_json(self) -> JsonObject:
        event = self.logged.event
        return {"seq": event.seq, "type": event.type, "position": self.logged.position, "reason": self.reason}


#: A folded aggregate: a job or a node.
State = TypeVar("State", bound=AggregateState)


@dataclass(frozen=True, slots=True)
class Replayed(Generic[State]):
    """An aggregate folded up to a point: the events applied, and those skipped as readers skip them."""

    state: State | None
    applied: tuple[LoggedEvent, ...]
    skipped: tuple[SkippedEvent, ...]


def events_of(events: Iterable[LoggedEvent], kind: AnyKind, identity: str) -> list[LoggedEvent]:
    """One aggregate's events in log order; :class:`NotInLogError` if none."""
    key = kind.key(identity)
    mine = [logged for logged in events if logged.event.key == key]
    if not mine:
        raise NotInLogError(f"no event of {kind.name} {identity!r} in the log")
    return mine


def fold_until(
    history: Iterable[LoggedEvent], kind: AggregateKind[State, Any, Any, Any], point: Point | None = None
) -> Replayed[State]:
    """Fold one aggregate's events in log order up to ``point`` (``None``: all of them), skipping
    what every reader skips."""
    state: State | None = None
    applied: list[LoggedEvent] = []
    skipped: list[SkippedEvent] = []
    for logged in history:
        if point is not None and point.passed_by(logged):
            break
        event = logged.event
        after = fold_step(kind, state, event)
        if isinstance(after, Skipped):
            reason = after.detail
            if after.why is Skip.TAKEN:
                again = any(a.event.event_id == event.event_id for a in applied)
                reason = f"{'duplicate' if again else 'conflict'}: {reason}"
            skipped.append(SkippedEvent(logged, reason))
            continue
        state = after
        applied.append(logged)
    return Replayed(state, tuple(applied), tuple(skipped))


def _at(
    history: list[LoggedEvent], kind: AggregateKind[State, Any, Any, Any], identity: str, point: Point | None
) -> Replayed[State]:
    replayed = fold_until(history, kind, point)
    if replayed.state is None:
        raise NotInLogError(f"{kind.name} {identity!r} {_VIEWS[kind.name].not_yet} at {point}")
    return replayed


def timeline(replayed: Replayed[Job], until: datetime | None = None) -> list[JsonObject]:
    """Each state the job entered: when, why (the event and its reason), and for how long.

    The last state lasts until ``until`` (default: the last event applied) and is ``ongoing``
    unless it is terminal.
    """
    job = replayed.state
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


def _point_of(replayed: Replayed[Any], view: _View[Any]) -> JsonObject:
    state = replayed.state
    assert state is not None
    last = replayed.applied[-1]
    return {
        "seq": state.seq,
        "at": last.event.occurred_at.isoformat(),
        "position": last.position,
        **view.status(state),
    }


def node_timeline(replayed: Replayed[NodeRecord], until: datetime | None = None) -> list[JsonObject]:
    """Each change of the node: what it became (status, capacity, cordon), when, by which event and
    why, and for how long it stayed so.

    A rejected node command changes nothing and makes no row. No status is final (a removed node
    may join again), so the last row lasts until ``until`` (default: the last event applied) and
    is ``ongoing``.
    """
    assert replayed.applied
    changes: list[tuple[LoggedEvent, NodeRecord]] = []
    node: NodeRecord | None = None
    for logged in replayed.applied:  # the node's events (fold_until applied them to the node)
        node = NODES.evolve(node, cast(NodeEvent, logged.event))
        if not isinstance(logged.event.data, nd.NodeCommandRejected):
            changes.append((logged, node))
    end = until or replayed.applied[-1].event.occurred_at
    rows = []
    for index, (logged, after) in enumerate(changes):
        event = logged.event
        last = index + 1 == len(changes)
        left_at = None if last else changes[index + 1][0].event.occurred_at
        document = node_document(after)
        rows.append(
            {
                "seq": event.seq,
                "status": document["status"],
                "entered_at": event.occurred_at.isoformat(),
                "left_at": left_at.isoformat() if left_at else None,
                "duration_s": ((left_at or end) - event.occurred_at).total_seconds(),
                "ongoing": last,
                "event": event.type,
                "position": logged.position,
                # a resize keeps the reason of the node's last presence or cordon change: give its own
                "reason": event.data.reason if isinstance(event.data, nd.NodeResized) else after.reason,
                "spec": after.spec.model_dump(mode="json"),
                "cordon": document["cordon"],
            }
        )
    return rows


@dataclass(frozen=True, slots=True)
class _View(Generic[State]):
    """How a replay shows one kind: the aggregate's names, its status in a word, its document (as
    the projections store it) and its timeline, and what to say of it before it existed."""

    names: Callable[[str, State], JsonObject]
    status: Callable[[State], JsonObject]
    document: Callable[[State], JsonObject]
    timeline: Callable[[Replayed[State], datetime | None], list[JsonObject]]
    not_yet: str


_VIEWS: dict[str, _View[Any]] = {
    JOBS.name: _View(
        names=lambda job_id, job: {"job_id": job_id, "tenant": job.tenant},
        status=lambda job: {"state": str(job.state)},
        document=job_document,
        timeline=timeline,
        not_yet="did not exist yet",
    ),
    NODES.name: _View(
        names=lambda name, _: {"node": name},
        status=lambda node: {"status": str(node.status)},
        document=node_document,
        timeline=node_timeline,
        not_yet="had not joined yet",
    ),
}


def replay(
    events: Iterable[LoggedEvent], kind: AnyKind, identity: str, until: Point | None = None
) -> JsonObject:
    """A job's or a node's state at ``until`` (default: the end of the log), its timeline and what
    was skipped."""
    history = events_of(events, kind, identity)
    replayed = _at(history, kind, identity, until)
    view = _VIEWS[kind.name]
    return {
        **view.names(identity, replayed.state),
        "until": str(until) if until else None,
        "point": _point_of(replayed, view),
        "events": {"in_log": len(history), "applied": len(replayed.applied)},
        "skipped": [skip.as_json() for skip in replayed.skipped],
        "state": view.document(replayed.state),
        "timeline": view.timeline(replayed, until.at if until else None),
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
    history = events_of(events, JOBS, job_id)
    a, b = _at(history, JOBS, job_id, first), _at(history, JOBS, job_id, second)
    assert a.state is not None and b.state is not None
    doc_a, doc_b = job_document(a.state), job_document(b.state)
    uris_a = {c["uri"] for c in doc_a["checkpoints"]}
    uris_b = {c["uri"] for c in doc_b["checkpoints"]}
    low, high = sorted((a.state.seq, b.state.seq))
    longer = b if len(b.applied) >= len(a.applied) else a
    between = [logged.event.type for logged in longer.applied if low < logged.event.seq <= high]
    return {
        "job_id": job_id,
        "from": {"until": str(first), **_point_of(a, _VIEWS[JOBS.name])},
        "to": {"until": str(second), **_point_of(b, _VIEWS[JOBS.name])},
        "changes": _changes(doc_a, doc_b),
        "checkpoints": {
            "added": [c for c in doc_b["checkpoints"] if c["uri"] not in uris_a],
            "removed": [c for c in doc_a["checkpoints"] if c["uri"] not in uris_b],
        },
        "transitions": [row for row in timeline(longer) if low < row["seq"] <= high],
        "events_between": dict(sorted(Counter(between).items())),
    }


# -- verifying ------------------------------------------------------------------------------------


def undecodable_finding(record: UndecodableRecord) -> Violation:
    """A record that is no event, as a finding on the job or node its key names."""
    node = record.key.removeprefix(NODE_KEY_PREFIX) if record.key.startswith(NODE_KEY_PREFIX) else None
    job_id = record.key if node is None and record.key else None
    return Violation(ViolationKind.UNDECODABLE, job_id, record.position, record.reason, node=node)


def _finding(violation: Violation) -> JsonObject:
    return {
        "kind": str(violation.kind),
        "job_id": violation.job_id,
        "node": violation.node,
        "position": violation.position,
        "detail": violation.detail,
    }


def verify_events(
    events: Iterable[LoggedEvent], source: str, undecodable: Sequence[UndecodableRecord] = ()
) -> JsonObject:
    """Every invariant of architecture §5 over a log in its order, jobs and nodes; each violation with its
    job or node and position. ``undecodable``: the log's records that are no event, each a finding."""
    checker = InvariantChecker()
    with cyclic_gc_paused():
        for logged in events:
            checker.feed(logged.event, logged.position, partition=logged.partition)
    findings = [*map(undecodable_finding, undecodable), *checker.finish()]
    return {
        "source": source,
        "events": checker.events,
        "jobs": len(checker.jobs),
        "nodes": len(checker.nodes),
        "duplicates": checker.duplicates,
        "undecodable": len(undecodable),
        "violations": [_finding(violation) for violation in findings],
    }


async def verify_log(settings: Settings, bus_url: str | None = None) -> JsonObject:
    """:func:`verify_events` over a bus (default: the configured one), partitions merged by time."""
    url = bus_url or settings.bus_url
    topic_log = await read_bus(url, settings.partitions, events_topic(settings))
    return verify_events(topic_log.events, url, topic_log.undecodable)


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
    statuses = Counter(str(node["status"]) for node in projection.nodes())
    return {
        "events": read,
        "applied": applied,
        "ignored": read - applied,
        "jobs": sum(states.values()),
        "tenants": len(tenants),
        "states": dict(sorted(states.items())),
        "nodes": sum(statuses.values()),
        "node_statuses": dict(sorted(statuses.items())),
        "path": str(path),
    }


def rebuild_file(log_path: Path | str, out: Path, workers: int | None = None) -> JsonObject:
    """Fold every event of a log file into a new projection file at ``out``; returns the counts.

    A file is folded by ``workers`` processes (default: one per CPU) while this one writes SQLite
    (:mod:`ffdl.tools.file_rebuild`); standard input, which can be read only once, in this process.
    """
    projection = _fresh(out)
    try:
        if str(log_path) == STDIO:
            tally = _Tally(line.canonical for line in read_lines(log_path))
            applied = rebuild(projection, tally)
            read = tally.count
        else:
            folders = workers or os.cpu_count() or 1
            read, applied = rebuild_file_in_processes(projection, Path(log_path), folders)
        report = _summary(projection, out, read, applied)
    finally:
        projection.close()
    log.info("projections rebuilt", log=str(log_path), path=str(out), events=read, applied=applied)
    return report


async def rebuild_projections(
    settings: Settings, bus_url: str | None = None, out: Path | None = None
) -> JsonObject:
    """Rebuild the projections from a bus into a new file and compare with the live projections.

    Default: the configured bus, into ``projections.rebuilt.sqlite`` beside the live file (replaced
    if there), compared with the live projection (``identical``: None when there is none, or when
    the bus is not the configured one). Records that are no event are counted (``undecodable``);
    the live projector dead-letters them, so neither projection holds them.
    """
    url = bus_url or settings.bus_url
    topic_log = await read_bus(url, settings.partitions, events_topic(settings))
    events = topic_log.events
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
    return {**report, "source": url, "undecodable": len(topic_log.undecodable), "identical": identical}
