"""An etcd outage is not a learner death: the etcd store reports it as StoreUnavailable, quickly.

etcd is frozen with SIGSTOP, which keeps its sockets open and answers nothing: the hardest case,
since no connection error ever arrives and only deadlines and probes can tell.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Any

import pytest

from ffdl.adapters.heartbeats import EtcdHeartbeatStore
from ffdl.handlers.ports import StoreUnavailable, WatchKind
from tests.services import EtcdServer, free_port

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5
# Scheduling slack on a busy two-core machine on top of the deadline.
SLACK_S = 1.0


@pytest.fixture
async def store(etcd_server: EtcdServer) -> AsyncIterator[EtcdHeartbeatStore]:
    store = EtcdHeartbeatStore(etcd_server.host, etcd_server.port, timeout_s=TIMEOUT_S)
    yield store
    await store.close()


@pytest.fixture
def frozen(etcd_server: EtcdServer) -> Iterator[Callable[[], None]]:
    """Call it to freeze etcd; it is thawed when the test ends, whatever happens."""
    yield etcd_server.pause
    etcd_server.resume()


async def raises_unavailable_quickly(operation: Awaitable[Any]) -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await operation
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S


async def test_frozen_etcd_is_unavailable_not_lease_gone_and_recovers(
    etcd_server: EtcdServer, store: EtcdHeartbeatStore, frozen: Callable[[], None]
) -> None:
    key = f"/ffdl-test/{uuid.uuid4().hex}/learner"
    lease = await store.grant(4)
    await store.put(key, b"beat", lease)

    frozen()
    await raises_unavailable_quickly(store.keepalive(lease))
    await raises_unavailable_quickly(store.snapshot(key))
    await raises_unavailable_quickly(store.put(key, b"beat", lease))
    etcd_server.resume()

    assert await store.keepalive(lease) is True
    assert (await store.snapshot(key)).values == {key: b"beat"}
    await store.revoke(lease)


async def test_watch_on_frozen_etcd_raises_and_a_resync_misses_nothing(
    etcd_server: EtcdServer, store: EtcdHeartbeatStore, frozen: Callable[[], None]
) -> None:
    prefix = f"/ffdl-test/{uuid.uuid4().hex}/"
    start = (await store.snapshot(prefix)).revision + 1
    await store.put(prefix + "a", b"1")
    async with aclosing(store.watch(prefix, start)) as watch:
        async with asyncio.timeout(TIMEOUT_S + SLACK_S):
            assert (await anext(watch)).key == prefix + "a"

        frozen()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await anext(watch)
    # Idle for one timeout, then a probe that times out.
    assert time.monotonic() - started < 2 * TIMEOUT_S + SLACK_S
    etcd_server.resume()

    await store.put(prefix + "b", b"2")
    snapshot = await store.snapshot(prefix)
    assert snapshot.values == {prefix + "a": b"1", prefix + "b": b"2"}
    await store.put(prefix + "c", b"3")
    async with aclosing(store.watch(prefix, snapshot.revision + 1)) as resumed:
        async with asyncio.timeout(TIMEOUT_S + SLACK_S):
            change = await anext(resumed)
    assert (change.kind, change.key, change.value) == (WatchKind.PUT, prefix + "c", b"3")


async def test_nothing_listening_is_unavailable() -> None:
    store = EtcdHeartbeatStore("127.0.0.1", free_port(), timeout_s=TIMEOUT_S)
    try:
        await raises_unavailable_quickly(store.grant(1))
        await raises_unavailable_quickly(store.keepalive(1))
    finally:
        await store.close()
