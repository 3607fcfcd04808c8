"""The report channel: a unix stream socket one learner agent listens on for its learner (DESIGN §6a).

The agent makes the socket (``report.sock``) in its own working directory, a directory of the
platform's that the learner cannot write; the local launcher binds that one socket into the
learner's sandbox at ``FFDL_REPORT_SOCKET`` and nowhere else, so only that learner's processes can
connect. :mod:`ffdl.learner`'s helpers connect once per process and send newline-delimited JSON,
one report per line::

    {"type": "progress", "step": 12, "metrics": {"loss": 0.3}}
    {"type": "checkpoint", "step": 12, "uri": "file:///c/step-12.pt", "size_bytes": 9, "checksum": "sha256:."}

Each line may carry an integer ``local_rank`` (the process's rank among the learner's workers), which
is parsed and kept. Whatever arrives is untrusted data, parsed as bounded data only:

* a line longer than :data:`~ffdl.events.reports.MAX_REPORT_BYTES` is dropped unread (the bytes up to
  its newline are skipped without being kept);
* a line that is not a JSON object of a known type with a valid step is dropped, and so is a
  checkpoint whose URI no record can carry; metrics are brought inside
  :func:`~ffdl.events.reports.bound_metrics` (each drop with its reason);
* a report the agent refuses by raising is dropped like a line that is none: it never ends its
  connection's task;
* at most :data:`MAX_CONNECTIONS` connections at a time; each is read in its own task, and the
  reader yields to the agent's other tasks after every line, so a flood of reports, an endless line
  or a connection that stalls mid-line never holds up the heartbeat or the exit report; a
  connection that sent :data:`MAX_DROPS_PER_CONNECTION` bad lines is closed;
* what the learner's reports cost the agent is bounded by one :class:`LearnerBudget` for all its
  connections: once it is spent, no connection is read (or set up) until it is earned again, so
  the socket's buffer fills and the learner's sends block. The agent runs outside the learner's
  cgroup: a learner limited to a tenth of a core flooded small valid reports and its agent read
  and took them all, a whole core.

Every drop is logged with the job, rank and reason (the first :data:`LOGGED_DROPS` of a connection;
then only their count, when it closes), which is what the operator reads. All that the learner makes
its agent log goes through one :class:`LearnerNotes`, so neither reconnecting nor sending refused
reports without end writes more than :data:`NOTES_PER_INTERVAL` lines a minute to the platform's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ffdl.adapters.launchers.environment import REPORT_SOCKET_NAME
from ffdl.events.model import checkpoint_uri_problem
from ffdl.events.reports import MAX_REPORT_BYTES, bound_metrics, bound_step

MAX_CONNECTIONS = 64
READ_CHUNK_BYTES = 64 * 1024
#: Drops logged one by one per connection; the rest are counted.
LOGGED_DROPS = 20
#: Drops after which a connection is closed: a program that sends that much garbage is broken or
#: hostile, and reading it would only cost the agent the time its heartbeat needs.
MAX_DROPS_PER_CONNECTION = 1000
MAX_CHECKSUM_LENGTH = 200
#: What a learner's reports may cost its agent, in units (:data:`REPORT_UNIT_BYTES`): a line costs
#: one, and one more per unit of its length, as parsing it does; a connection costs
#: :data:`CONNECTION_UNITS`, as setting up its reader does. A unit is about 16 µs of the agent's CPU,
#: so a flood costs the agent a few percent of a core. A program that reports a thousand small lines
#: a second is never held; past that, its sends wait.
REPORT_UNITS_PER_S = 1000.0
REPORT_BURST_UNITS = 1000.0
REPORT_UNIT_BYTES = 1024
CONNECTION_UNITS = 16
BUDGET_SLICE_S = 0.05
#: Lines a learner may make its agent log per :data:`NOTES_INTERVAL_S`; the rest are counted.
NOTES_PER_INTERVAL = 100
NOTES_INTERVAL_S = 60.0


class LearnerNotes:
    """The agent's log, for what its learner makes it say: at most :data:`NOTES_PER_INTERVAL` lines
    per :data:`NOTES_INTERVAL_S`, then how many were left out, once the interval is over. Each line
    is the learner's to trigger (a refused report, a reconnection, a checkpoint name passed over), so
    without a bound a learner fills the platform's disk and spends the agent's CPU, which no limit of
    its own counts. Safe to call from the checkpoint scan's worker thread as well as from the loop."""

    def __init__(self, logger: Any, clock: Callable[[], float]) -> None:
        self._log = logger
        self._clock = clock
        self._since = clock()
        self._logged = 0
        self._left_out = 0
        self._lock = threading.Lock()

    def info(self, message: str, **details: Any) -> None:
        self._note("info", message, details)

    def warning(self, message: str, **details: Any) -> None:
        self._note("warning", message, details)

    def _note(self, level: str, message: str, details: dict[str, Any]) -> None:
        with self._lock:
            now = self._clock()
            if now - self._since >= NOTES_INTERVAL_S:
                if self._left_out:
                    self._log.warning("learner's notes left out of the log", left_out=self._left_out)
                self._since, self._logged, self._left_out = now, 0, 0
            if self._logged >= NOTES_PER_INTERVAL:
                self._left_out += 1
                return
            self._logged += 1
            getattr(self._log, level)(message, **details)


