"""The monitor: turns learner heartbeats into observations for the jobs' owners (DESIGN §6).

It watches every learner key in the heartbeat store (a snapshot, then a watch from the snapshot's
revision; after the watch breaks it starts over with a new snapshot) and reports:

* a learner's first heartbeat of an attempt -> ``ReportLearnerStarted``;
* a change of step or metrics -> ``ReportProgress`` (at most every ``progress_interval_s`` per
  learner, flushed before an exit so final metrics are never lost);
* a new checkpoint in the heartbeat -> ``ReportCheckpoint``;
* an exit record -> ``ReportLearnerExited`` with the code (also when the record was seen before
  the job was: a monitor that starts reads the store before its jobs are folded from the log);
* a learner key deleted without an exit record (its lease expired) -> ``ReportLearnerLost(expired)``;
* no progress for the job's ``progress_timeout_s`` -> ``ReportLearnerLost(hung)``; process liveness
  is not progress.

Exit records have no lease (they must outlive the agent), so the monitor deletes them once they
matter no more: when the job it watches leaves the attempt they belong to (its owner has decided
on them by then), and for a job it adopts from the log that is past them.

A store outage is not a learner death. Losses are decided only while the store is *healthy*:

* the follower holds a current snapshot and watch (after any break it resyncs), and
* the prober's last read of the store came back within ``heartbeat_ttl_s / 4``. A frozen etcd
  keeps its connections open, so a watch on it just goes quiet; the probe (every TTL/4) is what
  notices. A live learner's lease can only expire in etcd when the store could not serve its
  renewals (every TTL/3) for two thirds of a TTL, and any such stretch keeps a probe outstanding
  for longer than TTL/4, so it is seen as trouble before the expiries it causes are.

Whenever the store becomes healthy (at start, after a resync, after a slow or failed probe),
learners get ``grace_s`` to re-register before anything is reaped: etcd itself expires the leases
that could not be renewed while it was frozen, so the deletions that follow an outage are of
learners that are alive and about to write their key again with a new lease. A deletion seen while
unhealthy or within the grace marks the learner *gone*; when the grace ends, a learner still gone
(no new heartbeat of its attempt) is lost. A job adopted from the log (a partition this monitor
took over from another, or loaded at start) gets the same grace. Hang detection waits the same way.

Only jobs of the partitions this process reacts for are watched, so several monitors split the
work like every other role; every monitor reads every key, and adopts a job's heartbeats and exit
records from what it has read when it starts watching that job.

Concurrency: four tasks on one event loop share the state: the follower (snapshot and watch,
reacting to each change), the checker (every ``check_interval_s``: exits not yet reported, grace
decisions, hangs, then deleting the exit records that are over), the prober and the flusher. The
reactor host calls ``observe`` and ``forget`` from its own task on the same loop. Reactions are
synchronous: they update the state and queue their commands in an outbox, so nothing interleaves
with them, and a slow log never holds up the watch (thousands of learners' heartbeats a second would
otherwise queue behind one append each). The flusher sends the outbox in order, up to
:data:`MAX_BATCH` commands per append, and keeps a batch that failed to send it again: the outbox is
the only memory of a decided loss.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.core.states import JobState
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import Checkpoint, LossReason
from ffdl.handlers.heartbeat_keys import (
    JOBS_PREFIX,
    LearnerBeat,
    exit_key,
    learner_key,
    parse_exit,
    parse_key,
)
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import HeartbeatStore, StoreUnavailable, WatchEvent, WatchKind

log = structlog.get_logger(__name__)

#: What the prober reads: a key nobody writes, so the read is as cheap as the store can answer.
PROBE_KEY = "/ffdl/monitor/probe"
#: The most commands sent in one append to the log.
MAX_BATCH = 500


@dataclass(slots=True)
class _Learner:
    """What the monitor knows of one learner of the job's current attempt."""

    attempt: int
    beat: LearnerBeat | None = None
    progress_at: float = 0.0
    sent_progress: tuple[int, tuple[tuple[str, float], ...]] | None = None
    sent_progress_at: float = 0.0
    sent_checkpoint: tuple[str, int] | None = None
    exited: bool = False
    lost: bool = False
    gone: bool = False
    started_sent: bool = False


