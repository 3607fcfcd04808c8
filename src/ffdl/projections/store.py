"""The read models in one SQLite file: jobs, nodes, their histories, and the applied log positions.

``apply`` folds a batch of events and, in the same transaction, stores the position it reached
per partition (exactly-once folding: a batch is either wholly applied with its positions or not
at all, and records below a stored position are skipped when redelivered). Events whose seq is
already taken (a redelivery, or a stale owner's conflicting write) are ignored and counted.
The cluster GPU map and the queue are queries over the jobs table, not tables of their own.

Writers: one projector per file. Readers: any number, each with its own connection (WAL).

Each file has a :attr:`Projection.replica` id of its own, made when the file is made: the projector
that folds into the file consumes in a consumer group named after it, so every projection file
(each API replica's own, a rebuilt one put in place of the live one) is folded from every
partition of the log, from the start, and resumes where that same file left off.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from ffdl.core.aggregate import AggregateKind, Aggregates, AggregateState, Skipped, fold_step
from ffdl.core.collector import cyclic_gc_paused
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS, KINDS, NODES
from ffdl.core.nodes import NodeRecord
from ffdl.events.codec import (
    AnyEvent,
    any_event_from_json,
    built_event,
    event_to_json,
    trusted_any_event_from_json,
)
from ffdl.events.position import Position
from ffdl.events.reports import loads_finite
from ffdl.projections.documents import (
    JsonObject,
    charges_on,
    counts_as_gpus,
    dumps,
    job_document,
    node_document,
    why_summary,
)

#: The current states: jobs, nodes; and how far the projection has read each partition.
_STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    queued_at TEXT,
    labels TEXT NOT NULL,
    document TEXT NOT NULL
);
-- An admin's unfiltered list (the dashboard's first page) in submission order, without a sort of every job.
CREATE INDEX IF NOT EXISTS jobs_by_submission ON jobs (submitted_at, job_id);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, submitted_at, job_id);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, submitted_at, job_id);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    document TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS positions (
    partition INTEGER PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS replica (
    only INTEGER PRIMARY KEY CHECK (only = 0),
    id TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """A job's or a node's event with where it sits in the log.

    ``body``, when a reader has it at hand, is the event's JSON exactly as ``event_to_json`` gives it;
    the history row stores it as is instead of serialising the event again.
    """

    event: AnyEvent
    partition: int
    offset: int
    body: str | None = None

    @property
    def position(self) -> str:
        return Position.format_token(self.partition, self.offset)

    @classmethod
    def of_record(cls, value: bytes, partition: int, offset: int) -> LoggedEvent:
        """The event of a record of the events topic, decoded on the trusted path; a record of the
        current schema version as its owner wrote it (``event_to_json``) is its own ``body``, an older
        one is upcast and serialised again when stored. Raises ``DecodeError`` for a record that is
        no event."""
        event = built_event(value)
        if event is not None:
            return cls(event, partition, offset, value.decode())
        return cls(any_event_from_json(value), partition, offset)


S = TypeVar("S", bound=AggregateState)


@dataclass(frozen=True, slots=True)
class _Tables:
    """Where the projection keeps one aggregate kind: each aggregate's events in ``history``, keyed
    by ``id_column`` and seq, and its current state in ``current`` (``columns`` wide), keyed by
    ``current_key``, in the row ``row`` makes of it (None: the aggregate has no row, as a deleted job)."""

    kind: AggregateKind[Any, Any, Any, Any]
    history: str
    id_column: str
    current: str
    current_key: str
    columns: int
    row: Callable[[Any], tuple[Any, ...] | None]


def _job_row(job: Job) -> tuple[Any, ...] | None:
    """A job's row; a deleted job has none."""
    if job.deleted:
        return None
    document = job_document(job)
    queued_at = next((e.at.isoformat() for e in reversed(job.history) if str(e.state) == "QUEUED"), None)
    return (
        job.job_id,
        job.tenant,
        job.spec.name,
        str(job.state),
        job.spec.priority,
        job.submitted_at.isoformat(),
        job.updated_at.isoformat(),
        queued_at,
        json.dumps(job.spec.labels, sort_keys=True),
        dumps(document),
    )


