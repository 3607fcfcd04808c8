"""The embedded heartbeat store: etcd's lease/key/watch model over one SQLite file.

Learner agents are separate OS processes, so the store is a file they all open rather than memory
in the platform: every process holds its own connection, and SQLite's locking serialises them.

Model, as in etcd:

* ``leases``: id, TTL and wall-clock expiry (``time.time()``: several processes share it, so a
  per-process monotonic clock would not do). ``keepalive`` pushes the expiry out by the TTL.
* ``keys``: the live keys, each optionally bound to a lease.
* ``meta.revision``: a global revision, incremented by every put and every key deletion.
* ``changes``: the change log (revision, kind, key, value) that watches read. Only the last
  ``retained_revisions`` revisions are kept; a watch from an older revision raises
  :class:`StoreUnavailable` so that its caller resyncs with a snapshot, as after etcd compaction.

Expiry: nothing runs in the background. Every operation first deletes the keys of leases whose
expiry has passed (logged as DELETE changes, as etcd does) in the same transaction, so whichever
client touches the store next reaps them. The platform's monitor polls the store constantly, so
expiry is timely while it runs; while nobody runs, nothing expires, which is what lets a restarted
platform adopt learners that kept beating.

Concurrency: each store instance owns one connection, used only on its own single worker thread,
so the event loop never blocks on SQLite and calls from one process never interleave inside a
transaction. Each operation is one ``BEGIN IMMEDIATE`` transaction (reaping writes); WAL mode lets
readers proceed while a writer commits, and the busy timeout makes writers of other processes wait
their turn instead of failing. A watch is an async generator that polls the change log every
``poll_interval_s``; it ends when the store is closed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import structlog

from ffdl.handlers.ports import Snapshot, StoreUnavailable, WatchEvent, WatchKind

log = structlog.get_logger(__name__)

_Result = TypeVar("_Result")

DEFAULT_RETAINED_REVISIONS = 5000
BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0);
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl_s REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases (expires_at);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    lease INTEGER
);
CREATE INDEX IF NOT EXISTS keys_by_lease ON keys (lease);
CREATE TABLE IF NOT EXISTS changes (
    revision INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL
);
COMMIT;
"""


def _is_store_failure(error: sqlite3.Error) -> bool:
    """Whether ``error`` is about the file (missing, locked, corrupt, full) rather than our SQL.

    "file is not a database" comes as the base ``DatabaseError``; errors in our own statements
    (integrity, programming) are bugs and propagate as they are.
    """
    return isinstance(error, sqlite3.OperationalError | sqlite3.InternalError) or (
        type(error) is sqlite3.DatabaseError
    )


