"""The monitor: turns learner heartbeats into observations for the jobs' owners (architecture §6).

What a heartbeat, an exit record, a deletion, a probe or the passing of time means is decided by
the pure :class:`~ffdl.handlers.heartbeat_tracker.HeartbeatTracker` (its docstring tells what is
reported when, and why a store outage is not a learner death). This module is its async shell: it
feeds the tracker what the store says and the time, sends the reports and logs the notes.

Four tasks on one event loop share the tracker:

* the follower: a snapshot of every learner key, then a watch from the snapshot's revision; after
  the watch breaks it starts over with a new snapshot;
* the checker: every ``check_interval_s`` a tick (exits not yet reported, grace decisions, hangs),
  then it deletes the exit records that are spent, each once every report queued before it was
  spent has been sent: a relaunch that finds a stopped rank's exit record gone can count on its
  checkpoint being on the log already (``handlers/launching.py``);
* the prober: reads the store every ``heartbeat_ttl_s / 4``; a read slower than that, or failed, is
  trouble. A frozen etcd keeps its connections open, so a watch on it just goes quiet; the probe is
  what notices. A live learner's lease can only expire in etcd when the store could not serve its
  renewals (every TTL/3) for two thirds of a TTL, and any such stretch keeps a probe outstanding
  for longer than TTL/4, so it is seen as trouble before the expiries it causes are;
* the flusher: sends the outbox in order, up to :data:`MAX_BATCH` commands per append, and keeps a
  batch that failed to send it again: the outbox is the only memory of a decided loss. A command
  the log refuses for its size is dropped with a log line (never retried: it would stall every
  job's reports behind it); the tracker's reports are bounded, so this is a backstop.

The reactor host calls ``observe`` and ``forget`` from its own task on the same loop. The tracker
is synchronous and its reports are queued, so nothing interleaves with a reaction and a slow log
never holds up the watch (thousands of learners' heartbeats a second would otherwise queue behind
one append each). Only jobs of the partitions this process reacts for are observed, so several
monitors split the work like every other role; every monitor reads every key.

Time comes from the injected clocks only: ``clock`` (monotonic seconds) for graces, hangs and
progress intervals, ``wall_clock`` for how long a job has been in its state (its events carry wall
times).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import structlog

from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.events.envelope import Command, Event
from ffdl.handlers.aio import Backoff, sleep_or_stop, until_stopped
from ffdl.handlers.heartbeat_keys import JOBS_PREFIX
from ffdl.handlers.heartbeat_tracker import CHECKPOINT_INTERVAL_S, Effect, HeartbeatTracker, Report
from ffdl.handlers.messaging import CommandSender, utcnow
from ffdl.handlers.ports import HeartbeatStore, RecordTooLarge, StoreUnavailable, WatchEvent, WatchKind

log = structlog.get_logger(__name__)

#: What the prober reads: a key nobody writes, so the read is as cheap as the store can answer.
PROBE_KEY = "/ffdl/monitor/probe"
#: The most commands sent in one append to the log.
MAX_BATCH = 500
#: The first and the longest delay before following the store again, or sending reports again.
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0


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
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        check_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._sender = sender
        self._tracker = HeartbeatTracker(
            grace_s=grace_s,
            launch_timeout_s=launch_timeout_s,
            progress_interval_s=progress_interval_s,
            checkpoint_interval_s=checkpoint_interval_s,
        )
        self._probe_interval_s = heartbeat_ttl_s / 4
        self._slow_probe_s = heartbeat_ttl_s / 4
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._outbox: list[Command] = []
        self._outbox_filled = asyncio.Event()
        self._queued = 0  # reports ever queued: those sent (or dropped) are the first queued - len(outbox)
        #: spent exit records -> how many reports had been queued when they were first seen spent
        self._spent_since: dict[str, int] = {}

    @property
    def healthy(self) -> bool:
        """Whether the store is followed and answering: losses may be decided (after the grace)."""
        return self._tracker.healthy

    # -- what the reactor host tells us ---------------------------------------------------------

    def observe(self, event: Event | None, job: Job) -> None:
        """Track ``job``; ``event`` None means the job was loaded from the log, not followed live."""
        self._tracker.observe(job, adopted=event is None, now=self._clock())

    def forget(self, job_ids: set[str]) -> None:
        self._tracker.forget(job_ids)

    # -- the loops ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the store until ``stop``; resync after any outage. Every (re)start begins with a grace."""
        self._apply(self._tracker.store_lost("the monitor starts"))
        helpers = [
            asyncio.create_task(self._check_forever(stop)),
            asyncio.create_task(self._probe_forever(stop)),
        ]
        flusher = asyncio.create_task(self._flush_forever(stop))
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        try:
            while not stop.is_set():
                try:
                    await self._follow(stop, backoff)
                except StoreUnavailable as exc:
                    self._apply(self._tracker.store_lost(str(exc) or type(exc).__name__))
                    await sleep_or_stop(stop, backoff.next_delay())
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            # The flusher sends what is queued and then ends, since ``stop`` is set; a crash cancels it.
            self._outbox_filled.set()
            if not stop.is_set():
                flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def _follow(self, stop: asyncio.Event, backoff: Backoff) -> None:
        """A snapshot, then the watch from its revision until it breaks or ``stop``."""
        snapshot = await self._store.snapshot(JOBS_PREFIX)
        backoff.reset()
        self._apply(self._tracker.resync(snapshot.values, self._clock(), revision=snapshot.revision))
        watch = self._store.watch(JOBS_PREFIX, snapshot.revision + 1)
        try:
            await until_stopped(self._take_changes(watch), stop)
        finally:
            await watch.aclose()

    async def _take_changes(self, watch: AsyncIterator[WatchEvent]) -> None:
        async for change in watch:
            if change.kind is WatchKind.PUT:
                self._apply(self._tracker.put(change.key, change.value, self._clock()))
            else:
                self._apply(self._tracker.delete(change.key, self._clock()))

    async def _check_forever(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self._check_interval_s):
            try:
                self._apply(self._tracker.tick(self._clock(), self._wall_clock()))
            except Exception:
                log.exception("monitor check failed")
            await self._delete_spent_exits()

    async def _delete_spent_exits(self) -> None:
        """Delete the exit records of attempts that are over, each once the reports queued before it
        was spent are sent (they include what it and its rank's last beat said); what the store
        refuses now, next time."""
        for key in self._tracker.spent_exits:
            self._spent_since.setdefault(key, self._queued)
        sent = self._queued - len(self._outbox)
        for key, queued in list(self._spent_since.items()):
            if queued > sent:
                continue
            try:
                await self._store.delete(key)
            except StoreUnavailable:
                return
            del self._spent_since[key]
            self._tracker.exit_deleted(key)

    async def _probe_forever(self, stop: asyncio.Event) -> None:
        """Read the store every TTL/4; a read slower than TTL/4, or failed, is trouble (see the docstring)."""
        while not await sleep_or_stop(stop, self._probe_interval_s):
            probe = asyncio.ensure_future(self._store.snapshot(PROBE_KEY))
            done, _ = await asyncio.wait({probe}, timeout=self._slow_probe_s)
            if not done:
                self._apply(self._tracker.probe_failed(f"no answer within {self._slow_probe_s:.2f}s"))
                # The adapters bound every call with a deadline; this bound is only a backstop.
                done, _ = await asyncio.wait({probe}, timeout=max(10.0, 10 * self._slow_probe_s))
            if not done:
                probe.cancel()
                await asyncio.gather(probe, return_exceptions=True)
                continue
            error = probe.exception()
            if error is None:
                self._apply(self._tracker.probe_answered(self._clock()))
                continue
            if not isinstance(error, StoreUnavailable):
                log.error("heartbeat store probe failed", error=repr(error))
            self._apply(self._tracker.probe_failed(str(error) or type(error).__name__))

    # -- effects --------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        """Queue the reports for the flusher and log the notes, in the order the tracker decided them."""
        for effect in effects:
            if isinstance(effect, Report):
                self._outbox.append(
                    self._sender.make(JOBS.address(effect.job_id, effect.tenant), effect.data)
                )
                self._queued += 1
                self._outbox_filled.set()
            else:
                getattr(log, effect.level)(effect.message, **effect.details)

    async def _flush_forever(self, stop: asyncio.Event) -> None:
        """Send what the tracker decided, in order, in batches; a failed batch is sent again."""
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not stop.is_set() or self._outbox:
            if not self._outbox:
                await self._outbox_filled.wait()
            self._outbox_filled.clear()
            batch = self._outbox[:MAX_BATCH]
            try:
                try:
                    await self._sender.send(*batch)
                except RecordTooLarge:
                    await self._send_singly(batch)
                    continue
            except Exception as exc:  # the queue is all that remembers these reports: never drop it
                delay = backoff.next_delay()
                log.warning(
                    "monitor reports not sent; retrying",
                    commands=len(batch),
                    error=repr(exc),
                    retry_in_s=delay,
                )
                if await sleep_or_stop(stop, delay):
                    return
                continue
            del self._outbox[: len(batch)]
            backoff.reset()

    async def _send_singly(self, batch: list[Command]) -> None:
        """Send ``batch`` (the outbox's head) one command at a time, dropping each the log refuses for
        its size: sending it again could never succeed, and would hold up every job's reports behind
        it. Each sent or dropped command leaves the outbox at once, so a retry after an outage sends
        only the rest."""
        for command in batch:
            try:
                await self._sender.send(command)
            except RecordTooLarge as exc:
                log.error(
                    "monitor report dropped: larger than the log accepts",
                    job_id=command.job_id,
                    tenant=command.tenant,
                    command=command.type,
                    command_id=str(command.command_id),
                    reason=str(exc),
                )
            del self._outbox[0]
