"""Learners' heartbeats as the API shows them beside a job's learners."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ffdl.handlers.heartbeat_keys import JOBS_PREFIX, LearnerBeat, parse_key
from ffdl.handlers.ports import HeartbeatStore, StoreUnavailable


class HeartbeatView:
    """Learners' heartbeats as the API shows them: one snapshot of the store shared by all requests
    for ``max_age_s``, so a busy status API adds one store read per interval, not one per request.

    ``clock`` (monotonic seconds) ages the snapshot; ``wall_clock`` (seconds since the epoch, as the
    agents write their last progress) ages each learner's progress.
    """

    def __init__(
        self,
        store: HeartbeatStore,
        *,
        max_age_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._taken_at = float("-inf")
        self._by_job: dict[str, dict[int, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    async def of(self, job_id: str) -> dict[int, dict[str, Any]]:
        async with self._lock:
            if self._clock() - self._taken_at > self._max_age_s:
                await self._refresh()
        return self._by_job.get(job_id, {})

    async def _refresh(self) -> None:
        try:
            snapshot = await asyncio.wait_for(self._store.snapshot(JOBS_PREFIX), 1.0)
        except (StoreUnavailable, TimeoutError):
            self._by_job = {}
            return
        now = self._wall_clock()
        by_job: dict[str, dict[int, dict[str, Any]]] = {}
        for key, value in snapshot.values.items():
            parsed = parse_key(key)
            if parsed is None or parsed.kind != "learner":
                continue
            try:
                beat = LearnerBeat.from_json(value)
            except ValueError as exc:  # the key is the learner's to write: one bad beat breaks no read
                by_job.setdefault(parsed.job_id, {})[parsed.rank] = {"alive": True, "unreadable": str(exc)}
                continue
            by_job.setdefault(parsed.job_id, {})[parsed.rank] = {
                "alive": True,
                "attempt": beat.attempt,
                "last_progress_age_s": round(max(0.0, now - beat.last_progress), 3),
            }
        self._by_job, self._taken_at = by_job, self._clock()
