"""The instant launcher: every learner starts and exits 0 at once, for benchmarks and scale tests.

It runs nothing. For each learner of an attempt it does in the heartbeat store what a learner agent
does over a whole run (architecture §6): it grants a lease, puts the learner's heartbeat under its learner
key bound to that lease, writes the exit record with code 0, then revokes the lease. The platform's
monitor therefore reports each learner as started and exited through its normal path, and a job
goes through every state of a real run to COMPLETED in a few milliseconds of platform time.

Idempotency: an attempt is launched at most once per store. A learner whose exit record exists
already (written by this launcher or by another process's, before a rebalance moved the job) is
not written again; attempt numbers are never reused, so a redelivered launch starts nothing.
Nothing stays running, so ``running`` is always empty and ``stop`` has nothing to stop.

Concurrency: launches of different jobs run concurrently; a store operation is one awaited call.
"""

from __future__ import annotations

import socket
import time

import structlog

from ffdl.handlers.heartbeat_keys import LearnerBeat, encode_exit, exit_key, learner_key
from ffdl.handlers.ports import HeartbeatStore, LaunchRequest, LearnerHandle

log = structlog.get_logger(__name__)


class InstantLauncher:
    """A :class:`~ffdl.handlers.ports.Launcher` whose learners complete as soon as they are launched."""

    def __init__(
        self, store: HeartbeatStore, *, heartbeat_ttl_s: float = 5.0, host: str | None = None
    ) -> None:
        self._store = store
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._host = host or socket.gethostname()

    async def launch(self, request: LaunchRequest) -> None:
        for learner in request.placement.learners:
            if await self._exited(request.job_id, request.attempt, learner.rank):
                continue
            now = time.time()
            beat = LearnerBeat(attempt=request.attempt, host=self._host, last_progress=now, started_at=now)
            lease = await self._store.grant(self._heartbeat_ttl_s)
            await self._store.put(learner_key(request.job_id, learner.rank), beat.to_json(), lease)
            await self._store.put(exit_key(request.job_id, request.attempt, learner.rank), encode_exit(0))
            await self._store.revoke(lease)
        log.debug(
            "learners completed at once",
            job_id=request.job_id,
            attempt=request.attempt,
            learners=len(request.placement.learners),
        )

    async def _exited(self, job_id: str, attempt: int, rank: int) -> bool:
        key = exit_key(job_id, attempt, rank)
        return key in (await self._store.snapshot(key)).values

    async def stop(self, job_id: str, grace_s: float) -> None:
        """Nothing to stop: instant learners are gone as soon as they started."""

    async def running(self) -> list[LearnerHandle]:
        return []

    async def close(self) -> None:
        """Nothing to release: the heartbeat store belongs to the caller."""
