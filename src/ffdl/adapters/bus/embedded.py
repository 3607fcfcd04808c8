"""The embedded event log: Kafka's semantics in one SQLite file, so handlers run unchanged on Kafka later.

The file holds everything Kafka's brokers would: the records of every topic partition, the members of
every consumer group with their last heartbeat, which member currently holds which partition (its
*claim*), and each group's committed offsets. Several processes may open the same file at once; they
see each other only through it.

Records and offsets
    A record's partition is Kafka's default partitioner of its key (:mod:`.partitioning`). Offsets
    count from 0 per partition with no gaps: ``publish`` appends a batch in one ``BEGIN IMMEDIATE``
    transaction that reads each touched partition's end and inserts after it, so concurrent writers
    (threads or processes) are serialised by SQLite's write lock and a batch is all-or-nothing. The
    file is in WAL mode with ``synchronous=NORMAL``: a committed append survives the process (not
    necessarily a power cut), and readers never block the writer. ``seq``, the table's rowid, is the
    append order over the whole file; a fetch across several partitions returns records in that order,
    which is offset order within each partition and fair between them.

Threads and locks
    Each :class:`EmbeddedBus` owns two SQLite connections, each used only by its own single thread: the
    *writer* (appends, heartbeats, group changes, commits) and the *reader* (reads and fetch polls).
    The event loop only awaits them, so it never blocks on SQLite. The only lock is SQLite's own: every
    write is one short transaction, and the busy timeout makes a writer wait for another's. In-process
    waiters are woken by the bus's change signal, an :class:`asyncio.Event` replaced on every
    notification; changes made by other processes are picked up by polling every ``poll_interval_s``.

Consumer groups and rebalancing
    A member joins by inserting its row and bumping the group's version. A background task per
    member refreshes its heartbeat every quarter of its session timeout (KIP-62 style, so a slow
    batch does not cost the member its partitions); a member whose heartbeat is older than its own
    session timeout is expired, with its claims, by the next member that syncs. A heartbeat never
    brings an expired member back: a member that was only paused (SIGSTOP, a long GC) finds out at
    its next sync, loses everything it was fetching, and rejoins. ``close`` revokes what the member
    holds, then leaves at once; :meth:`EmbeddedBus.abandon` stops without leaving, as a crash would.
    Every membership change and every released claim bumps the group's version.

    The target assignment is Kafka's range assignor over the sorted live member ids, topic by topic,
    so topics subscribed together (``ffdl.commands`` and ``ffdl.events``) keep partition ``p`` on the
    same member. Each ``fetch`` polls the group's version; when it changed (or a member expired) the
    member syncs, inside ``fetch`` and so in the caller's task, between batches:

    1. one transaction: refresh its heartbeat (rejoining if it was expired), expire dead members,
       compute its target, claim every target partition nobody holds, drop claims it holds but never
       started fetching, and read the committed offsets of what it newly holds;
    2. ``listener.on_revoked(lost | moving)``: *lost* is everything it was fetching if it had been
       expired, *moving* what it holds that now belongs to someone else. It still holds *moving*
       during the callback, so the listener can commit them; then it releases those claims;
    3. ``listener.on_assigned(gained)``, then it fetches them from the committed offset (or 0).

    A partition is claimed only once its previous holder released it (after its ``on_revoked``) or
    was expired, so the old owner's revocation precedes the new owner's assignment and two members in
    good standing never fetch the same partition (an expired member that still runs may fetch until
    its next sync, but cannot commit). A member that stops calling ``fetch`` keeps its claims until
    it leaves or stops heart-beating. Listener errors are logged and the rebalance goes
    on, as aiokafka does; a cancelled rebalance is redone by the next ``fetch``.

Why at-least-once
    Committed offsets move only on ``commit``, and a commit succeeds only for partitions the member
    holds both locally and in the file (checked in the commit's transaction), so a member that lost a
    partition cannot move its offset after the new owner started from it. Whoever takes a partition
    next starts at the last committed offset: records fetched but not committed by a member that
    closed, crashed or was expired are delivered again. Handlers are idempotent for that reason.

A :class:`EmbeddedSubscription` is used by one task at a time, like a Kafka consumer; its listener
callbacks run inside that task's ``fetch`` and ``close`` and may call ``commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

import structlog

from ffdl.adapters.bus.listening import partition_names, tell_listener
from ffdl.adapters.bus.partitioning import partition_for
from ffdl.events.job_events import quoted
from ffdl.events.position import Position
from ffdl.handlers.ports import (
    MAX_RECORD_BYTES,
    BusUnavailable,
    CommitFailed,
    OutgoingRecord,
    RebalanceListener,
    Record,
    RecordTooLarge,
    TopicPartition,
    record_size,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: Records per query when reading a partition.
READ_PAGE = 500
#: How long a write waits for another connection's write lock before failing.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    headers BLOB NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    UNIQUE (topic, partition, offset)
);
CREATE TABLE IF NOT EXISTS group_members (
    group_id TEXT NOT NULL,
    member_id TEXT NOT NULL,
    topics TEXT NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    session_timeout_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, member_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_claims (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    member_id TEXT NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_versions (
    group_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;
"""