class LearnerBudget:
    """What a learner may make its agent spend on what it sends: ``rate`` units a second, ``burst``
    at once (a token bucket). Reading stops while it is spent rather than reading on and dropping: a
    flood is then slowed where it comes from, the learner's writes blocking on a full socket or pipe
    at the learner's own cost, instead of costing the agent, which no limit of the learner's counts."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._left = burst
        self._at = clock()

    def spend(self, units: float) -> float:
        """Take ``units``; the seconds the spender waits before it reads on (0 while the budget
        lasts). Spent past it, the budget owes, and the spender waits until the debt is paid and
        :data:`BUDGET_SLICE_S` more earned: every connection waits its turn behind what was taken
        already (many cost no more than one), and a flood costs a timer every slice, not every
        line (one wait a line cost five times what the line did)."""
        now = self._clock()
        self._left = min(self._burst, self._left + (now - self._at) * self._rate) - units
        self._at = now
        return 0.0 if self._left >= 0 else BUDGET_SLICE_S - self._left / self._rate


@dataclass(frozen=True, slots=True)
class ProgressReport:
    step: int
    metrics: dict[str, float]
    #: Why metrics of the report were dropped.
    dropped: tuple[str, ...] = ()
    local_rank: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    step: int
    uri: str
    size_bytes: int = 0
    checksum: str = ""
    local_rank: int | None = None


Report = ProgressReport | CheckpointReport


class Dropped(ValueError):
    """A report line that is not taken, with the reason."""


def parse_report(line: bytes) -> Report:
    """One line as a report, or :class:`Dropped` saying why it is none."""
    if len(line) > MAX_REPORT_BYTES:
        raise Dropped(f"report of {len(line)} bytes is over the limit of {MAX_REPORT_BYTES}")
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise Dropped(f"not JSON: {str(error)[:120]}") from None
    if not isinstance(raw, dict):
        raise Dropped(f"not a JSON object: {type(raw).__name__}")
    local_rank = raw.get("local_rank")
    if local_rank is not None and (
        isinstance(local_rank, bool) or not isinstance(local_rank, int) or not 0 <= local_rank < 2**16
    ):
        raise Dropped(f"local_rank is not a small integer: {local_rank!r:.40}")
    try:
        step = bound_step(raw.get("step"))
    except ValueError as error:
        raise Dropped(str(error)) from None
    kind = raw.get("type")
    if kind == "progress":
        bounded = bound_metrics(raw.get("metrics"))
        return ProgressReport(step, bounded.metrics, bounded.dropped, local_rank)
    if kind == "checkpoint":
        uri, size_bytes, checksum = raw.get("uri", ""), raw.get("size_bytes", 0), raw.get("checksum", "")
        if (problem := checkpoint_uri_problem(uri)) is not None:
            # a JSON escape (\udcff) names a file that is not UTF-8, which no record can carry
            raise Dropped(f"checkpoint uri: {problem}")
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or not 0 <= size_bytes < 2**63:
            raise Dropped(f"checkpoint size_bytes is not a size: {size_bytes!r:.40}")
        if not isinstance(checksum, str) or len(checksum) > MAX_CHECKSUM_LENGTH:
            raise Dropped(f"checkpoint checksum is not a string of at most {MAX_CHECKSUM_LENGTH} characters")
        return CheckpointReport(step, uri, size_bytes, checksum, local_rank)
    raise Dropped(f"unknown report type {kind!r:.40}")


async def bounded_lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes | None]:
    """The lines of ``reader`` without their newline; None for a line over the limit, whose bytes
    are skipped as they come, never held."""
    buffer = bytearray()
    skipping = False
    while chunk := await reader.read(READ_CHUNK_BYTES):
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if skipping:
                skipping = False
                continue
            yield line if len(line) <= MAX_REPORT_BYTES else None
        if len(buffer) > MAX_REPORT_BYTES:
            if not skipping:
                skipping = True
                yield None
            buffer.clear()
    if buffer.strip() and not skipping:
        yield bytes(buffer)  # a last line without its newline: the writer ended


class ReportChannel:
    """The agent's end of the channel: a server on ``report.sock`` in ``directory``.

    ``on_report`` gets each report (in the loop's thread, between reads); ``owner``: whom the socket
    is handed to (the learner user, where the learner runs as one without a sandbox); ``budget``:
    what reading the learner's reports may cost (by default :data:`REPORT_UNITS_PER_S`)."""

    def __init__(
        self,
        directory: Path,
        on_report: Callable[[Report], None],
        logger: LearnerNotes,
        *,
        owner: tuple[int, int] | None = None,
        budget: LearnerBudget | None = None,
    ) -> None:
        self._path = directory / REPORT_SOCKET_NAME
        self._on_report = on_report
        self._log = logger
        self._owner = owner
        self._budget = (
            budget
            if budget is not None
            else LearnerBudget(REPORT_UNITS_PER_S, REPORT_BURST_UNITS, time.monotonic)
        )
        self._listening: socket.socket | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._refused = 0
        self._paused: asyncio.TimerHandle | None = None  # listening again once the budget is earned
        # closing: what the learner sent before it ended is read at once, unpaced (it is bounded by
        # the socket's buffers, and the drain by its time; paced, a learner that sent 6,000 lines
        # and exited lost half of them and the checkpoint report after them)
        self._draining = False

    @property
    def path(self) -> Path:
        return self._path

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # left by an agent of this learner that was killed
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # The path is relative to the agent's working directory when the launcher says so: a socket's
        # path may not exceed 107 bytes, and the learners' root can be deep.
        listening.bind(str(self._path))
        os.chmod(self._path, 0o600)
        if self._owner is not None:
            os.chown(self._path, *self._owner)
        listening.listen(MAX_CONNECTIONS)
        listening.setblocking(False)
        self._listening = listening
        self._listen()

    async def close(self, drain_s: float) -> None:
        """Stop accepting (taking in the connections already made: a learner may report and exit at
        once); give open connections ``drain_s`` to deliver what was sent before the learner ended,
        then cut them."""
        self._draining = True
        if self._listening is not None:
            if self._paused is not None:
                self._paused.cancel()
            asyncio.get_running_loop().remove_reader(self._listening.fileno())
            self._accept_waiting(paced=False)
            self._listening.close()
            self._listening = None
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=drain_s)
        for task in set(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()

    def _listen(self) -> None:
        assert self._listening is not None
        self._paused = None
        asyncio.get_running_loop().add_reader(self._listening.fileno(), self._accept_waiting, True)

    def _accept_waiting(self, paced: bool) -> None:
        """Accept the connections waiting. When the socket is readable (``paced``) each is paid for
        from the budget, and once it is spent the socket is not listened to until it is earned again:
        connections wait in its backlog, then the learner's connects do (setting up a connection's
        reader costs the agent about what 16 lines do). At close every one: none made is ever lost."""
        assert self._listening is not None
        while True:
            try:
                connection, _ = self._listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors: the connection waits for the next call
                self._log.warning("report connection not accepted", error=str(error))
                return
            self._take(connection)
            if paced and (wait := self._budget.spend(CONNECTION_UNITS)) > 0:
                loop = asyncio.get_running_loop()
                loop.remove_reader(self._listening.fileno())
                self._paused = loop.call_later(wait, self._listen)
                return

    def _take(self, connection: socket.socket) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            connection.close()
            self._refused += 1
            if self._refused & (self._refused - 1) == 0:  # the 1st, 2nd, 4th...: a loop cannot flood the log
                self._log.warning(
                    "report connection refused: too many open", limit=MAX_CONNECTIONS, refused=self._refused
                )
            return
        task = asyncio.create_task(self._read(connection))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _read(self, connection: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=connection)
        await self._serve(reader, writer)

    def _report(self, line: bytes) -> None:
        """One line to ``on_report``, or :class:`Dropped`, also where ``on_report`` refuses the report
        by raising: a checkpoint report naming a file that is not UTF-8 once ended its connection's
        task, a traceback in the platform's log for every connection the learner made."""
        report = parse_report(line)
        try:
            self._on_report(report)
        except Exception as error:
            raise Dropped(f"not taken: {error!r:.200}") from error

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        drops = 0
        try:
            async for line in bounded_lines(reader):
                try:
                    if line is None:
                        raise Dropped(f"report over the limit of {MAX_REPORT_BYTES} bytes")
                    if line.strip():
                        self._report(line)
                except Dropped as dropped:
                    drops += 1
                    if drops <= LOGGED_DROPS:
                        self._log.warning("learner report dropped", reason=str(dropped))
                    elif drops == LOGGED_DROPS + 1:
                        self._log.warning("learner reports dropped: further drops are only counted")
                    if drops >= MAX_DROPS_PER_CONNECTION:
                        self._log.warning("report connection closed: too many bad reports", dropped=drops)
                        return
                # a flood of lines must not starve the heartbeat (a yield), nor cost past the budget
                await asyncio.sleep(0.0 if self._draining else self._budget.spend(_units(line)))
        except (ConnectionError, OSError) as error:
            self._log.info("report connection broke", error=str(error))
        finally:
            if drops > LOGGED_DROPS:
                self._log.warning("learner reports dropped on one connection", dropped=drops)
            writer.close()


def _units(line: bytes | None) -> int:
    """What reading and taking ``line`` costs, in units of the budget (None: a line over the limit,
    skipped as it came)."""
    return 1 + (MAX_REPORT_BYTES if line is None else len(line)) // REPORT_UNIT_BYTES