def _node_row(node: NodeRecord) -> tuple[Any, ...]:
    return (node.name, str(node.status), dumps(node_document(node)))


_TABLES = {
    tables.kind.name: tables
    for tables in (
        _Tables(JOBS, "history", "job_id", "jobs", "job_id", 10, _job_row),
        _Tables(NODES, "node_history", "node", "nodes", "name", 3, _node_row),
    )
}

#: An aggregate's id and the row of its current state (None: it has no row, as a deleted job).
StateRow = tuple[str, tuple[Any, ...] | None]


@dataclass(slots=True)
class Rows:
    """What folding a stretch of the log writes, by kind name: the history rows of the events applied,
    in log order, and the rows of the aggregates they changed; and the positions reached per
    partition, and how many events were ignored (a seq taken, one after a gap, an illegal one).

    :meth:`Projection.apply` folds a batch into rows and writes them in one transaction; a rebuild
    may fold elsewhere and hand its rows to :meth:`Projection.write`.
    """

    history: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {name: [] for name in _TABLES})
    states: dict[str, list[StateRow]] = field(default_factory=lambda: {name: [] for name in _TABLES})
    positions: dict[int, int] = field(default_factory=dict)
    ignored: int = 0

    def add_states(self, kind: AggregateKind[S, Any, Any, Any], states: Mapping[str, S]) -> None:
        """The rows of ``kind``'s aggregates in ``states`` (by id), as they are now."""
        row = _TABLES[kind.name].row
        self.states[kind.name] += [(identity, row(state)) for identity, state in states.items()]


class Positions:
    """How far the log has been read per partition, from where a stretch of it began (``stored``):
    a record below that was applied before (a redelivery) and is skipped, so each applies once."""

    def __init__(self, stored: Mapping[int, int]) -> None:
        self.stored = dict(stored)
        self.reached = dict(stored)

    def admits(self, partition: int, offset: int) -> bool:
        """Whether the record at ``partition:offset`` is to be folded; ``reached`` counts it either way."""
        if offset < self.stored.get(partition, 0):
            return False
        if offset >= self.reached.get(partition, 0):
            self.reached[partition] = offset + 1
        return True


def _history_schema(tables: _Tables) -> str:
    """The history table of one kind: each event's columns and body, by aggregate and seq."""
    return f"""
CREATE TABLE IF NOT EXISTS {tables.history} (
    {tables.id_column} TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    position TEXT NOT NULL,
    causation_id TEXT,
    body TEXT NOT NULL,
    PRIMARY KEY ({tables.id_column}, seq)
);
CREATE INDEX IF NOT EXISTS {tables.history}_by_cause ON {tables.history} (causation_id);
"""


SCHEMA = _STATE_SCHEMA + "".join(_history_schema(tables) for tables in _TABLES.values())


def _as_stored(moment: datetime) -> str:
    """The aware ``moment`` as the rows keep their instants (UTC, ``isoformat``), so that comparing
    the text compares the times: a filter written another way ("...Z", another offset, fewer
    digits) would sort against the rows by its spelling."""
    return moment.astimezone(UTC).isoformat()


#: How long a connection waits for another process's lock before it gives up.
BUSY_TIMEOUT_S = 30.0


def _open_wal(path: Path) -> sqlite3.Connection:
    """A connection to the file at ``path`` in write-ahead-log mode.

    Several processes open a new data directory's projection at once (the API's workers, the
    projector, the scheduler). Turning a file to WAL upgrades a read lock to the write lock, and
    where another process holds the write lock then, SQLite answers "database is locked" at once
    rather than wait (waiting could deadlock), busy timeout or not: a scheduler died of it on start.
    The mode belongs to the file, so the switch is tried again until the busy timeout has passed.
    """
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True)
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    try:
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