#: Lengths of a header's name and value in the headers BLOB.
_HEADER_LENGTHS = struct.Struct("<HI")

_RECORD_COLUMNS = "topic, partition, offset, key, value, headers, timestamp_ms"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _range_assignment(
    subscriptions: Mapping[str, frozenset[str]], partitions: int
) -> dict[str, frozenset[TopicPartition]]:
    """Kafka's range assignor: per topic, its subscribers in member-id order take consecutive runs of
    partitions, the first ``partitions % subscribers`` one more. Topics with the same subscribers are
    therefore co-partitioned."""
    assigned: dict[str, set[TopicPartition]] = {member: set() for member in subscriptions}
    for topic in sorted({topic for topics in subscriptions.values() for topic in topics}):
        subscribers = sorted(member for member, topics in subscriptions.items() if topic in topics)
        share, extra = divmod(partitions, len(subscribers))
        first = 0
        for index, member in enumerate(subscribers):
            count = share + (1 if index < extra else 0)
            assigned[member].update(TopicPartition(topic, p) for p in range(first, first + count))
            first += count
    return {member: frozenset(tps) for member, tps in assigned.items()}


# --------------------------------------------------------------------------- thread side
# Plain functions of one connection; each runs whole on that connection's thread.


@contextlib.contextmanager
def _write_transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """Headers as one BLOB: per header, its name's and value's lengths, then the name (UTF-8) and value."""
    encoded = bytearray()
    for name, value in headers:
        name_bytes = name.encode()
        encoded += _HEADER_LENGTHS.pack(len(name_bytes), len(value))
        encoded += name_bytes
        encoded += value
    return bytes(encoded)


def _decode_headers(blob: bytes) -> tuple[tuple[str, bytes], ...]:
    headers: list[tuple[str, bytes]] = []
    at = 0
    while at < len(blob):
        name_length, value_length = _HEADER_LENGTHS.unpack_from(blob, at)
        at += _HEADER_LENGTHS.size
        name = blob[at : at + name_length].decode()
        at += name_length
        headers.append((name, blob[at : at + value_length]))
        at += value_length
    return tuple(headers)


def _to_record(row: tuple[str, int, int, str, bytes, bytes, int]) -> Record:
    topic, partition, offset, key, value, headers, timestamp_ms = row
    return Record(topic, partition, offset, key, value, _decode_headers(headers), timestamp_ms)


def _initialise(connection: sqlite3.Connection, partitions: int) -> int:
    """Create the schema if needed; returns the partition count the file was created with."""
    with _write_transaction(connection):
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                connection.execute(statement)
        connection.execute(
            "INSERT OR IGNORE INTO settings (name, value) VALUES ('partitions', ?)", (str(partitions),)
        )
        (stored,) = connection.execute("SELECT value FROM settings WHERE name = 'partitions'").fetchone()
    return int(stored)


def _end_offset(connection: sqlite3.Connection, topic: str, partition: int) -> int:
    row = connection.execute(
        "SELECT offset FROM records WHERE topic = ? AND partition = ? ORDER BY offset DESC LIMIT 1",
        (topic, partition),
    ).fetchone()
    return 0 if row is None else int(row[0]) + 1


