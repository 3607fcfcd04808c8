"""The monitor: turns learner heartbeats into observations for the jobs' owners (DESIGN §6).

It watches every learner key in the heartbeat store (a snapshot, then a watch from the snapshot's
revision; after the watch breaks it starts over with a new snapshot) and reports:

* a learner's first heartbeat of an attempt -> ``ReportLearnerStarted``;
* a change of step or metrics -> ``ReportProgress`` (at most every ``progress_interval_s`` per
  learner, flushed before an exit so final metrics are never lost);
* a new checkpoint in the heartbeat -> ``ReportCheckpoint``;
* an exit record -> ``ReportLearnerExited`` with the code;
* a learner key deleted without an exit record (its lease expired) -> ``ReportLearnerLost(expired)``;
* no progress for the job's ``progress_timeout_s`` -> ``ReportLearnerLost(hung)``; process liveness
  is not progress.

A store outage is not a learner death: while the store is unreachable nothing is reaped, and
after it comes back (and after the monitor starts) learners get ``grace_s`` to re-register
before a missing heartbeat counts as a loss. Only jobs of the partitions this process reacts for
are watched, so several monitors split the work like every other role.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from ffdl.core.job import Job
from ffdl.core.states import JobState
from ffdl.events import commands as cmd
from ffdl.events.envelope import CommandData, Event
from ffdl.events.model import Checkpoint, LossReason
from ffdl.handlers.heartbeat_keys import JOBS_PREFIX, LearnerBeat, exit_key, parse_exit, parse_key
from ffdl.handlers.messaging import CommandSender
from ffdl.handlers.ports import HeartbeatStore, StoreUnavailable, WatchEvent, WatchKind

log = structlog.get_logger(__name__)

_WATCHED = (JobState.LAUNCHING, JobState.RUNNING, JobState.HALTING)


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
    started_sent: bool = False


@dataclass(slots=True)
class _Watched:
    job: Job
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
        grace_s: float = 15.0,
        launch_timeout_s: float = 120.0,
        progress_interval_s: float = 0.5,
        check_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._sender = sender
        self._grace_s = grace_s
        self._launch_timeout_s = launch_timeout_s
        self._progress_interval_s = progress_interval_s
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._watched: dict[str, _Watched] = {}
        self._beats_by_key: dict[str, LearnerBeat] = {}
        self._exits: set[tuple[str, int, int]] = set()
        self._reap_after = clock() + grace_s
        self.store_up = False

    # -- what the reactor host tells us ---------------------------------------------------------

    def observe(self, event: Event | None, job: Job) -> None:
        if job.state not in _WATCHED:
            self._watched.pop(job.job_id, None)
            return
        watched = self._watched.get(job.job_id)
        if watched is None:
            self._watched[job.job_id] = watched = _Watched(job)
        watched.job = job

    def forget(self, job_ids: set[str]) -> None:
        for job_id in job_ids:
            self._watched.pop(job_id, None)

    # -- the loops ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the store until ``stop``; resync after any outage."""
        checker = asyncio.create_task(self._check_forever(stop))
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
            checker.cancel()
            await asyncio.gather(checker, return_exceptions=True)

    async def _follow(self, stop: asyncio.Event) -> None:
        snapshot = await self._store.snapshot(JOBS_PREFIX)
        if not self.store_up:
            self._reap_after = max(self._reap_after, self._clock() + self._grace_s)
            self.store_up = True
            log.info("heartbeat store reachable: following learners", revision=snapshot.revision,
                     keys=len(snapshot.values))
        present = set(snapshot.values)
        for key in [k for k in self._beats_by_key if k not in present]:
            await self._on_delete(key)
        for key, value in sorted(snapshot.values.items()):
            await self._on_put(key, value)
        watch = self._store.watch(JOBS_PREFIX, snapshot.revision + 1)
        stopping = asyncio.create_task(stop.wait())
        next_change: asyncio.Future[WatchEvent] | None = None
        try:
            while not stop.is_set():
                next_change = asyncio.ensure_future(anext(watch))
                done, _ = await asyncio.wait({next_change, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if next_change not in done:
                    break
                change = next_change.result()
                next_change = None
                if change.kind is WatchKind.PUT:
                    await self._on_put(change.key, change.value)
                else:
                    await self._on_delete(change.key)
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
                await self._check()
            except StoreUnavailable:
                continue
            except Exception:
                log.exception("monitor check failed")

    # -- reactions to the store -----------------------------------------------------------------

    async def _on_put(self, key: str, value: bytes) -> None:
        parsed = parse_key(key)
        if parsed is None:
            return
        if parsed.kind == "exit":
            await self._on_exit(parsed.job_id, parsed.attempt or 0, parsed.rank, value)
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
        learner = watched.learner(parsed.rank)
        now = self._clock()
        if learner.beat is None or (beat.step, beat.last_progress) != (learner.beat.step, learner.beat.last_progress):
            learner.progress_at = now
        if previous is None or previous.attempt != beat.attempt:
            learner.progress_at = now
        learner.beat = beat
        job = watched.job
        if not learner.started_sent and parsed.rank < len(job.learners) and not job.learners[parsed.rank].has_started:
            learner.started_sent = True
            await self._send(job, cmd.ReportLearnerStarted(rank=parsed.rank, attempt=beat.attempt, pid=beat.pid,
                                                           host=beat.host))
        await self._maybe_progress(job, parsed.rank, learner, force=False)
        await self._maybe_checkpoint(job, parsed.rank, learner)

    async def _on_exit(self, job_id: str, attempt: int, rank: int, value: bytes) -> None:
        marker = (job_id, attempt, rank)
        if marker in self._exits:
            return
        self._exits.add(marker)
        watched = self._watched.get(job_id)
        if watched is None or watched.job.attempt != attempt:
            return
        try:
            code = parse_exit(value)
        except ValueError as exc:
            log.warning("unreadable exit record", job_id=job_id, rank=rank, error=str(exc))
            return
        learner = watched.learner(rank)
        await self._maybe_progress(watched.job, rank, learner, force=True)
        await self._maybe_checkpoint(watched.job, rank, learner)
        learner.exited = True
        await self._send(watched.job, cmd.ReportLearnerExited(rank=rank, attempt=attempt, exit_code=code))

    async def _on_delete(self, key: str) -> None:
        parsed = parse_key(key)
        beat = self._beats_by_key.pop(key, None)
        if parsed is None or parsed.kind != "learner" or beat is None:
            return
        watched = self._watched.get(parsed.job_id)
        if watched is None or watched.job.attempt != beat.attempt:
            return
        if (parsed.job_id, beat.attempt, parsed.rank) in self._exits:
            return
        try:
            exit_value = (await self._store.snapshot(exit_key(parsed.job_id, beat.attempt, parsed.rank))).values
        except StoreUnavailable:
            exit_value = {}
        if exit_value:
            for exit_key_name, value in exit_value.items():
                await self._on_put(exit_key_name, value)
            return
        await self._lose(watched, parsed.rank, LossReason.EXPIRED, "heartbeat lease expired")

    # -- periodic checks ------------------------------------------------------------------------

    async def _check(self) -> None:
        now = self._clock()
        wall = datetime.now(UTC)
        for watched in list(self._watched.values()):
            job = watched.job
            for state in job.learners:
                if not state.active:
                    continue
                learner = watched.learner(state.rank)
                if learner.lost or learner.exited:
                    continue
                await self._maybe_progress(job, state.rank, learner, force=False)
                if not self.store_up or now < self._reap_after:
                    continue
                if learner.beat is None:
                    waited = (wall - job.history[-1].at).total_seconds()
                    limit = self._launch_timeout_s if job.state is JobState.LAUNCHING else self._grace_s
                    if waited > limit:
                        await self._lose(watched, state.rank, LossReason.EXPIRED,
                                         f"no heartbeat within {limit:.0f}s")
                elif job.state is JobState.RUNNING and now - learner.progress_at > job.spec.progress_timeout_s:
                    detail = f"no progress for {job.spec.progress_timeout_s:.0f}s (step {learner.beat.step})"
                    await self._lose(watched, state.rank, LossReason.HUNG, detail)

    # -- sending --------------------------------------------------------------------------------

    async def _maybe_progress(self, job: Job, rank: int, learner: _Learner, *, force: bool) -> None:
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
        await self._send(job, cmd.ReportProgress(rank=rank, attempt=beat.attempt, step=beat.step, metrics=beat.metrics))

    async def _maybe_checkpoint(self, job: Job, rank: int, learner: _Learner) -> None:
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
        await self._send(job, cmd.ReportCheckpoint(checkpoint=checkpoint))

    async def _lose(self, watched: _Watched, rank: int, reason: LossReason, detail: str) -> None:
        learner = watched.learner(rank)
        learner.lost = True
        log.warning("learner lost", job_id=watched.job.job_id, rank=rank, attempt=watched.job.attempt,
                    reason=str(reason), detail=detail)
        await self._send(watched.job, cmd.ReportLearnerLost(rank=rank, attempt=watched.job.attempt, reason=reason,
                                                            detail=detail))

    async def _send(self, job: Job, data: CommandData) -> None:
        await self._sender.send(self._sender.make(job.job_id, job.tenant, data))


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return