class Projection:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._folded = Aggregates(KINDS)  # what was folded last, so a batch need not fold it again
        self._version_db: sqlite3.Connection | None = None
        with self._connection() as db:
            db.executescript(SCHEMA)
            db.execute("INSERT OR IGNORE INTO replica VALUES (0, ?)", (uuid.uuid4().hex[:12],))
            self.replica: str = db.execute("SELECT id FROM replica").fetchone()[0]
        # While bulk loading a file that held no event, the file holds only what this instance folded,
        # all of it in ``_folded``: an aggregate not there has no history to read.
        self._folded_all = False

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = _open_wal(self.path)
            self._local.db = db
        yield db

    # -- writing ---------------------------------------------------------------------------------

    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """For folding a whole log into a new, empty projection file, at the speed of the fold.

        The secondary indexes are dropped, and built again once at the end instead of updated row by
        row (the causation index, on random command ids, is the costliest part of a large rebuild:
        its inserts land all over the tree). The file is written without syncing (a rebuild cut short
        by a crash leaves a file to throw away, as it was new). Aggregates are read from what this
        instance folded, never from the file. The rows, and so :meth:`dump`, are the same; queries
        are slower until the end.
        """
        with self._connection() as db:
            indexes = db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
            names = [name for (name,) in indexes.fetchall()]
            for name in names:
                db.execute(f'DROP INDEX "{name}"')
            fresh = not any(
                db.execute(f"SELECT 1 FROM {tables.history} LIMIT 1").fetchone()
                for tables in _TABLES.values()
            )
            self._folded_all = fresh
            if fresh:
                db.execute("PRAGMA synchronous=OFF")
        try:
            yield
        finally:
            with self._connection() as db:
                if fresh:
                    db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(SCHEMA)
            self._folded_all = False

    def positions(self) -> dict[int, int]:
        with self._connection() as db:
            return {p: o for p, o in db.execute("SELECT partition, next_offset FROM positions")}

    def apply(self, batch: Sequence[LoggedEvent]) -> int:
        """Fold a batch in one transaction; returns how many events were applied."""
        if not batch:
            return 0
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                rows, changed = self._fold(db, batch)
                self._write(db, rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                self._folded = Aggregates(KINDS)  # it may hold what the rollback undid
                self._folded_all = False
                raise
        for kind in KINDS:
            self._folded.of(kind).update(changed.of(kind))
        return sum(len(history) for history in rows.history.values())

    def write(self, rows: Rows) -> None:
        """Write rows folded elsewhere (by a rebuild's processes) in one transaction.

        What this instance folded no longer describes the file, so it reads aggregates from the file
        from now on."""
        self._folded = Aggregates(KINDS)
        self._folded_all = False
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                self._write(db, rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _fold(self, db: sqlite3.Connection, batch: Sequence[LoggedEvent]) -> tuple[Rows, Aggregates]:
        """The rows of the batch folded onto the file's aggregates, and the aggregates it changed."""
        positions = Positions({p: o for p, o in db.execute("SELECT partition, next_offset FROM positions")})
        changed = Aggregates(KINDS)
        books = {kind.name: changed.of(kind) for kind in KINDS}
        rows = Rows()
        for logged in batch:
            if not positions.admits(logged.partition, logged.offset):
                continue
            event = logged.event
            kind = KINDS.of(event)
            identity = kind.identity(event)
            states = books[kind.name]
            before = states.get(identity)
            if before is None:
                before = self._load(db, kind, identity)
            after = fold_step(kind, before, event)
            if isinstance(after, Skipped):
                rows.ignored += 1
                continue
            states[identity] = after
            rows.history[kind.name].append(history_row(identity, logged))
        for kind in KINDS:
            rows.add_states(kind, changed.of(kind))
        rows.positions = positions.reached
        return rows, changed

    @staticmethod
    def _write(db: sqlite3.Connection, rows: Rows) -> None:
        """Write rows with one prepared statement per table (``executemany``)."""
        for name, tables in _TABLES.items():
            db.executemany(
                f"INSERT INTO {tables.history} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows.history[name]
            )
            states = rows.states[name]
            marks = ", ".join("?" * tables.columns)
            db.executemany(
                f"INSERT OR REPLACE INTO {tables.current} VALUES ({marks})",
                [row for _, row in states if row is not None],
            )
            db.executemany(
                f"DELETE FROM {tables.current} WHERE {tables.current_key} = ?",
                [(identity,) for identity, row in states if row is None],
            )
        db.executemany("INSERT OR REPLACE INTO positions VALUES (?, ?)", sorted(rows.positions.items()))
        if rows.ignored:
            db.execute(
                "INSERT INTO counters VALUES ('ignored_events', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (rows.ignored,),
            )

    def _load(self, db: sqlite3.Connection, kind: AggregateKind[S, Any, Any, Any], identity: str) -> S | None:
        """The aggregate as its projected events fold."""
        state = self._folded.of(kind).get(identity)
        if state is not None or self._folded_all:
            return state
        tables = _TABLES[kind.name]
        query = f"SELECT body FROM {tables.history} WHERE {tables.id_column} = ? ORDER BY seq"
        for (body,) in db.execute(query, (identity,)):
            state = kind.evolve(state, trusted_any_event_from_json(body))
        return state

    # -- reading ---------------------------------------------------------------------------------

    def get(self, job_id: str) -> JsonObject | None:
        document = self.get_document(job_id)
        return loads_finite(document) if document is not None else None

    def get_document(self, job_id: str) -> str | None:
        """The job's document as stored (JSON text), for readers that pass it on unparsed."""
        with self._connection() as db:
            row = db.execute("SELECT document FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return str(row[0]) if row else None

    def list_jobs(self, **filters: Any) -> list[JsonObject]:
        return [loads_finite(document) for document in self.list_documents(**filters)]

    def list_documents(
        self,
        *,
        tenant: str | None = None,
        states: Sequence[str] = (),
        label: tuple[str, str] | None = None,
        submitted_since: datetime | None = None,
        submitted_until: datetime | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 50,
        newest_first: bool = True,
    ) -> list[str]:
        """Jobs matching the filters (times aware), in submission order, continuing after the
        cursor ``after``."""
        clauses, params = [], []  # type: tuple[list[str], list[Any]]
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if states:
            clauses.append(f"state IN ({','.join('?' * len(states))})")
            params.extend(states)
        if label is not None:
            clauses.append("json_extract(labels, ?) = ?")
            params.extend([f'$."{label[0]}"', label[1]])
        if submitted_since is not None:
            clauses.append("submitted_at >= ?")
            params.append(_as_stored(submitted_since))
        if submitted_until is not None:
            clauses.append("submitted_at < ?")
            params.append(_as_stored(submitted_until))
        if after is not None:
            clauses.append(
                "(submitted_at, job_id) < (?, ?)" if newest_first else "(submitted_at, job_id) > (?, ?)"
            )
            params.extend(after)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT document FROM jobs {where} ORDER BY submitted_at {order}, job_id {order} LIMIT ?"
        with self._connection() as db:
            return [str(doc) for (doc,) in db.execute(sql, (*params, limit))]

    def history(
        self, kind: AggregateKind[Any, Any, Any, Any], identity: str, after_seq: int = 0, limit: int = 1000
    ) -> list[JsonObject]:
        """The aggregate's events after ``after_seq``, each with its log position."""
        tables = _TABLES[kind.name]
        with self._connection() as db:
            rows = db.execute(
                f"SELECT body, position FROM {tables.history} WHERE {tables.id_column} = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (identity, after_seq, limit),
            ).fetchall()
        return [{**loads_finite(body), "position": position} for body, position in rows]

    def caused(
        self, kind: AggregateKind[Any, Any, Any, Any], identity: str, causation_id: str
    ) -> list[JsonObject]:
        """The aggregate's events that the command ``causation_id`` caused, each with its log
        position: found by the causation index, whatever the length of the aggregate's history."""
        tables = _TABLES[kind.name]
        with self._connection() as db:
            rows = db.execute(
                f"SELECT body, position FROM {tables.history} WHERE causation_id = ? AND "
                f"{tables.id_column} = ? ORDER BY seq",
                (causation_id, identity),
            ).fetchall()
        return [{**loads_finite(body), "position": position} for body, position in rows]

    def state(self, kind: AggregateKind[S, Any, Any, Any], identity: str) -> S | None:
        """The aggregate as its projected events fold: what a writer asks a decider about."""
        with self._connection() as db:
            return self._load(db, kind, identity)

    def position_of_cause(self, causation_id: str) -> str | None:
        """The log position of the first event a command caused (read-your-writes for a write)."""
        with self._connection() as db:
            for tables in _TABLES.values():
                row = db.execute(
                    f"SELECT position FROM {tables.history} WHERE causation_id = ? ORDER BY seq LIMIT 1",
                    (causation_id,),
                ).fetchone()
                if row:
                    return str(row[0])
        return None

    def changed_jobs(
        self, after: int, limit: int = 500, tenant: str | None = None
    ) -> tuple[int, list[tuple[str, str]], dict[str, str]]:
        """Jobs that changed since history row ``after`` (its rowid; 0: from the start): the last
        row read (what a follower of the job list asks after next), the current documents of those
        that changed as stored, by job id (``tenant``'s alone, if given), and the
        ids of those deleted from the listings with their tenants (from their first event: the
        document that named it is gone), so a follower is shown only its own.
        Rows only ever append, so the rowid is a cursor over every change in projection order."""
        with self._connection() as db:
            rows = db.execute(
                "SELECT rowid, job_id FROM history WHERE rowid > ? ORDER BY rowid LIMIT ?", (after, limit)
            ).fetchall()
            if not rows:
                return after, [], {}
            changed = sorted({job_id for _, job_id in rows})
            listed = db.execute(
                f"SELECT job_id, tenant, document FROM jobs WHERE job_id IN ({','.join('?' * len(changed))})",
                changed,
            ).fetchall()
            found = [(job_id, doc) for job_id, owner, doc in listed if tenant is None or owner == tenant]
            gone = sorted(set(changed) - {job_id for job_id, _, _ in listed})
            owners = (
                dict(
                    db.execute(
                        f"SELECT job_id, json_extract(body, '$.tenant') FROM history"
                        f" WHERE seq = 1 AND job_id IN ({','.join('?' * len(gone))})",
                        gone,
                    ).fetchall()
                )
                if gone
                else {}
            )
        return int(rows[-1][0]), found, {job_id: str(owners.get(job_id, "")) for job_id in gone}

    def last_change(self) -> int:
        """The cursor of :meth:`changed_jobs` at the present (the last history row)."""
        with self._connection() as db:
            row = db.execute("SELECT MAX(rowid) FROM history").fetchone()
        return int(row[0] or 0)

    def cluster_change(self) -> tuple[int, ...]:
        """Where each kind's history ends now (jobs', nodes'): it moves whenever a job or a node
        changes, which is when the cluster's picture may look different."""
        with self._connection() as db:
            ends = [
                db.execute(f"SELECT MAX(rowid) FROM {tables.history}").fetchone()[0]
                for tables in _TABLES.values()
            ]
        return tuple(int(end or 0) for end in ends)

    def logged_places_after(
        self, cursor: tuple[int, ...]
    ) -> tuple[str, tuple[int, ...], list[KeptEntry]] | None:
        """The file's replica id, where each event (jobs' and nodes') applied after ``cursor`` (each
        kind's last history row read; ``()``: from the start) sits in time order and in the file,
        without the event, and the cursor after them: the log as the API may read it for the time
        machine, without a bus reader of its own (:class:`KeptLog`). None when a kind has fewer
        rows than ``cursor`` says were read: the file is another (rebuilt).

        One read transaction for all of it, so every query sees the same commits: read apart, a
        commit between the rows and the count of them once moved the cursor past rows never read."""
        start = cursor or (0,) * len(_TABLES)
        entries: list[KeptEntry] = []
        ends = []
        with self._connection() as db:
            db.execute("BEGIN")
            try:
                replica: str = db.execute("SELECT id FROM replica").fetchone()[0]
                for table, (tables, after) in enumerate(zip(_TABLES.values(), start, strict=True)):
                    top = db.execute(f"SELECT MAX(rowid) FROM {tables.history}").fetchone()[0]
                    if int(top or 0) < after:
                        return None
                    found = db.execute(
                        f"SELECT rowid, occurred_at, position FROM {tables.history} "
                        "WHERE rowid > ? ORDER BY rowid",
                        (after,),
                    ).fetchall()
                    ends.append(found[-1][0] if found else after)
                    for rowid, occurred_at, position in found:
                        # one command's events share their instant: their offsets order them, as numbers
                        # ("2:10" sorts before "2:9" as text, and a job's fold would stop at the event
                        # out of its order)
                        partition, offset = Position.parse_token(position)
                        entries.append(
                            KeptEntry(occurred_at, partition, offset, table, rowid, instant_of(occurred_at))
                        )
            finally:
                db.execute("COMMIT")
        return replica, tuple(ends), entries

    def logged_bodies(self, table: int, rowids: Sequence[int]) -> tuple[str, dict[int, tuple[str, str]]]:
        """The file's replica id, and the position and body of each row of ``rowids`` in the history
        of the ``table``-th kind (:class:`KeptEntry`); a row this file does not have is left out."""
        history = list(_TABLES.values())[table].history
        marks = ",".join("?" * len(rowids))
        with self._connection() as db:
            db.execute("BEGIN")
            try:
                replica: str = db.execute("SELECT id FROM replica").fetchone()[0]
                found = db.execute(
                    f"SELECT rowid, position, body FROM {history} WHERE rowid IN ({marks})", tuple(rowids)
                ).fetchall()
            finally:
                db.execute("COMMIT")
        return replica, {rowid: (position, body) for rowid, position, body in found}

    def nodes(self) -> list[JsonObject]:
        """Every node the inventory ever had (removed ones too, with their status), by name."""
        with self._connection() as db:
            rows = db.execute("SELECT document FROM nodes ORDER BY name").fetchall()
        return [loads_finite(doc) for (doc,) in rows]

    def node(self, name: str) -> JsonObject | None:
        with self._connection() as db:
            row = db.execute("SELECT document FROM nodes WHERE name = ?", (name,)).fetchone()
        return loads_finite(row[0]) if row else None

    def reached(self, partition: int, offset: int) -> bool:
        """Whether the event at ``partition:offset`` has been applied."""
        with self._connection() as db:
            row = db.execute("SELECT next_offset FROM positions WHERE partition = ?", (partition,)).fetchone()
        return bool(row and row[0] > offset)

    def tenants_of(self, job_ids: Iterable[str]) -> dict[str, str]:
        """The tenant of each of ``job_ids`` the projection has seen: a deleted job's from its first
        event, which the history keeps (a reason may still name it, and who owned it decides who
        may read its id)."""
        wanted = sorted(set(job_ids))
        found: dict[str, str] = {}
        with self._connection() as db:
            for query in (
                "SELECT job_id, tenant FROM jobs WHERE job_id IN ({marks})",
                "SELECT job_id, json_extract(body, '$.tenant') FROM history"
                " WHERE seq = 1 AND job_id IN ({marks})",
            ):
                for start in range(0, len(wanted), 500):
                    chunk = [job for job in wanted[start : start + 500] if job not in found]
                    if chunk:
                        rows = db.execute(query.format(marks=",".join("?" * len(chunk))), chunk)
                        found.update(rows.fetchall())
        return found

    def holdings(self) -> list[JsonObject]:
        """Jobs that hold GPUs now, with their placement: the cluster GPU map's source."""
        with self._connection() as db:
            rows = db.execute(
                "SELECT document FROM jobs WHERE json_extract(document, '$.placement') IS NOT NULL "
                "ORDER BY job_id"
            ).fetchall()
        return [loads_finite(doc) for (doc,) in rows]

    def queue(self) -> list[JsonObject]:
        """QUEUED jobs in the order the scheduler considers them (priority, then time queued)."""
        with self._connection() as db:
            rows = db.execute(
                "SELECT document FROM jobs WHERE state = 'QUEUED' ORDER BY priority DESC, queued_at, job_id"
            ).fetchall()
        return [loads_finite(doc) for (doc,) in rows]

    def ignored_events(self) -> int:
        with self._connection() as db:
            row = db.execute("SELECT value FROM counters WHERE name = 'ignored_events'").fetchone()
        return int(row[0]) if row else 0

    def why(self, job_id: str) -> JsonObject | None:
        """Why the job is pending: the scheduler's recorded reason, its place in the queue (by
        priority, then time queued; within its tenant that is exactly the scheduler's order), and
        what its tenant holds. For a job that no longer waits, its state and the reason it has."""
        document = self.get(job_id)
        if document is None:
            return None
        answer: JsonObject = {
            "job_id": job_id,
            "tenant": document["tenant"],
            "state": document["state"],
            "reason": document["reason"],
            "priority": document["spec"]["priority"],
            "waiting": document["waiting"] if document["state"] == "QUEUED" else None,
        }
        if document["state"] == "QUEUED":
            answer.update(self._queue_place(job_id, document))
        answer["summary"] = why_summary(answer)
        return answer

    def _queue_place(self, job_id: str, document: JsonObject) -> JsonObject:
        ahead = "(priority > ? OR (priority = ? AND (queued_at < ? OR (queued_at = ? AND job_id < ?))))"
        queued = f"SELECT COUNT(*) FROM jobs WHERE state = 'QUEUED' AND {ahead}"
        priority = document["spec"]["priority"]
        tenant = document["tenant"]
        with self._connection() as db:
            queued_at = db.execute("SELECT queued_at FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0]
            key = (priority, priority, queued_at, queued_at, job_id)
            before = db.execute(queued, key).fetchone()[0]
            tenant_before = db.execute(f"{queued} AND tenant = ?", (*key, tenant)).fetchone()[0]
            length = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'QUEUED'").fetchone()[0]
        holdings = [job for job in self.holdings() if job["tenant"] == tenant]
        charges = charges_on(self.nodes())
        return {
            "position": before + 1,
            "tenant_position": tenant_before + 1,
            "queue_length": length,
            "tenant_gpus_held": sum(len(learner["gpus"]) for job in holdings for learner in job["placement"]),
            # what quotas and fair share count (GPU-equivalents): more than the GPUs where its jobs
            # ask much CPU or memory per GPU
            "tenant_counts_as_gpus": round(sum(counts_as_gpus(job, charges) for job in holdings), 3),
        }

    def counts(self) -> dict[tuple[str, str], int]:
        with self._connection() as db:
            rows = db.execute("SELECT tenant, state, COUNT(*) FROM jobs GROUP BY tenant, state").fetchall()
        return {(tenant, state): count for tenant, state, count in rows}

    def dump(self) -> str:
        """Every row of every table in a fixed order: equal dumps mean equal projections."""
        with self._connection() as db:
            lines = []
            for table, order in (
                ("jobs", "job_id"),
                ("history", "job_id, seq"),
                ("nodes", "name"),
                ("node_history", "node, seq"),
                ("positions", "partition"),
                ("counters", "name"),
            ):
                for row in db.execute(f"SELECT * FROM {table} ORDER BY {order}"):
                    lines.append(f"{table}\t{json.dumps(list(row))}")
        return "\n".join(lines)

    def version(self) -> int | None:
        """The file's version: it changes with every transaction another connection commits, whichever
        process made it (SQLite's ``PRAGMA data_version``), so a reader in any process learns that the
        projector folded something without asking it.

        A read of the WAL index in shared memory (microseconds), on a connection of its own (one does
        not see its own commits in ``data_version``), cheap enough to call on the event loop: it never
        waits for a lock, and answers None (not known now) if the file is busy."""
        if self._version_db is None:
            self._version_db = sqlite3.connect(
                self.path, timeout=0, isolation_level=None, check_same_thread=False
            )
        try:
            return int(self._version_db.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.OperationalError:
            return None

    def close(self) -> None:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        if self._version_db is not None:
            self._version_db.close()
            self._version_db = None


def history_row(identity: str, logged: LoggedEvent) -> tuple[Any, ...]:
    """A history row: the aggregate, seq, event id, type, time, position, cause and JSON body."""
    event = logged.event
    causation_id = event.causation_id
    return (
        identity,
        event.seq,
        str(event.event_id),
        event.type,
        event.occurred_at.isoformat(),
        logged.position,
        str(causation_id) if causation_id else None,
        logged.body if logged.body is not None else event_to_json(event).decode(),
    )


#: the rows a kept log decodes at a time: a fold of the whole log never holds it all decoded, and a
#: query names at most this many (SQLite's oldest limit on a statement's parameters is 999)
DECODE_BATCH = 500

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def instant_of(when: str | datetime) -> int:
    """An instant as microseconds since the epoch, to compare exactly as the datetimes compare (one
    without an offset is UTC, as the API and the SRE tools read it)."""
    moment = datetime.fromisoformat(when) if isinstance(when, str) else when
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


class KeptEntry(NamedTuple):
    """An event of a kept log without the event: its place in the log's time order (the first three
    fields: when it occurred, as stored, then partition and offset, so entries sort in that order),
    where its row is in the projection file (its kind's history, by index, and the rowid), and its
    instant (:func:`instant_of`)."""

    occurred_at: str
    partition: int
    offset: int
    table: int
    rowid: int
    instant: int


class KeptLogChanged(RuntimeError):
    """The projection file a kept log read is no longer the one it reads now: it was replaced (a
    rebuilt one put in its place) since; :meth:`KeptLog.forget` and read again."""


class KeptLog:
    """The projection's events in time order, kept by a reader that asks again and again (the time
    machine): each read takes only the rows applied since the last one. It keeps where each event
    is, not the event (about 280 bytes an event; decoded, an event is about 2.9 KB, and a log of a
    million events held 2.9 GB in the API), and the folds decode the events they need
    (:meth:`events`). Decoding the whole log per request took 10 s of a 15 s fold on 200,000
    events, and every request with another moment paid it again.

    A file replaced by another (its replica id differs) is read from its first row again, and
    :attr:`generation` moves on, so that what was folded from the old one is dropped too
    (:class:`~ffdl.projections.timemachine.ClusterAtEnd`)."""

    def __init__(self, projection: Projection) -> None:
        self._projection = projection
        self._cursor: tuple[int, ...] = ()
        self._entries: list[KeptEntry] = []
        self._replica: str | None = None
        #: how many times it started again from a file's first row
        self.generation = 0

    def located(self) -> list[KeptEntry]:
        """Every event the projection applied, in time order (read only: the reader's own list,
        extended at the next read)."""
        read = self._projection.logged_places_after(self._cursor)
        if read is None or self._replica not in (None, read[0]):
            # not the file read before (rebuilt): read it from the start
            self.forget()
            read = self._projection.logged_places_after(())
            assert read is not None
        self._replica, cursor, new = read
        if new:
            self._entries.extend(new)
            self._entries.sort()  # runs of sorted entries: about linear
        self._cursor = cursor
        return self._entries

    def forget(self) -> None:
        """Read the file from its first row at the next :meth:`located` (it was replaced)."""
        self._cursor = ()
        self._entries = []
        self._replica = None
        self.generation += 1

    def events(self, entries: Iterable[KeptEntry]) -> Iterator[LoggedEvent]:
        """The events of ``entries``, decoded, in their order, :data:`DECODE_BATCH` rows at a time.
        Raises :class:`KeptLogChanged` if the file is not the one they were read from, or a row is
        not the event read there (a file rebuilt with more rows than were read is not told
        apart by its length, and its rows would have been folded as the old file's events)."""
        stream = iter(entries)
        while batch := list(islice(stream, DECODE_BATCH)):
            rowids: dict[int, list[int]] = {}
            for entry in batch:
                rowids.setdefault(entry.table, []).append(entry.rowid)
            rows: dict[tuple[int, int], tuple[str, str]] = {}
            for table, wanted in rowids.items():
                replica, found = self._projection.logged_bodies(table, wanted)
                if replica != self._replica:
                    raise KeptLogChanged(f"the projection file is now replica {replica}, not {self._replica}")
                rows.update(((table, rowid), row) for rowid, row in found.items())
            for entry in batch:
                position, body = rows.get((entry.table, entry.rowid), ("", ""))
                if position != Position.format_token(entry.partition, entry.offset):
                    raise KeptLogChanged(
                        f"row {entry.rowid} of the projection's history is not the event read at "
                        f"{entry.partition}:{entry.offset}: the file was replaced"
                    )
                yield LoggedEvent(trusted_any_event_from_json(body.encode()), entry.partition, entry.offset)


def rebuild(projection: Projection, events: Iterable[LoggedEvent], batch_size: int = 10_000) -> int:
    """Fold a whole log into an empty projection; returns the number of events applied."""
    total = 0
    stream = iter(events)
    # folding makes no reference cycle, but what it keeps grows (every job folded so far), and
    # each full collection scanned it all again: 40% of rebuilding a 400,000-event log
    with projection.bulk_load(), cyclic_gc_paused():
        while batch := list(islice(stream, batch_size)):
            total += projection.apply(batch)
    return total