def _append(
    connection: sqlite3.Connection,
    *,
    topic: str,
    records: Sequence[OutgoingRecord],
    partitions: int,
    timestamp_ms: int,
) -> list[Position]:
    positions: list[Position] = []
    rows: list[tuple[str, int, int, str, bytes, bytes, int]] = []
    with _write_transaction(connection):
        next_offsets: dict[int, int] = {}
        for record in records:
            partition = partition_for(record.key, partitions)
            offset = next_offsets.get(partition)
            if offset is None:
                offset = _end_offset(connection, topic, partition)
            next_offsets[partition] = offset + 1
            positions.append(Position(topic, partition, offset))
            rows.append(
                (
                    topic,
                    partition,
                    offset,
                    record.key,
                    record.value,
                    _encode_headers(record.headers),
                    timestamp_ms,
                )
            )
        connection.executemany(f"INSERT INTO records ({_RECORD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    return positions


def _read_page(
    connection: sqlite3.Connection, *, topic: str, partition: int, start: int, end: int, limit: int
) -> list[Record]:
    rows = connection.execute(
        f"SELECT {_RECORD_COLUMNS} FROM records"
        " WHERE topic = ? AND partition = ? AND offset >= ? AND offset < ? ORDER BY offset LIMIT ?",
        (topic, partition, start, end, limit),
    )
    return [_to_record(row) for row in rows]


def _end_offsets(connection: sqlite3.Connection, topic: str, partitions: int) -> dict[int, int]:
    return {partition: _end_offset(connection, topic, partition) for partition in range(partitions)}


def _committed(connection: sqlite3.Connection, group: str, topic: str) -> dict[int, int]:
    rows = connection.execute(
        "SELECT partition, next_offset FROM group_offsets WHERE group_id = ? AND topic = ?", (group, topic)
    )
    return {int(partition): int(offset) for partition, offset in rows}


def _fetch(
    connection: sqlite3.Connection, positions: Mapping[TopicPartition, int], max_records: int
) -> list[Record]:
    """Up to ``max_records`` records from ``positions`` on, in append order (offset order per partition).

    A covering-index probe per partition picks the candidate ``seq``s; one query loads the chosen rows.
    """
    candidates: list[int] = []
    for where, start in positions.items():
        candidates.extend(
            seq
            for (seq,) in connection.execute(
                "SELECT seq FROM records WHERE topic = ? AND partition = ? AND offset >= ?"
                " ORDER BY offset LIMIT ?",
                (where.topic, where.partition, start, max_records),
            )
        )
    if not candidates:
        return []
    chosen = sorted(candidates)[:max_records]
    rows = connection.execute(
        f"SELECT {_RECORD_COLUMNS} FROM records WHERE seq IN (SELECT value FROM json_each(?)) ORDER BY seq",
        (json.dumps(chosen),),
    )
    return [_to_record(row) for row in rows]


@dataclass(frozen=True, slots=True)
class _Membership:
    """Who a member is, as its row in ``group_members`` says."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class _GroupView:
    """What one sync transaction saw and did for a member."""

    version: int
    target: frozenset[TopicPartition]
    held: frozenset[TopicPartition]
    #: Next offsets of the partitions the member holds and should start fetching.
    committed: Mapping[TopicPartition, int]
    #: Whether the member had been expired: everything it was fetching is lost, whatever it holds now.
    rejoined: bool
    #: Whether the sync changed the group (expired members, rejoined, released claims).
    changed_group: bool


def _group_version(connection: sqlite3.Connection, group: str) -> int:
    row = connection.execute("SELECT version FROM group_versions WHERE group_id = ?", (group,)).fetchone()
    return 0 if row is None else int(row[0])


def _bump_group_version(connection: sqlite3.Connection, group: str) -> None:
    connection.execute(
        "INSERT INTO group_versions (group_id, version) VALUES (?, 1)"
        " ON CONFLICT (group_id) DO UPDATE SET version = version + 1",
        (group,),
    )


def _refresh_heartbeat(connection: sqlite3.Connection, member: _Membership, now_ms: int) -> bool:
    """Returns False when the member has no row (it never joined or was expired)."""
    updated: int = connection.execute(
        "UPDATE group_members SET heartbeat_ms = ? WHERE group_id = ? AND member_id = ?",
        (now_ms, member.group, member.member_id),
    ).rowcount
    return updated == 1


def _touch_member(connection: sqlite3.Connection, member: _Membership, now_ms: int) -> bool:
    """Refresh the member's heartbeat; insert its row if it has none. Returns whether it (re)joined."""
    if _refresh_heartbeat(connection, member, now_ms):
        return False
    connection.execute(
        "INSERT INTO group_members (group_id, member_id, topics, heartbeat_ms, session_timeout_ms)"
        " VALUES (?, ?, ?, ?, ?)",
        (member.group, member.member_id, json.dumps(member.topics), now_ms, member.session_timeout_ms),
    )
    return True


def _join(connection: sqlite3.Connection, member: _Membership, now_ms: int) -> None:
    with _write_transaction(connection):
        _touch_member(connection, member, now_ms)
        _bump_group_version(connection, member.group)


def _heartbeat(connection: sqlite3.Connection, member: _Membership, now_ms: int) -> bool:
    """Refresh the member's heartbeat; False when it is a member no more (it was expired).

    Only a sync brings an expired member back, so that it also learns it lost its partitions.
    """
    with _write_transaction(connection):
        return _refresh_heartbeat(connection, member, now_ms)


def _expire_members(connection: sqlite3.Connection, group: str, now_ms: int) -> list[str]:
    expired = [
        member_id
        for (member_id,) in connection.execute(
            "SELECT member_id FROM group_members"
            " WHERE group_id = ? AND heartbeat_ms + session_timeout_ms < ?",
            (group, now_ms),
        )
    ]
    for member_id in expired:
        _remove_member(connection, group, member_id)
    return expired


def _remove_member(connection: sqlite3.Connection, group: str, member_id: str) -> None:
    connection.execute("DELETE FROM group_members WHERE group_id = ? AND member_id = ?", (group, member_id))
    connection.execute("DELETE FROM group_claims WHERE group_id = ? AND member_id = ?", (group, member_id))


def _claims_of(connection: sqlite3.Connection, group: str, member_id: str) -> frozenset[TopicPartition]:
    rows = connection.execute(
        "SELECT topic, partition FROM group_claims WHERE group_id = ? AND member_id = ?", (group, member_id)
    )
    return frozenset(TopicPartition(topic, partition) for topic, partition in rows)


def _delete_claims(
    connection: sqlite3.Connection, group: str, member_id: str, partitions: frozenset[TopicPartition]
) -> None:
    connection.executemany(
        "DELETE FROM group_claims WHERE group_id = ? AND topic = ? AND partition = ? AND member_id = ?",
        [(group, tp.topic, tp.partition, member_id) for tp in partitions],
    )


def _committed_offset(connection: sqlite3.Connection, group: str, where: TopicPartition) -> int:
    row = connection.execute(
        "SELECT next_offset FROM group_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
        (group, where.topic, where.partition),
    ).fetchone()
    return 0 if row is None else int(row[0])


def _sync_member(
    connection: sqlite3.Connection,
    member: _Membership,
    fetching: frozenset[TopicPartition],
    partitions: int,
    now_ms: int,
) -> _GroupView:
    """Step 1 of a rebalance (see the module docstring), in one transaction."""
    group, me = member.group, member.member_id
    with _write_transaction(connection):
        rejoined = _touch_member(connection, member, now_ms)
        expired = _expire_members(connection, group, now_ms)
        subscriptions = {
            member_id: frozenset(json.loads(topics))
            for member_id, topics in connection.execute(
                "SELECT member_id, topics FROM group_members WHERE group_id = ?", (group,)
            )
        }
        target = _range_assignment(subscriptions, partitions)[me]
        # What the member fetches is still backed by its claims unless it was expired meanwhile.
        continuing = frozenset() if rejoined else fetching
        stale = _claims_of(connection, group, me) - target - continuing
        _delete_claims(connection, group, me, stale)
        connection.executemany(
            "INSERT OR IGNORE INTO group_claims (group_id, topic, partition, member_id) VALUES (?, ?, ?, ?)",
            [(group, tp.topic, tp.partition, me) for tp in target],
        )
        held = _claims_of(connection, group, me)
        changed_group = rejoined or bool(expired) or bool(stale)
        if changed_group:
            _bump_group_version(connection, group)
        committed = {
            where: _committed_offset(connection, group, where) for where in (held & target) - continuing
        }
        version = _group_version(connection, group)
    if expired:
        log.info("group members expired", group=group, member=me, expired=expired)
    if rejoined:
        log.warning("member had been expired from its group; it rejoined", group=group, member=me)
    return _GroupView(version, target, held, committed, rejoined, changed_group)


def _release(
    connection: sqlite3.Connection, member: _Membership, partitions: frozenset[TopicPartition]
) -> None:
    with _write_transaction(connection):
        _delete_claims(connection, member.group, member.member_id, partitions)
        _bump_group_version(connection, member.group)


def _leave(connection: sqlite3.Connection, member: _Membership) -> None:
    with _write_transaction(connection):
        _remove_member(connection, member.group, member.member_id)
        _bump_group_version(connection, member.group)


def _poll(
    connection: sqlite3.Connection,
    *,
    group: str,
    seen_version: int | None,
    positions: Mapping[TopicPartition, int],
    max_records: int,
    now_ms: int,
) -> list[Record] | None:
    """Records to fetch, or None when the group changed since ``seen_version`` and the member must sync."""
    if seen_version is None or _group_version(connection, group) != seen_version:
        return None
    expired = connection.execute(
        "SELECT EXISTS (SELECT 1 FROM group_members"
        " WHERE group_id = ? AND heartbeat_ms + session_timeout_ms < ?)",
        (group, now_ms),
    ).fetchone()[0]
    if expired:
        return None
    return _fetch(connection, positions, max_records)


def _commit(
    connection: sqlite3.Connection, member: _Membership, offsets: Mapping[TopicPartition, int]
) -> None:
    with _write_transaction(connection):
        taken = frozenset(offsets) - _claims_of(connection, member.group, member.member_id)
        if taken:
            raise CommitFailed(
                f"member {member.member_id} of group {member.group!r} "
                f"no longer holds {partition_names(taken)}"
            )
        connection.executemany(
            "INSERT INTO group_offsets (group_id, topic, partition, next_offset) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (group_id, topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
            [(member.group, tp.topic, tp.partition, offset) for tp, offset in offsets.items()],
        )


# --------------------------------------------------------------------------- loop side


class _SqliteThread:
    """One SQLite connection and the single thread that uses it; it can be opened again after a close."""

    def __init__(self, path: Path, name: str) -> None:
        self._path = path
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None

    async def open(self, *pragmas: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connect, pragmas)

    def _connect(self, pragmas: Sequence[str]) -> None:
        connection = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            for pragma in pragmas:
                connection.execute(f"PRAGMA {pragma}")
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._connection is None:
            raise RuntimeError(f"the event log at {self._path} is not open")
        return work(self._connection)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            raise RuntimeError(f"the event log at {self._path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, work)

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        executor.shutdown(wait=False)

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _LogFile:
    """The bus's two connections to the file, and the in-process signal that the file changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer = _SqliteThread(path, "ffdl-bus-writer")
        self.reader = _SqliteThread(path, "ffdl-bus-reader")
        self._changed = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change this process makes; take it *before* looking, then wait on it."""
        return self._changed

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def close(self) -> None:
        self.notify()
        await self.writer.close()
        await self.reader.close()


class EmbeddedSubscription:
    """A member of a consumer group on the embedded log (see the module docstring for the protocol)."""

    def __init__(
        self,
        log_file: _LogFile,
        group: str,
        topics: Sequence[str],
        listener: RebalanceListener | None,
        *,
        partitions: int,
        session_timeout_s: float,
        poll_interval_s: float,
        on_gone: Callable[[EmbeddedSubscription], None],
    ) -> None:
        self.member_id = uuid.uuid4().hex
        self._membership = _Membership(
            group, self.member_id, tuple(sorted(set(topics))), round(session_timeout_s * 1000)
        )
        self._file = log_file
        self._listener = listener
        self._partitions = partitions
        self._session_timeout_s = session_timeout_s
        self._poll_interval_s = poll_interval_s
        self._on_gone = on_gone
        #: The partitions this member fetches, each with the offset of the next record to fetch.
        self._fetching: dict[TopicPartition, int] = {}
        self._seen_version: int | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._closed = False
        self._log = log.bind(group=group, member=self.member_id)

    @property
    def group(self) -> str:
        return self._membership.group

    async def join(self) -> None:
        await self._file.writer.run(partial(_join, member=self._membership, now_ms=_now_ms()))
        self._file.notify()
        self._heartbeats = asyncio.create_task(self._beat(), name=f"ffdl-bus-heartbeat:{self.member_id}")
        self._log.info("joined group", topics=list(self._membership.topics))

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._fetching)

    async def fetch(self, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self._closed:
                raise RuntimeError(f"member {self.member_id} of group {self.group!r} is closed")
            changed = self._file.changed
            records = await self._file.reader.run(
                partial(
                    _poll,
                    group=self.group,
                    seen_version=self._seen_version,
                    positions=dict(self._fetching),
                    max_records=max_records,
                    now_ms=_now_ms(),
                )
            )
            if records is None:
                await self._rebalance()
                continue
            if records:
                for record in records:
                    self._fetching[record.where] = record.offset + 1
                return records
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self._poll_interval_s, remaining)):
                    await changed.wait()

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        not_owned = set(offsets) - set(self._fetching)
        if not_owned:
            raise CommitFailed(
                f"member {self.member_id} of group {self.group!r} "
                f"does not own {partition_names(frozenset(not_owned))}"
            )
        if any(offset < 0 for offset in offsets.values()):
            raise ValueError(f"offsets are never negative: {dict(offsets)}")
        if offsets:
            await self._file.writer.run(partial(_commit, member=self._membership, offsets=dict(offsets)))

    async def close(self) -> None:
        """Revoke what this member holds (its listener may still commit), then leave the group at once."""
        if self._closed:
            return
        self._closed = True
        await self._stop_heartbeats()
        if self._fetching:
            await self._call_listener("on_revoked", frozenset(self._fetching))
            self._fetching.clear()
        await self._file.writer.run(partial(_leave, member=self._membership))
        self._file.notify()
        self._on_gone(self)
        self._log.info("left group")

    async def abandon(self) -> None:
        """Stop as a killed process would: no revoke, no leave; the group expires it after its timeout."""
        self._closed = True
        await self._stop_heartbeats()
        self._on_gone(self)

    async def _stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats

    async def _beat(self) -> None:
        reported_expiry = False
        while True:
            await asyncio.sleep(self._session_timeout_s / 4)
            try:
                member = await self._file.writer.run(
                    partial(_heartbeat, member=self._membership, now_ms=_now_ms())
                )
            except sqlite3.Error as exc:
                self._log.warning("heartbeat failed; retrying", error=str(exc))
                continue
            if not member and not reported_expiry:
                self._log.warning(
                    "member was expired from its group (session timed out); it rejoins at its next fetch"
                )
            reported_expiry = not member

    async def _rebalance(self) -> None:
        view = await self._file.writer.run(
            partial(
                _sync_member,
                member=self._membership,
                fetching=frozenset(self._fetching),
                partitions=self._partitions,
                now_ms=_now_ms(),
            )
        )
        self._seen_version = view.version
        if view.changed_group:
            self._file.notify()
        fetching = frozenset(self._fetching)
        lost = fetching if view.rejoined else fetching - view.held
        moving = (fetching - lost) - view.target
        if lost or moving:
            self._log.info("partitions revoked", lost=partition_names(lost), moving=partition_names(moving))
            await self._call_listener("on_revoked", lost | moving)
            for where in lost | moving:
                del self._fetching[where]
        if moving:
            await self._file.writer.run(partial(_release, member=self._membership, partitions=moving))
            self._file.notify()
        gained = (view.held & view.target) - frozenset(self._fetching)
        if gained:
            self._log.info(
                "partitions assigned",
                gained=partition_names(gained),
                pending=partition_names(view.target - view.held),
            )
            await self._call_listener("on_assigned", gained)
            for where in gained:
                self._fetching[where] = view.committed[where]

    async def _call_listener(
        self, callback: Literal["on_assigned", "on_revoked"], partitions: frozenset[TopicPartition]
    ) -> None:
        await tell_listener(self._listener, callback, partitions, self._log)


