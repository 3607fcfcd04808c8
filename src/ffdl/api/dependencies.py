"""What every route shares, as FastAPI dependencies and the helpers they hand out.

* :data:`Caller` is who calls: the tenant of the bearer token (401 without a valid one once a
  tenant exists); :data:`Admin` the caller if an admin (403 otherwise).
* :data:`Backend` is the platform the app serves, as the routes reach it: reads from the projection
  run off the event loop (but a job by its id, see :func:`read`); ``wait_for`` makes a read wait
  (bounded) for a log position the reader was given by a write; ``send_and_wait`` sends a command
  and waits (bounded) until the projection has applied what it caused, so the writer reads its own
  write, or until the owner is known to have decided it to nothing, and answers the owner's
  rejection as 409 with its reason, and its dead letter as a 4xx with the dead letter's reason.
  Both wake on the projection's progress (:mod:`ffdl.api.progress`).
* :data:`Manifest` is a job manifest parsed from the request body (JSON or YAML, ours or FfDL's),
  off the event loop and bounded in time, its data and result places checked against the roots.
  Each API process parses one at a time, in a thread of its own (not the default pool every read of
  the projection hops to), taking turns among tenants, and each parse stops at its deadline: a
  request is answered only once its parse has stopped (see :func:`parsed_manifest`).

A body is read only by a dependency that depends on the caller (:data:`Manifest`, :func:`json_body`),
never by a ``Body`` parameter, which FastAPI would read before any dependency runs: no request body
is parsed before its sender is authenticated. The read-your-writes wait is a call, not a dependency,
on purpose: a route validates all its parameters before it waits, and waits before it looks its
job up. A wait is for a position on the log: one beyond the log's end is a 422 at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from pydantic import BaseModel, ValidationError

from ffdl.adapters.tenants import OPEN, Principal, TenantRegistry
from ffdl.api.fairness import FairWorker
from ffdl.api.followers import Followers
from ffdl.api.heartbeats import HeartbeatView
from ffdl.api.manifest import ManifestError, OutOfTime, parse_manifest
from ffdl.api.metrics import PlatformCollector, registry_for
from ffdl.api.progress import ProjectionProgress
from ffdl.api.redaction import Redactor, mentioned_jobs
from ffdl.core.kinds import KINDS
from ffdl.core.places import place_problem
from ffdl.events.codec import AnyCommand
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.events.reports import loads_finite, strict_dumps
from ffdl.handlers.deadletters import reason_class
from ffdl.handlers.messaging import utcnow
from ffdl.handlers.ports import MAX_RECORD_BYTES, RecordTooLarge
from ffdl.projections.store import KeptLog
from ffdl.projections.timemachine import ClusterAtEnd
from ffdl.wiring.platform import Platform

WRITE_WAIT_S = 10.0
#: The characters of changed jobs' documents kept as followers of the job list are shown them
#: (see ``shown_document``).
SHOWN_BYTES = 16 * 1024 * 1024
READ_WAIT_MAX_S = 10.0
#: Seconds a manifest may take to parse, waiting for a parser included (its size and shape bound its
#: cost already, to about 0.3 s for the default body limit: a guard, not a budget).
MANIFEST_PARSE_S = 2.0
#: The bytes of a tenant's manifests that may wait for an API process's parser (besides the one it
#: parses): one more is 429 (one is let in whatever its size while none waits). Bytes, not a count:
#: what a parse costs goes with its length, so four of the costliest bodies the default limit allows
#: fill it, and a burst of a script's small manifests does not (a count of 4 refused 20 jobs sent at
#: once). Each waits its tenant's turn, so a tenant's own queue holds only itself.
MANIFEST_BYTES_WAITING_PER_TENANT = 1024 * 1024
#: The API process's one manifest parser, taking turns among tenants (see :func:`parsed_manifest`).
#: One, not more: parsing is pure Python, which holds the interpreter's lock, so a second parser
#: parses no faster and took the event loop's turns (with two, a burst of the costliest manifests
#: held another caller's read for 2 to 4 s; with one, 0.16 s).
_PARSER = FairWorker(MANIFEST_BYTES_WAITING_PER_TENANT, name="ffdl-manifest")
#: The largest offset or seq a request may name: SQLite's integers stop at 2**63.
MAX_OFFSET = 2**62
#: The events by which an owner refuses a command (a job's, a node's); both carry the reason.
REJECTIONS = frozenset({"CommandRejected", "NodeCommandRejected"})
#: The status and field of the answer to a command its owner dead-lettered, by the reason's class.
_DEAD_LETTER_ANSWERS = {
    "refused": (403, "(request)"),
    "unknown_job": (404, "job_id"),
    "unknown_node": (404, "name"),
    "too_large": (413, "(body)"),
}

T = TypeVar("T")


def problem(
    status: int, message: str, field: str = "(request)", headers: dict[str, str] | None = None
) -> HTTPException:
    return HTTPException(status, detail=[{"field": field, "message": message}], headers=headers)


def event_id(text: str, field: str) -> int:
    """A stream's cursor as a client sends it back (``Last-Event-ID``, ``after``): a decimal integer
    of at most :data:`MAX_OFFSET`, else 422 naming ``field`` (never an integer SQLite cannot hold,
    nor a digit ``int`` refuses, like ``²``)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_OFFSET):
        raise problem(422, f"must be the id of an event: an integer from 0 to {MAX_OFFSET}", field)
    return int(text)


