"""CPU work the API does for tenants one piece at a time, taking turns among them.

The API parses manifests in one thread per process (:mod:`ffdl.api.dependencies`): parsing is pure
Python, and a second thread would parse no faster. Served in the order they come, a tenant that
sends the costliest manifests as fast as it can fills that thread's queue, and every other tenant's
submission waits behind the flood until about its deadline, refused (503) once it comes too late.

So each tenant has a queue of its own, whose pieces waiting cost at most ``bound`` in all (a
manifest costs its bytes: what parsing it costs goes with its length; one past the bound is refused
at once, for that tenant alone, and a tenant with nothing waiting always gets one in), and the
worker takes the next piece from the tenant it served least recently (:class:`TenantQueues`): a
tenant's piece waits for the one being done and at most one of each other tenant with work waiting,
however many that tenant has queued or keeps sending. The order is equal turns, not the tenants' GPU
shares: a share of 10 would let one tenant's flood hold another's submission for ten parses, past
its deadline."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class TenantQueues(Generic[T]):
    """Tenants' items waiting for one worker, each tenant's in the order they came, those waiting of
    a tenant costing at most ``bound`` in all (one is let in whatever its cost while the tenant has
    none waiting); :meth:`take` serves the tenant with items that was served least recently
    (never served first, then in the order their items came), so tenants with items take turns.

    Not thread-safe: its owner holds a lock (see :class:`FairWorker`)."""

    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError("a tenant must be allowed at least one item waiting")
        self.bound = bound
        self._waiting: dict[str, deque[tuple[T, int]]] = {}  # tenants with items (and their costs),
        # in the order they became so
        self._costs: dict[str, int] = {}  # tenant -> what its items waiting cost in all
        # the turn at which each tenant was last served (kept for every tenant seen, the tenants of
        # the tenants file: dropped, a tenant served just now would come first again with its next)
        self._served: dict[str, int] = {}
        self._turn = 0

    def offer(self, tenant: str, item: T, cost: int = 1) -> bool:
        """Queue ``item``, which costs ``cost``, for ``tenant``; False (not queued) if what the
        tenant has waiting would then cost more than :attr:`bound`."""
        if not self.admits(tenant, cost):
            return False
        self._waiting.setdefault(tenant, deque()).append((item, cost))
        self._costs[tenant] = self._costs.get(tenant, 0) + cost
        return True

    def admits(self, tenant: str, cost: int) -> bool:
        """Whether an item costing ``cost`` would be let into ``tenant``'s queue now."""
        waiting = self._costs.get(tenant, 0)
        return not waiting or waiting + cost <= self.bound

    def _gone(self, tenant: str, cost: int) -> None:
        left = self._costs[tenant] - cost
        if self._waiting.get(tenant):
            self._costs[tenant] = left
        else:
            self._waiting.pop(tenant, None)
            del self._costs[tenant]

    def take(self) -> T | None:
        """The next item: the first of the tenant served least recently; None if none waits."""
        if not self._waiting:
            return None
        # dicts keep their order: among tenants never served (or served at the same turn, none) the
        # first with items waiting comes first
        tenant = min(self._waiting, key=lambda name: self._served.get(name, -1))
        item, cost = self._waiting[tenant].popleft()
        self._gone(tenant, cost)
        self._turn += 1
        self._served[tenant] = self._turn
        return item

    def withdraw(self, tenant: str, item: T) -> bool:
        """Take ``item`` out of ``tenant``'s queue; False if it is not there (taken already)."""
        queue = self._waiting.get(tenant)
        if queue is None:
            return False
        for index, (waiting, cost) in enumerate(queue):
            if waiting is item:
                del queue[index]
                self._gone(tenant, cost)
                return True
        return False

    def waiting(self, tenant: str) -> int:
        """How many of ``tenant``'s items wait."""
        return len(self._waiting.get(tenant, ()))


@dataclass(eq=False, slots=True)
class _Work:
    tenant: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future[Any] = field(default_factory=Future)


class FairWorker:
    """One thread of its own (``name``) doing tenants' work one piece at a time, the pieces taken in
    turns among tenants (:class:`TenantQueues`), a tenant's waiting costing at most ``bound``.

    The thread starts with the first piece (in the process that submits it: a process forked after
    it has none, and starts its own)."""

    def __init__(self, bound: int, name: str) -> None:
        self._queues: TenantQueues[_Work] = TenantQueues(bound)
        self._queued: dict[Future[Any], _Work] = {}  # the pieces waiting, by their futures
        self._name = name
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def bound(self) -> int:
        return self._queues.bound

    def submit(self, tenant: str, fn: Callable[..., R], *args: Any, cost: int = 1) -> Future[R] | None:
        """``fn(*args)`` done in ``tenant``'s turn, as a future; None (nothing queued) if what
        ``tenant`` has waiting would then cost more than :attr:`bound`."""
        work = _Work(tenant, fn, args)
        with self._lock:
            if not self._queues.offer(tenant, work, cost):
                return None
            self._queued[work.future] = work
            if self._thread is None or self._pid != os.getpid():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._pid = os.getpid()
                self._thread.start()
            self._lock.notify()
        return work.future

    def withdraw(self, future: Future[Any]) -> bool:
        """Cancel the piece of ``future`` if it still waits (it is never done, and frees its place in
        its tenant's queue); False once the worker has taken it (it runs, or has run)."""
        with self._lock:
            work = self._queued.pop(future, None)
            if work is None:
                return False
            self._queues.withdraw(work.tenant, work)
        future.cancel()
        return True

    def waiting(self, tenant: str) -> int:
        with self._lock:
            return self._queues.waiting(tenant)

    def admits(self, tenant: str, cost: int) -> bool:
        with self._lock:
            return self._queues.admits(tenant, cost)

    def _run(self) -> None:
        while True:
            with self._lock:
                work = self._queues.take()
                while work is None:
                    self._lock.wait()
                    work = self._queues.take()
                del self._queued[work.future]
            if not work.future.set_running_or_notify_cancel():
                continue
            try:
                result = work.fn(*work.args)
            except BaseException as exc:  # handed to whoever waits for it, as a pool does
                work.future.set_exception(exc)
            else:
                work.future.set_result(result)
            del work  # the body it holds is not kept while the thread waits
