"""The driver runs, for each job, the one action its current state calls for.

Each job has one slot: the action key it last started. A new event that leaves the key unchanged
starts nothing (redeliveries and progress events are free); a new key starts the new action and,
if the old one is still waiting out a backoff, cancels it (a halt during a restart backoff must
not relaunch). Actions run as tasks so a slow one (stopping learners with a grace period) never
holds up the partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import structlog

from ffdl.core.job import Job
from ffdl.core.reconcile import Action, ActionKind, next_action
from ffdl.handlers import halting, launching, releasing, storing
from ffdl.handlers.context import ReactionContext
from ffdl.handlers.messaging import utcnow

log = structlog.get_logger(__name__)

Reaction = Callable[[Job, Action, ReactionContext], Awaitable[None]]

REACTIONS: Mapping[ActionKind, Reaction] = {
    ActionKind.BEGIN_LAUNCH: launching.begin_launch,
    ActionKind.LAUNCH: launching.launch,
    ActionKind.RELAUNCH: launching.relaunch,
    ActionKind.STOP: halting.stop_learners,
    ActionKind.STORE: storing.store_results,
    ActionKind.RELEASE: releasing.release_gpus,
}

_CANCELLABLE = frozenset({ActionKind.RELAUNCH})


@dataclass(slots=True)
class _Slot:
    key: tuple[ActionKind, int, int] | None
    task: asyncio.Task[None] | None

    def cancel_if_waiting(self) -> None:
        """Cancel an action that only waits (a relaunch backoff) once something else is due."""
        if (
            self.task is not None
            and not self.task.done()
            and self.key is not None
            and self.key[0] in _CANCELLABLE
        ):
            self.task.cancel()


class Driver:
    def __init__(self, ctx: ReactionContext, clock: Callable[[], datetime] = utcnow) -> None:
        self._ctx = ctx
        self._clock = clock
        self._slots: dict[str, _Slot] = {}

    def update(self, job: Job) -> None:
        action = next_action(job, self._clock())
        key = action.key if action else None
        slot = self._slots.get(job.job_id)
        if slot is not None and slot.key == key:
            return
        if slot is not None:
            slot.cancel_if_waiting()
        if action is None:
            self._slots[job.job_id] = _Slot(None, slot.task if slot else None)
            return
        task = asyncio.create_task(self._run(job, action), name=f"{action.kind}:{job.job_id}")
        self._slots[job.job_id] = _Slot(key, task)

    def forget(self, job_ids: set[str]) -> None:
        for job_id in job_ids:
            slot = self._slots.pop(job_id, None)
            if slot and slot.task and not slot.task.done():
                slot.task.cancel()

    async def _run(self, job: Job, action: Action) -> None:
        bound = log.bind(job_id=job.job_id, action=str(action.kind), attempt=action.attempt)
        try:
            await REACTIONS[action.kind](job, action, self._ctx)
        except asyncio.CancelledError:
            bound.info("action superseded")
            raise
        except Exception:
            bound.exception("action failed; it runs again on the job's next event or reconcile")
            self._slots.pop(job.job_id, None)

    async def close(self) -> None:
        tasks = [s.task for s in self._slots.values() if s.task and not s.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._slots.clear()