def field_problems(errors: Sequence[Any]) -> list[dict[str, str]]:
    """Pydantic's errors as problems naming each field (without where in the request it was)."""
    return [
        {
            "field": ".".join(str(p) for p in error["loc"] if p not in ("query", "path", "body", "header"))
            or "(body)",
            "message": error["msg"],
        }
        for error in errors
    ]


@dataclass(frozen=True, slots=True)
class Written:
    """What became of a command the API sent, as far as the bounded wait saw."""

    command_id: str
    #: The log position (PARTITION:OFFSET) of the first event it caused, once projected.
    position: str | None = None
    #: Whether its owner has decided it: it caused the event at ``position``, or nothing at all.
    decided: bool = False

    @property
    def changed(self) -> bool:
        return self.position is not None


async def read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` (a blocking read of the projection or a file) run off the event loop.

    A job's document by its id, and a batch of its events a follower reads, are read on the loop
    instead (:meth:`PlatformBackend.visible_job`, :func:`ffdl.api.routes.events.follow_events`): a
    lookup by key takes microseconds and a reader never waits for the writer (WAL), while the hop to
    a thread and back costs the loop more than the read."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class Readiness:
    """Whether this replica's projection has caught up with the log's end as it was first seen."""

    def __init__(self) -> None:
        self._target: dict[int, int] | None = None
        self._reached = False

    def caught_up(self, ends: dict[int, int], applied: dict[int, int]) -> bool:
        """Given the log's ``ends`` now and the projection's ``applied`` positions: caught up yet?"""
        if self._target is None:
            self._target = dict(ends)
        if not self._reached:
            self._reached = all(applied.get(p, 0) >= end for p, end in self._target.items())
        return self._reached


class PlatformBackend:
    """The platform one app serves, with what its routes share beyond a request: the tenants, the
    heartbeat snapshot and the metrics registry.

    ``open_api``: with no tenant, every caller is the open default's admin (else nobody gets in).
    ``clock`` (monotonic seconds) bounds the read-your-writes waits and ages the heartbeat snapshot;
    ``wall_clock`` is the time the API shows ages against (queue waits, learners' last progress).
    """

    def __init__(
        self,
        platform: Platform,
        *,
        open_api: bool = False,
        processes: int = 1,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.platform = platform
        self.settings = platform.settings
        self.projection = platform.projection
        self.tenants = TenantRegistry(platform.settings.tenants_path, allow_open=open_api)
        self.heartbeats = HeartbeatView(
            platform.heartbeats, clock=clock, wall_clock=lambda: wall_clock().timestamp()
        )
        self.collector = PlatformCollector(platform, wall_clock=wall_clock)
        self._clock = clock
        self.registry = registry_for(self.collector, platform.projector.latency)
        self.readiness = Readiness()
        self.progress = ProjectionProgress(self.projection.version)
        # the time machine folds the whole log per moment: one fold at a time, whoever asks, the
        # log's events kept decoded between folds, the cluster at its end and the utilisation
        # folded on as it grows, the last moment folded kept until the log moves on, and each
        # tenant's folds waiting counted (see routes/dashboard.py)
        self.folding = asyncio.Lock()
        self.fold_lock = threading.Lock()
        self.kept_log = KeptLog(self.projection)
        self.at_end = ClusterAtEnd()
        self.folded: tuple[object, Any] | None = None
        self.folds_waiting: dict[str, Counter[datetime | None]] = {}  # tenant -> moments -> requests
        # each of the API's processes admits its share of the streams, so that together they stay
        # within the caps (a process cannot count another's)
        self.followers = Followers(
            -(-platform.settings.max_followers // processes),
            -(-platform.settings.max_followers_per_tenant // processes),
        )
        # a changed job's document as a tenant's followers of the job list are shown it, as JSON,
        # by (tenant or None for admins, job id, the stored document's digest): worked out once, not
        # once per follower
        self._shown: OrderedDict[tuple[str | None, str, bytes], str] = OrderedDict()
        self._shown_bytes = 0
        self._shown_lock = threading.Lock()

    async def wait_for(self, token: str | None) -> None:
        """Wait (bounded) until the projection has applied the log position ``token`` (PARTITION:OFFSET).

        A position beyond the log's end was never handed out by a write: 422 at once, not a wait."""
        if not token:
            return
        try:
            position = Position.parse(self.platform.topics.events, token)
        except ValueError as exc:
            raise problem(422, str(exc), "after") from exc
        partitions = self.platform.bus.partitions
        if position.partition >= partitions:
            raise problem(422, f"the log has partitions 0 to {partitions - 1}", "after")
        if position.offset < MAX_OFFSET and await read(
            self.projection.reached, position.partition, position.offset
        ):
            return
        await self._on_the_log(position)
        deadline = self._clock() + READ_WAIT_MAX_S
        while True:
            version = self.progress.version()
            if await read(self.projection.reached, position.partition, position.offset):
                return
            if self._clock() > deadline:
                raise problem(
                    504, f"the projection has not reached {token} yet", "after", headers={"Retry-After": "1"}
                )
            await self.progress.wait_for_change(version, 0.05)

    async def _on_the_log(self, position: Position) -> None:
        """422 if ``position`` lies beyond the end of its partition (when the log can tell)."""
        end: int | None = None
        if position.offset < MAX_OFFSET:
            try:
                ends = await asyncio.wait_for(self.platform.bus.end_offsets(position.topic), 2.0)
            except (TimeoutError, ConnectionError):
                return  # the log cannot tell now: the bounded wait decides
            end = ends.get(position.partition, 0)
            if position.offset < end:
                return
        where = f"partition {position.partition} ends at {end}" if end is not None else "no log is that long"
        raise problem(422, f"{position.token} is beyond the end of the log: {where}", "after")

    async def redacted(self, caller: Principal, value: T) -> T:
        """``value`` (a document, an event, a list) as ``caller`` may see it: its reasons naming
        other tenants' jobs and names redacted (see :mod:`ffdl.api.redaction`)."""
        if caller.admin:
            return value
        return await read(self.redacted_now, caller, value)

    def shown_document(self, caller: Principal, job_id: str, stored: str) -> str:
        """A job's ``stored`` document as JSON as ``caller`` may see it (blocking: for a worker
        thread), shared by the followers of its tenant: a big job changing often was parsed,
        redacted and encoded once per follower (16 of one tenant held another tenant's requests
        for 0.4 s)."""
        digest = hashlib.blake2b(stored.encode(), digest_size=16).digest()
        key = (None if caller.admin else caller.tenant, job_id, digest)
        with self._shown_lock:
            shown = self._shown.get(key)
        if shown is None:
            shown = strict_dumps(self.redacted_now(caller, loads_finite(stored)))
            with self._shown_lock:
                if key not in self._shown:
                    self._shown[key] = shown
                    self._shown_bytes += len(shown)
                while self._shown_bytes > SHOWN_BYTES:
                    _, dropped = self._shown.popitem(last=False)
                    self._shown_bytes -= len(dropped)
        return shown

    def redacted_now(self, caller: Principal, value: T) -> T:
        """:meth:`redacted`, blocking (it reads the projection): for a worker thread, where a big
        value is walked off the event loop (a tenant's page of jobs of a megabyte each, redacted on
        the loop, once held every other tenant's requests for seconds)."""
        if caller.admin:
            return value
        mentioned = mentioned_jobs(value)
        owners = self.projection.tenants_of(mentioned) if mentioned else {}
        redacted: T = Redactor(caller, mentioned, owners, self.tenants.names()).value(value)
        return redacted

    async def visible_job(self, job_id: str, caller: Principal) -> dict[str, Any]:
        """The job's document, if the caller may see it; another tenant's job is a 404 like a missing one."""
        document = self.projection.get(job_id)  # on the loop: see read()
        if document is None or not caller.may_see(document["tenant"]):
            raise problem(404, f"no job {job_id}", "job_id")
        return dict(document)

    async def send_and_wait(self, command: AnyCommand, caller: Principal) -> Written:
        """Send ``command`` for ``caller`` and wait (bounded) until the projection has applied what it
        caused; a rejection answers 409 with the owner's reason, a dead letter the owner's refusal
        (:meth:`dead_lettered`).

        A command its owner decides to nothing (cordoning a node cordoned so already, halting a
        halting job) causes no event to wait for. The owners commit a command's offset only after
        the events it caused are appended, so once their group has committed past the command, the
        command is decided and its events, if any, lie below the events topic's end as it is then
        (on the command's partition: the topics are co-partitioned by key). Once the projection has
        applied that far and found none, the command caused no event: it changed nothing, or its
        owner refused it with a dead letter (a command that would create a job it may not create,
        one the owner cannot decode or decide), which the owner parks before it commits the command,
        so the dead-letter topic as it ends then holds it. Otherwise the wait runs out and the answer
        is undecided."""
        command_id = str(command.command_id)
        dead_letters = self.platform.dead_letters
        with dead_letters.awaiting(command_id, command.key, self.platform.topics.commands) as awaited:
            try:
                [sent] = await self.platform.sender.send(command, principal=caller.on_the_log())
            except RecordTooLarge as exc:
                raise problem(
                    413,
                    f"{command.type} is too large for the log as it writes text (every character beyond"
                    f" ASCII escaped): over the {MAX_RECORD_BYTES} bytes a record may have",
                    "(body)",
                ) from exc
            deadline = self._clock() + WRITE_WAIT_S
            # the end of the command's events partition once the owners had decided the command
            decided_below: int | None = None
            while True:
                version = self.progress.version()
                if decided_below is None:
                    decided_below = await self._decided_below(sent)
                # looked at before the projection is asked, so that "applied that far" covers its answer
                settled = decided_below is not None and (
                    decided_below == 0
                    or await read(self.projection.reached, sent.partition, decided_below - 1)
                )
                position: str | None = await read(self.projection.position_of_cause, command_id)
                if position is not None:
                    caused = await read(self._caused_by, command)
                    rejected = next((e for e in caused if e["type"] in REJECTIONS), None)
                    if rejected is not None:
                        raise problem(409, rejected["data"]["reason"], "state")
                    return Written(command_id, position, decided=True)
                if settled:
                    left = max(0.0, deadline - self._clock())
                    try:
                        await asyncio.wait_for(
                            dead_letters.catch_up(self.platform.bus, self.platform.topics.deadletter), left
                        )
                    except TimeoutError:
                        return Written(command_id)  # decided, but to what cannot be told in time
                    if awaited.reason is not None:
                        raise await self.dead_lettered(caller, command, awaited.reason)
                    return Written(command_id, decided=True)
                if self._clock() >= deadline:
                    return Written(command_id)
                # the owners' commit is not the projection's: look again soon even if it did not change
                await self.progress.wait_for_change(version, 0.05)

    async def dead_lettered(self, caller: Principal, command: AnyCommand, reason: str) -> HTTPException:
        """The answer to ``command``, which its owner dead-lettered with ``reason``: the refusal, by the
        reason's class (:func:`~ffdl.handlers.deadletters.reason_class`) 403 (the caller may not send
        it), 404 (no such job or node), 413 (its events too large for the log), 500 (the owner failed:
        its reason, an exception's text, is the operator's, in the dead letter) or else 422 (the
        command itself was refused), with the reason as the caller may see it."""
        kind = reason_class(reason)
        if kind == "internal_error":
            failed = f"the owner failed to decide command {command.command_id}"
            return problem(500, f"{failed}; the operator has its dead letter")
        status, field = _DEAD_LETTER_ANSWERS.get(kind, (422, "(request)"))
        shown = await self.redacted(caller, {"reason": reason})
        return problem(status, shown["reason"], field)

    async def _decided_below(self, sent: Position) -> int | None:
        """Once the owners have committed past the command ``sent``, the end of the events partition
        it would have caused events on (they lie below it); None while it is undecided."""
        committed = await self.platform.bus.committed(self.platform.owners_group, sent.topic)
        if committed.get(sent.partition, 0) <= sent.offset:
            return None
        ends = await self.platform.bus.end_offsets(self.platform.topics.events)
        return ends[sent.partition]

    def _caused_by(self, command: AnyCommand) -> list[dict[str, Any]]:
        """The events of the command's job or node that the command caused, as projected (by the
        causation index: reading the whole history on each write cost 0.45 s once a tenant had
        grown its job's to 30,000 events, and would miss a refusal past the first 100,000)."""
        kind = KINDS.of(command)
        return self.projection.caused(kind, kind.identity(command), str(command.command_id))


async def _backend(request: Request) -> PlatformBackend:
    backend: PlatformBackend = request.app.state.backend
    return backend


Backend = Annotated[PlatformBackend, Depends(_backend)]


async def principal(request: Request) -> Principal:
    """Who calls: the tenant of the bearer token, or the open default while no tenant exists.

    On the event loop (a hash, and a look at the tenants file's stamp): FastAPI would run a plain
    function in a thread, and the hop there and back costs more than the check."""
    tenants: TenantRegistry = request.app.state.backend.tenants
    if tenants.open:
        request.state.tenant = OPEN.tenant
        return OPEN
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    found = tenants.authenticate(token.strip()) if scheme.lower() == "bearer" and token else None
    if found is None:
        raise HTTPException(
            401,
            detail=[{"field": "Authorization", "message": "a valid bearer token is needed"}],
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.tenant = found.tenant  # for the log line of a refusal (ffdl.api.app)
    return found


Caller = Annotated[Principal, Depends(principal)]


async def admin(caller: Caller) -> Principal:
    """The caller, if an admin (SREs): the inventory is the whole platform's, not a tenant's."""
    if not caller.admin:
        raise problem(403, "only an admin may change the inventory", "Authorization")
    return caller


Admin = Annotated[Principal, Depends(admin)]


async def job_manifest(caller: Caller, request: Request, backend: Backend) -> JobSpec:
    """The job manifest of the caller's request body (size-limited as it arrives): JSON or YAML, our
    manifest or FfDL's, parsed in a worker thread; its data and result places within the roots.
    (``caller`` is resolved first: an unauthenticated body is never parsed.)"""
    if not _PARSER.admits(caller.tenant, _declared_length(request)):
        raise _queue_full()  # before its body is read: a flood past its queue costs no read
    spec = await parsed_manifest(await request.body(), caller.tenant)
    settings = backend.settings
    problems = [
        {"field": field, "message": message}
        for field, place, roots in (
            ("data_dir", spec.data_dir, settings.data_roots),
            ("result_dir", spec.result_dir, settings.result_roots),
        )
        if place is not None and (message := place_problem(place, roots)) is not None
    ]
    if problems:
        raise HTTPException(422, detail=problems)
    return spec


Manifest = Annotated[JobSpec, Depends(job_manifest)]


async def parsed_manifest(body: bytes, tenant: str, clock: Callable[[], float] = time.monotonic) -> JobSpec:
    """The manifest ``body`` of ``tenant`` parsed in its turn (422 naming the field for a bad one),
    within :data:`MANIFEST_PARSE_S` of now.

    Parsing is CPU work that a thread cannot be made to drop: the parser itself stops at the deadline
    (:class:`~ffdl.api.manifest.OutOfTime`), and the request waits for it to stop, so no parse
    outlives its answer. One that has not started by the deadline (the parser busy) never reads a
    byte: 503 with ``Retry-After``. Before, manifests were parsed in the default pool, and a parse past its
    time went on after its 422: a burst of the costliest bodies filled the pool that every read of
    the projection waits for, and held other callers' reads for seconds.

    The parser takes turns among tenants (:class:`~ffdl.api.fairness.FairWorker`): a tenant's
    manifest waits for the parse under way and at most one of each other tenant with manifests
    waiting, and a tenant whose manifests waiting come to :data:`MANIFEST_BYTES_WAITING_PER_TENANT`
    is refused one more at once, 429 with ``Retry-After``. Before, they waited in the order they
    came: a tenant sending the costliest manifests as fast as it could made every other tenant's
    submission a 503."""
    deadline = clock() + MANIFEST_PARSE_S
    submitted = _PARSER.submit(tenant, parse_manifest, body, deadline, clock, cost=len(body))
    if submitted is None:
        raise _queue_full()
    busy = problem(503, "the API is busy reading other manifests", "(body)", headers={"Retry-After": "1"})
    parsing = asyncio.wrap_future(submitted)
    try:
        try:
            return await asyncio.wait_for(asyncio.shield(parsing), MANIFEST_PARSE_S)
        except TimeoutError:
            if _PARSER.withdraw(submitted):  # still waiting for its turn: it never runs
                raise busy from None
            return await parsing  # it stops itself at the deadline
        except asyncio.CancelledError:  # nobody waits for it now: it never runs, or stops at its deadline
            if not _PARSER.withdraw(submitted):
                parsing.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise
    except OutOfTime as exc:
        if not exc.started:  # the parser took it up too late (the loop saw the time run out late)
            raise busy from exc
        raise problem(422, f"the manifest took over {MANIFEST_PARSE_S} s to read", "(body)") from exc
    except ManifestError as exc:
        raise HTTPException(422, detail=[{"field": f, "message": m} for f, m in exc.problems]) from exc


def _declared_length(request: Request) -> int:
    """The body's length as its sender declares it (1 where it does not, or not as a number): what
    its manifest would cost the parser's queue, known before a byte of it is read. A sender that
    understates it is held to the body's real length once it is read."""
    try:
        return max(1, int(request.headers.get("content-length", "1")))
    except ValueError:
        return 1


def _queue_full() -> HTTPException:
    return problem(
        429,
        f"this tenant's manifests waiting to be read come to {_PARSER.bound} bytes already",
        "(body)",
        headers={"Retry-After": "1"},
    )


M = TypeVar("M", bound=BaseModel)


async def json_body(request: Request, model: type[M]) -> M:
    """The request body as ``model`` (an empty body as an empty object); 422 naming each bad field.

    Call it from a dependency that depends on the caller, so the body is read after authentication."""
    try:
        return model.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        raise HTTPException(422, detail=field_problems(exc.errors())) from exc