class EmbeddedHeartbeatStore:
    """A :class:`~ffdl.handlers.ports.HeartbeatStore` in the SQLite file at ``path``, shared by processes."""

    def __init__(
        self,
        path: Path,
        *,
        poll_interval_s: float = 0.1,
        retained_revisions: int = DEFAULT_RETAINED_REVISIONS,
    ) -> None:
        if retained_revisions < 1:
            raise ValueError(f"retained_revisions must be at least 1, got {retained_revisions}")
        self._path = path
        self._poll_interval_s = poll_interval_s
        self._retained_revisions = retained_revisions
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ffdl-heartbeats")
        self._connection: sqlite3.Connection | None = None
        self._closed = False

    # -- the port -------------------------------------------------------------------------------

    async def grant(self, ttl_s: float) -> int:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive TTL, got {ttl_s}")
        return await self._run(partial(self._grant, ttl_s))

    async def keepalive(self, lease: int) -> bool:
        return await self._run(partial(self._keepalive, lease))

    async def revoke(self, lease: int) -> None:
        await self._run(partial(self._revoke, lease))

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        """Set ``key``; raises :class:`LookupError` when ``lease`` does not exist (any more)."""
        await self._run(partial(self._put, key, value, lease))

    async def delete(self, key: str) -> None:
        await self._run(partial(self._delete, key))

    async def snapshot(self, prefix: str) -> Snapshot:
        return await self._run(partial(self._snapshot, prefix))

    async def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        if start_revision < 1:
            raise ValueError(f"revisions start at 1, got {start_revision}")
        next_revision = start_revision
        while not self._closed:
            events, head = await self._run(partial(self._changes, prefix, next_revision))
            for event in events:
                yield event
            next_revision = max(next_revision, head + 1)
            await asyncio.sleep(self._poll_interval_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._disconnect)
        self._executor.shutdown(wait=False)

    # -- running a transaction on the worker thread ---------------------------------------------

    async def _run(self, operation: Callable[[sqlite3.Connection, float], _Result]) -> _Result:
        if self._closed:
            raise StoreUnavailable(f"heartbeat store {self._path} is closed")
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._in_transaction, operation
        )

    def _in_transaction(self, operation: Callable[[sqlite3.Connection, float], _Result]) -> _Result:
        """Reap expired leases, then run ``operation``, all in one write transaction."""
        try:
            connection = self._connect()
            connection.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                self._expire(connection, now)
                result = operation(connection, now)
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
            return result
        except sqlite3.Error as error:
            if not _is_store_failure(error):
                raise
            self._disconnect()
            raise StoreUnavailable(f"heartbeat store {self._path} cannot be used: {error}") from error

    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None:
            return self._connection
        connection = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.executescript(_SCHEMA)
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    # -- operations (worker thread, inside a transaction) ---------------------------------------

    def _grant(self, ttl_s: float, connection: sqlite3.Connection, now: float) -> int:
        cursor = connection.execute(
            "INSERT INTO leases (ttl_s, expires_at) VALUES (?, ?)", (ttl_s, now + ttl_s)
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def _keepalive(self, lease: int, connection: sqlite3.Connection, now: float) -> bool:
        cursor = connection.execute("UPDATE leases SET expires_at = ? + ttl_s WHERE id = ?", (now, lease))
        return cursor.rowcount == 1

    def _revoke(self, lease: int, connection: sqlite3.Connection, now: float) -> None:
        self._drop_lease(connection, lease)

    def _put(
        self, key: str, value: bytes, lease: int | None, connection: sqlite3.Connection, now: float
    ) -> None:
        if (
            lease is not None
            and connection.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone() is None
        ):
            raise LookupError(f"lease {lease} not found: it expired or was revoked")
        connection.execute(
            "INSERT INTO keys (key, value, lease) VALUES (?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, lease = excluded.lease",
            (key, value, lease),
        )
        self._record(connection, WatchKind.PUT, key, value)

    def _delete(self, key: str, connection: sqlite3.Connection, now: float) -> None:
        self._delete_key(connection, key)

    def _snapshot(self, prefix: str, connection: sqlite3.Connection, now: float) -> Snapshot:
        rows = connection.execute(
            "SELECT key, value FROM keys WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
        )
        return Snapshot(values={key: bytes(value) for key, value in rows}, revision=self._head(connection))

    def _changes(
        self, prefix: str, start_revision: int, connection: sqlite3.Connection, now: float
    ) -> tuple[list[WatchEvent], int]:
        """The changes under ``prefix`` from ``start_revision`` on, and the revision they reach."""
        head = self._head(connection)
        compacted = head - self._retained_revisions
        if start_revision <= compacted:
            raise StoreUnavailable(
                f"revision {start_revision} of heartbeat store {self._path} is compacted (the change log"
                f" keeps revisions after {compacted}): resync with a snapshot"
            )
        rows = connection.execute(
            "SELECT revision, kind, key, value FROM changes"
            " WHERE revision >= ? AND substr(key, 1, ?) = ? ORDER BY revision",
            (start_revision, len(prefix), prefix),
        )
        events = [
            WatchEvent(kind=WatchKind(kind), key=key, value=bytes(value), revision=revision)
            for revision, kind, key, value in rows
        ]
        return events, head

    # -- building blocks -------------------------------------------------------------------------

    def _expire(self, connection: sqlite3.Connection, now: float) -> None:
        expired = connection.execute("SELECT id FROM leases WHERE expires_at <= ?", (now,)).fetchall()
        for (lease,) in expired:
            keys = self._drop_lease(connection, lease)
            log.info("heartbeat lease expired", lease=lease, keys=keys)

    def _drop_lease(self, connection: sqlite3.Connection, lease: int) -> list[str]:
        """Delete the lease and every key bound to it; returns those keys."""
        keys = [
            key
            for (key,) in connection.execute("SELECT key FROM keys WHERE lease = ? ORDER BY key", (lease,))
        ]
        for key in keys:
            self._delete_key(connection, key)
        connection.execute("DELETE FROM leases WHERE id = ?", (lease,))
        return keys

    def _delete_key(self, connection: sqlite3.Connection, key: str) -> None:
        if connection.execute("DELETE FROM keys WHERE key = ?", (key,)).rowcount:
            self._record(connection, WatchKind.DELETE, key, b"")

    def _record(self, connection: sqlite3.Connection, kind: WatchKind, key: str, value: bytes) -> None:
        """Take the next revision for one change, log it, and drop what falls out of the kept window."""
        (revision,) = connection.execute(
            "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value"
        ).fetchone()
        connection.execute(
            "INSERT INTO changes (revision, kind, key, value) VALUES (?, ?, ?, ?)",
            (revision, kind.value, key, value),
        )
        connection.execute("DELETE FROM changes WHERE revision <= ?", (revision - self._retained_revisions,))

    @staticmethod
    def _head(connection: sqlite3.Connection) -> int:
        (revision,) = connection.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
        return int(revision)