@dataclass(slots=True)
class _Watched:
    job: Job
    reap_after: float = 0.0
    learners: dict[int, _Learner] = field(default_factory=dict)

    def learner(self, rank: int) -> _Learner:
        entry = self.learners.get(rank)
        if entry is None or entry.attempt != self.job.attempt:
            entry = self.learners[rank] = _Learner(attempt=self.job.attempt)
        return entry


class Monitor:
    def __init__(
        self,
        store: HeartbeatStore,
        sender: CommandSender,
        *,
        heartbeat_ttl_s: float = 5.0,
        grace_s: float = 15.0,
        launch_timeout_s: float = 120.0,
        progress_interval_s: float = 0.5,
        check_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._sender = sender
        self._probe_interval_s = heartbeat_ttl_s / 4
        self._slow_probe_s = heartbeat_ttl_s / 4
        self._grace_s = grace_s
        self._launch_timeout_s = launch_timeout_s
        self._progress_interval_s = progress_interval_s
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._watched: dict[str, _Watched] = {}
        self._beats_by_key: dict[str, LearnerBeat] = {}
        self._exits: dict[str, dict[tuple[int, int], int]] = {}
        self._spent_exits: set[str] = set()  # exit record keys to delete from the store
        self._past_attempt: dict[str, int] = {}  # job -> the last attempt it has moved past
        self._reap_after = clock() + grace_s
        self._outbox: list[Command] = []
        self._outbox_filled = asyncio.Event()
        self.store_up = False
        self.probe_ok = True

    @property
    def healthy(self) -> bool:
        """Whether the store is followed and answering: losses may be decided (after the grace)."""
        return self.store_up and self.probe_ok

    # -- what the reactor host tells us ---------------------------------------------------------

    def observe(self, event: Event | None, job: Job) -> None:
        """Track ``job``; ``event`` None means the job was loaded from the log, not followed live."""
        if not job.state.observes_learners:
            self._watched.pop(job.job_id, None)
            # A restarting job already carries the number of the attempt it is about to launch.
            past = job.attempt - 1 if job.state is JobState.RESTARTING else job.attempt
            self._past_attempt[job.job_id] = past
            self._forget_exits(job.job_id, up_to_attempt=past)
            return
        watched = self._watched.get(job.job_id)
        if watched is None:
            watched = self._watched[job.job_id] = _Watched(job)
            if event is None:
                watched.reap_after = self._clock() + self._grace_s
        watched.job = job

    def forget(self, job_ids: set[str]) -> None:
        for job_id in job_ids:
            self._watched.pop(job_id, None)
            self._past_attempt.pop(job_id, None)

    # -- the loops ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the store until ``stop``; resync after any outage. Every (re)start begins with a grace."""
        self.store_up = False
        helpers = [
            asyncio.create_task(self._check_forever(stop)),
            asyncio.create_task(self._probe_forever(stop)),
        ]
        flusher = asyncio.create_task(self._flush_forever(stop))
        backoff = 0.2
        try:
            while not stop.is_set():
                try:
                    await self._follow(stop)
                    backoff = 0.2
                except StoreUnavailable as exc:
                    if self.store_up:
                        log.warning("heartbeat store unreachable: reaping paused", error=str(exc))
                    self.store_up = False
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(2.0, backoff * 2)
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            # The flusher sends what is queued and then ends, since ``stop`` is set; a crash cancels it.
            self._outbox_filled.set()
            if not stop.is_set():
                flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def _follow(self, stop: asyncio.Event) -> None:
        snapshot = await self._store.snapshot(JOBS_PREFIX)
        if not self.store_up:
            self.store_up = True
            self._start_grace(
                "heartbeat store reachable: following learners",
                revision=snapshot.revision,
                keys=len(snapshot.values),
            )
        exits = {k: v for k, v in snapshot.values.items() if _is_exit(k)}
        for key, value in sorted(exits.items()):
            self._on_put(key, value)
        for key in [k for k in self._beats_by_key if k not in snapshot.values]:
            self._on_delete(key)
        for key, value in sorted(snapshot.values.items()):
            if key not in exits:
                self._on_put(key, value)
        watch = self._store.watch(JOBS_PREFIX, snapshot.revision + 1)
        stopping = asyncio.create_task(stop.wait())
        next_change: asyncio.Future[WatchEvent] | None = None
        try:
            while not stop.is_set():
                next_change = asyncio.ensure_future(anext(watch))
                done, _ = await asyncio.wait({next_change, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if next_change not in done:
                    break
                change = await next_change
                next_change = None
                if change.kind is WatchKind.PUT:
                    self._on_put(change.key, change.value)
                else:
                    self._on_delete(change.key)
        finally:
            stopping.cancel()
            if next_change is not None:
                next_change.cancel()
                await asyncio.gather(next_change, return_exceptions=True)
            await watch.aclose()

    async def _check_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _sleep_or_stop(stop, self._check_interval_s)
            try:
                self._check()
            except Exception:
                log.exception("monitor check failed")
            await self._delete_spent_exits()

    async def _delete_spent_exits(self) -> None:
        """Delete the exit records of attempts that are over; what the store refuses now, next time."""
        for key in sorted(self._spent_exits):
            try:
                await self._store.delete(key)
            except StoreUnavailable:
                return
            self._spent_exits.discard(key)

    async def _probe_forever(self, stop: asyncio.Event) -> None:
        """Read the store every TTL/4; a read slower than TTL/4, or failed, is trouble (see the docstring)."""
        while not stop.is_set():
            await _sleep_or_stop(stop, self._probe_interval_s)
            probe = asyncio.ensure_future(self._store.snapshot(PROBE_KEY))
            done, _ = await asyncio.wait({probe}, timeout=self._slow_probe_s)
            if not done:
                self._probe_failed(f"no answer within {self._slow_probe_s:.2f}s")
                # The adapters bound every call with a deadline; this bound is only a backstop.
                done, _ = await asyncio.wait({probe}, timeout=max(10.0, 10 * self._slow_probe_s))
            if not done:
                probe.cancel()
                await asyncio.gather(probe, return_exceptions=True)
                continue
            error = probe.exception()
            if error is not None:
                if not isinstance(error, StoreUnavailable):
                    log.error("heartbeat store probe failed", error=repr(error))
                self._probe_failed(str(error) or type(error).__name__)
            elif not self.probe_ok:
                self.probe_ok = True
                self._start_grace("heartbeat store answers again")

    def _probe_failed(self, reason: str) -> None:
        if self.probe_ok:
            log.warning("heartbeat store slow or unreachable: reaping paused", reason=reason)
        self.probe_ok = False

    def _start_grace(self, message: str, **details: object) -> None:
        self._reap_after = max(self._reap_after, self._clock() + self._grace_s)
        log.info(message, grace_s=self._grace_s, **details)

    # -- reactions to the store -----------------------------------------------------------------

    def _on_put(self, key: str, value: bytes) -> None:
        parsed = parse_key(key)
        if parsed is None:
            return
        if parsed.kind == "exit":
            self._on_exit_record(parsed.job_id, parsed.attempt or 0, parsed.rank, value)
            return
        try:
            beat = LearnerBeat.from_json(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable heartbeat ignored", key=key, error=str(exc))
            return
        previous = self._beats_by_key.get(key)
        self._beats_by_key[key] = beat
        watched = self._watched.get(parsed.job_id)
        if watched is None or beat.attempt != watched.job.attempt:
            return
        self._take_beat(watched, parsed.rank, beat, new=previous is None or previous.attempt != beat.attempt)

    def _take_beat(self, watched: _Watched, rank: int, beat: LearnerBeat, *, new: bool) -> None:
        """A heartbeat of the job's current attempt: the learner is there (again)."""
        learner = watched.learner(rank)
        if learner.gone:
            learner.gone = False
            log.info("learner re-registered", job_id=watched.job.job_id, rank=rank, attempt=beat.attempt)
        previous = learner.beat
        if (
            new
            or previous is None
            or (beat.step, beat.last_progress) != (previous.step, previous.last_progress)
        ):
            learner.progress_at = self._clock()
        learner.beat = beat
        job = watched.job
        if not learner.started_sent and rank < len(job.learners) and not job.learners[rank].has_started:
            learner.started_sent = True
            self._send(
                job, cmd.ReportLearnerStarted(rank=rank, attempt=beat.attempt, pid=beat.pid, host=beat.host)
            )
        self._maybe_progress(job, rank, learner, force=False)
        self._maybe_checkpoint(job, rank, learner)

    def _on_exit_record(self, job_id: str, attempt: int, rank: int, value: bytes) -> None:
        try:
            code = parse_exit(value)
        except ValueError as exc:
            log.warning("unreadable exit record", job_id=job_id, rank=rank, attempt=attempt, error=str(exc))
            return
        self._exits.setdefault(job_id, {})[(attempt, rank)] = code
        past = self._past_attempt.get(job_id, 0)
        if attempt <= past:  # written after its job moved on (a learner stopped by a halt or cancel)
            self._forget_exits(job_id, up_to_attempt=past)
            return
        watched = self._watched.get(job_id)
        if watched is not None and watched.job.attempt == attempt:
            self._report_exit(watched, rank, code)

    def _report_exit(self, watched: _Watched, rank: int, code: int) -> None:
        learner = watched.learner(rank)
        if learner.exited:
            return
        self._maybe_progress(watched.job, rank, learner, force=True)
        self._maybe_checkpoint(watched.job, rank, learner)
        learner.exited = True
        self._send(
            watched.job, cmd.ReportLearnerExited(rank=rank, attempt=watched.job.attempt, exit_code=code)
        )

    def _on_delete(self, key: str) -> None:
        parsed = parse_key(key)
        beat = self._beats_by_key.pop(key, None)
        if parsed is None or parsed.kind != "learner" or beat is None:
            return
        watched = self._watched.get(parsed.job_id)
        if watched is None or watched.job.attempt != beat.attempt:
            return
        if (beat.attempt, parsed.rank) in self._exits.get(parsed.job_id, {}):
            return  # a clean exit: the agent wrote its exit record before it revoked the lease
        learner = watched.learner(parsed.rank)
        if learner.lost or learner.exited:
            return
        if self._may_reap(watched, self._clock()):
            self._lose(watched, parsed.rank, LossReason.EXPIRED, "heartbeat lease expired")
            return
        learner.gone = True
        log.info(
            "heartbeat deleted during a grace period: waiting for the learner to re-register",
            job_id=parsed.job_id,
            rank=parsed.rank,
            attempt=beat.attempt,
        )

    # -- periodic checks ------------------------------------------------------------------------

    def _may_reap(self, watched: _Watched, now: float) -> bool:
        return self.healthy and now >= self._reap_after and now >= watched.reap_after

    def _check(self) -> None:
        now = self._clock()
        wall = datetime.now(UTC)
        for watched in list(self._watched.values()):
            job = watched.job
            exits = self._exits.get(job.job_id, {})
            for state in job.learners:
                if not state.active:
                    continue
                learner = watched.learner(state.rank)
                if learner.lost or learner.exited:
                    continue
                code = exits.get((job.attempt, state.rank))
                if code is not None:
                    self._report_exit(watched, state.rank, code)
                    continue
                if learner.beat is None:
                    known = self._beats_by_key.get(learner_key(job.job_id, state.rank))
                    if known is not None and known.attempt == job.attempt:
                        self._take_beat(watched, state.rank, known, new=True)
                self._maybe_progress(job, state.rank, learner, force=False)
                if not self._may_reap(watched, now):
                    continue
                if learner.gone:
                    self._lose(
                        watched,
                        state.rank,
                        LossReason.EXPIRED,
                        f"heartbeat lease expired; not re-registered within {self._grace_s:.0f}s",
                    )
                elif learner.beat is None:
                    waited = (wall - job.history[-1].at).total_seconds()
                    limit = self._launch_timeout_s if job.state is JobState.LAUNCHING else self._grace_s
                    if waited > limit:
                        self._lose(
                            watched, state.rank, LossReason.EXPIRED, f"no heartbeat within {limit:.0f}s"
                        )
                elif (
                    job.state is JobState.RUNNING and now - learner.progress_at > job.spec.progress_timeout_s
                ):
                    detail = f"no progress for {job.spec.progress_timeout_s:.0f}s (step {learner.beat.step})"
                    self._lose(watched, state.rank, LossReason.HUNG, detail)

    def _forget_exits(self, job_id: str, up_to_attempt: int) -> None:
        """Exit records of attempts that are over matter no more; later attempts have higher numbers."""
        exits = self._exits.get(job_id)
        if exits is None:
            return
        for attempt, rank in [k for k in exits if k[0] <= up_to_attempt]:
            del exits[(attempt, rank)]
            self._spent_exits.add(exit_key(job_id, attempt, rank))
        if not exits:
            del self._exits[job_id]

    # -- sending --------------------------------------------------------------------------------

    def _maybe_progress(self, job: Job, rank: int, learner: _Learner, *, force: bool) -> None:
        beat = learner.beat
        if beat is None:
            return
        current = (beat.step, tuple(sorted(beat.metrics.items())))
        if current == learner.sent_progress:
            return
        now = self._clock()
        if not force and now - learner.sent_progress_at < self._progress_interval_s:
            return
        learner.sent_progress, learner.sent_progress_at = current, now
        self._send(
            job, cmd.ReportProgress(rank=rank, attempt=beat.attempt, step=beat.step, metrics=beat.metrics)
        )

    def _maybe_checkpoint(self, job: Job, rank: int, learner: _Learner) -> None:
        beat = learner.beat
        if beat is None or not beat.checkpoint:
            return
        try:
            checkpoint = Checkpoint.model_validate({**beat.checkpoint, "rank": rank, "attempt": beat.attempt})
        except ValueError as exc:
            log.warning("unreadable checkpoint in heartbeat", job_id=job.job_id, rank=rank, error=str(exc))
            return
        marker = (checkpoint.uri, checkpoint.step)
        if marker == learner.sent_checkpoint:
            return
        learner.sent_checkpoint = marker
        self._send(job, cmd.ReportCheckpoint(checkpoint=checkpoint))

    def _lose(self, watched: _Watched, rank: int, reason: LossReason, detail: str) -> None:
        learner = watched.learner(rank)
        learner.lost = True
        log.warning(
            "learner lost",
            job_id=watched.job.job_id,
            rank=rank,
            attempt=watched.job.attempt,
            reason=str(reason),
            detail=detail,
        )
        self._send(
            watched.job,
            cmd.ReportLearnerLost(rank=rank, attempt=watched.job.attempt, reason=reason, detail=detail),
        )

    def _send(self, job: Job, data: CommandData) -> None:
        self._outbox.append(self._sender.make(JOBS.address(job.job_id, job.tenant), data))
        self._outbox_filled.set()

    async def _flush_forever(self, stop: asyncio.Event) -> None:
        """Send what the reactions queued, in order, in batches; a failed batch is sent again."""
        backoff = 0.2
        while not stop.is_set() or self._outbox:
            if not self._outbox:
                await self._outbox_filled.wait()
            self._outbox_filled.clear()
            batch = self._outbox[:MAX_BATCH]
            try:
                await self._sender.send(*batch)
            except Exception as exc:  # the queue is all that remembers these reports: never drop it
                log.warning(
                    "monitor reports not sent; retrying",
                    commands=len(batch),
                    error=repr(exc),
                    retry_in_s=backoff,
                )
                await _sleep_or_stop(stop, backoff)
                if stop.is_set():
                    return
                backoff = min(2.0, backoff * 2)
                continue
            del self._outbox[: len(batch)]
            backoff = 0.2


def _is_exit(key: str) -> bool:
    parsed = parse_key(key)
    return parsed is not None and parsed.kind == "exit"


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return