class EmbeddedBus:
    """The :class:`~ffdl.handlers.ports.Bus` on one SQLite file, shared by any number of processes."""

    def __init__(
        self,
        path: Path,
        partitions: int = 8,
        *,
        session_timeout_s: float = 10.0,
        poll_interval_s: float = 0.05,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"a topic has at least one partition, got {partitions}")
        self.path = path
        self.partitions = partitions
        self.session_timeout_s = session_timeout_s
        self.poll_interval_s = poll_interval_s
        self._file = _LogFile(path)
        self._members: set[EmbeddedSubscription] = set()

    async def start(self) -> None:
        """Open (creating if needed) the file; :class:`BusUnavailable` if it cannot be opened."""
        try:
            await self._file.writer.open("journal_mode=WAL", "synchronous=NORMAL")
            stored = await self._file.writer.run(partial(_initialise, partitions=self.partitions))
            await self._file.reader.open("query_only=ON")
        except sqlite3.Error as exc:
            await self._file.close()
            raise BusUnavailable(f"cannot open the event log at {self.path}: {exc}") from exc
        if stored != self.partitions:
            await self._file.close()
            raise ValueError(
                f"the event log at {self.path} has {stored} partitions per topic, not {self.partitions}"
            )
        log.info("event log open", path=str(self.path), partitions=self.partitions)

    async def close(self) -> None:
        """Every member leaves its group, then the connections close."""
        for member in list(self._members):
            await member.close()
        await self._file.close()

    async def abandon(self) -> None:
        """Stop at once as a crashed process would, for crash drills: no member revokes, commits or leaves;
        their groups expire them after their session timeout. The connections close."""
        for member in list(self._members):
            await member.abandon()
        await self._file.close()

    def partition_for(self, key: str) -> int:
        return partition_for(key, self.partitions)

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        if not records:
            return []
        for record in records:
            size = record_size(record)
            if size > MAX_RECORD_BYTES:  # refused before anything of the publish is written
                raise RecordTooLarge(
                    f"appending to {topic!r} refused: the record for key {quoted(repr(record.key))} is"
                    f" {size} bytes, more than the {MAX_RECORD_BYTES} a record may have"
                )
        positions = await self._file.writer.run(
            partial(
                _append,
                topic=topic,
                records=list(records),
                partitions=self.partitions,
                timestamp_ms=_now_ms(),
            )
        )
        self._file.notify()
        return positions

    async def subscribe(
        self, group: str, topics: Sequence[str], listener: RebalanceListener | None = None
    ) -> EmbeddedSubscription:
        if not topics:
            raise ValueError("a subscription names at least one topic")
        member = EmbeddedSubscription(
            self._file,
            group,
            topics,
            listener,
            partitions=self.partitions,
            session_timeout_s=self.session_timeout_s,
            poll_interval_s=self.poll_interval_s,
            on_gone=self._members.discard,
        )
        await member.join()
        self._members.add(member)
        return member

    async def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None
    ) -> AsyncIterator[Record]:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is not one of the {self.partitions} of {topic!r}")
        if end is None:
            end = await self._file.reader.run(partial(_end_offset, topic=topic, partition=partition))
        position = start
        while position < end:
            page = await self._file.reader.run(
                partial(
                    _read_page, topic=topic, partition=partition, start=position, end=end, limit=READ_PAGE
                )
            )
            if not page:
                return
            for record in page:
                yield record
            position = page[-1].offset + 1

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self._file.reader.run(partial(_end_offsets, topic=topic, partitions=self.partitions))

    async def committed(self, group: str, topic: str) -> dict[int, int]:
        return await self._file.reader.run(partial(_committed, group=group, topic=topic))
