"""The contract every HeartbeatStore passes: the embedded SQLite store and a real etcd.

Each test works under its own random prefix, so tests sharing one etcd cannot see each other.
Leases are one second long: expiry is real time, which is what is under test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from ffdl.adapters.heartbeats import open_store
from ffdl.handlers.ports import HeartbeatStore, WatchEvent, WatchKind
from tests.services import wait_until_async

TTL_S = 1.0
EXPIRY_WAIT_S = 5.0


@pytest.fixture(params=["embedded", pytest.param("etcd", marks=pytest.mark.integration)])
async def heartbeat_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HeartbeatStore]:
    if request.param == "embedded":
        url = f"embedded://{tmp_path / 'heartbeats.sqlite'}"
    else:
        url = request.getfixturevalue("etcd_server").url
    store = open_store(url)
    yield store
    await store.close()


@pytest.fixture
def prefix() -> str:
    return f"/ffdl-test/{uuid.uuid4().hex}/"


async def next_events(
    store: HeartbeatStore, prefix: str, start_revision: int, count: int, timeout_s: float = EXPIRY_WAIT_S
) -> list[WatchEvent]:
    """The first ``count`` changes under ``prefix`` from ``start_revision``, or TimeoutError."""
    watch = store.watch(prefix, start_revision)
    assert isinstance(watch, AsyncGenerator)
    events: list[WatchEvent] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(events) < count:
                events.append(await anext(watch))
    finally:
        await watch.aclose()
    return events


def changes(events: list[WatchEvent]) -> list[tuple[WatchKind, str, bytes]]:
    return [(event.kind, event.key, event.value) for event in events]


async def test_put_overwrite_and_delete_show_in_snapshot(
    heartbeat_store: HeartbeatStore, prefix: str
) -> None:
    lease = await heartbeat_store.grant(30)
    await heartbeat_store.put(prefix + "a", b"1")
    await heartbeat_store.put(prefix + "b", b"2", lease)
    first = await heartbeat_store.snapshot(prefix)
    assert first.values == {prefix + "a": b"1", prefix + "b": b"2"}

    await heartbeat_store.put(prefix + "a", b"3")
    await heartbeat_store.delete(prefix + "b")
    await heartbeat_store.delete(prefix + "never-there")
    second = await heartbeat_store.snapshot(prefix)
    assert second.values == {prefix + "a": b"3"}
    assert second.revision == first.revision + 2
    await heartbeat_store.revoke(lease)


async def test_lease_expiry_deletes_key_and_watch_sees_delete(
    heartbeat_store: HeartbeatStore, prefix: str
) -> None:
    start = (await heartbeat_store.snapshot(prefix)).revision + 1
    lease = await heartbeat_store.grant(TTL_S)
    await heartbeat_store.put(prefix + "learner", b"beat", lease)

    events = await next_events(heartbeat_store, prefix, start, count=2)

    assert changes(events) == [
        (WatchKind.PUT, prefix + "learner", b"beat"),
        (WatchKind.DELETE, prefix + "learner", b""),
    ]
    assert events[0].revision < events[1].revision
    assert (await heartbeat_store.snapshot(prefix)).values == {}


async def test_keepalive_keeps_lease_alive_past_its_ttl(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    lease = await heartbeat_store.grant(TTL_S)
    await heartbeat_store.put(prefix + "learner", b"beat", lease)
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.5 * TTL_S
    while loop.time() < until:
        assert await heartbeat_store.keepalive(lease)
        await asyncio.sleep(TTL_S / 4)

    assert (await heartbeat_store.snapshot(prefix)).values == {prefix + "learner": b"beat"}
    await heartbeat_store.revoke(lease)


async def test_expired_lease_cannot_be_kept_alive_or_used(
    heartbeat_store: HeartbeatStore, prefix: str
) -> None:
    lease = await heartbeat_store.grant(TTL_S)
    await heartbeat_store.put(prefix + "learner", b"beat", lease)

    async def key_gone() -> bool:
        return not (await heartbeat_store.snapshot(prefix)).values

    await wait_until_async(key_gone, EXPIRY_WAIT_S, what="lease expiry")

    assert await heartbeat_store.keepalive(lease) is False
    with pytest.raises(LookupError):
        await heartbeat_store.put(prefix + "learner", b"late", lease)
    assert (await heartbeat_store.snapshot(prefix)).values == {}


async def test_revoke_deletes_the_keys_at_once(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    lease = await heartbeat_store.grant(30)
    other = await heartbeat_store.grant(30)
    await heartbeat_store.put(prefix + "a", b"1", lease)
    await heartbeat_store.put(prefix + "b", b"2", lease)
    await heartbeat_store.put(prefix + "c", b"3", other)
    start = (await heartbeat_store.snapshot(prefix)).revision + 1

    await heartbeat_store.revoke(lease)

    assert (await heartbeat_store.snapshot(prefix)).values == {prefix + "c": b"3"}
    assert sorted(changes(await next_events(heartbeat_store, prefix, start, count=2))) == [
        (WatchKind.DELETE, prefix + "a", b""),
        (WatchKind.DELETE, prefix + "b", b""),
    ]
    assert await heartbeat_store.keepalive(lease) is False
    await heartbeat_store.revoke(lease)
    assert await heartbeat_store.keepalive(other) is True
    await heartbeat_store.revoke(other)


async def test_watch_from_a_revision_sees_later_changes_in_order(
    heartbeat_store: HeartbeatStore, prefix: str
) -> None:
    start = (await heartbeat_store.snapshot(prefix)).revision + 1
    for index in range(5):
        await heartbeat_store.put(prefix + f"k{index % 2}", f"v{index}".encode())
    await heartbeat_store.delete(prefix + "k0")

    events = await next_events(heartbeat_store, prefix, start, count=6)

    assert changes(events) == [
        (WatchKind.PUT, prefix + "k0", b"v0"),
        (WatchKind.PUT, prefix + "k1", b"v1"),
        (WatchKind.PUT, prefix + "k0", b"v2"),
        (WatchKind.PUT, prefix + "k1", b"v3"),
        (WatchKind.PUT, prefix + "k0", b"v4"),
        (WatchKind.DELETE, prefix + "k0", b""),
    ]
    revisions = [event.revision for event in events]
    assert revisions == sorted(set(revisions))
    assert revisions[0] >= start


async def test_watch_sees_changes_made_after_it_started(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    start = (await heartbeat_store.snapshot(prefix)).revision + 1
    watching = asyncio.create_task(next_events(heartbeat_store, prefix, start, count=2))
    await heartbeat_store.put(prefix + "a", b"1")
    await heartbeat_store.put(prefix + "b", b"2")

    assert changes(await watching) == [
        (WatchKind.PUT, prefix + "a", b"1"),
        (WatchKind.PUT, prefix + "b", b"2"),
    ]


async def test_snapshot_then_watch_from_next_revision_misses_nothing(
    heartbeat_store: HeartbeatStore, prefix: str
) -> None:
    await heartbeat_store.put(prefix + "before", b"0")
    await heartbeat_store.put(prefix + "kept", b"0")
    snapshot = await heartbeat_store.snapshot(prefix)
    await heartbeat_store.put(prefix + "after", b"1")
    await heartbeat_store.put(prefix + "kept", b"1")
    await heartbeat_store.delete(prefix + "before")

    events = await next_events(heartbeat_store, prefix, snapshot.revision + 1, count=3)

    assert changes(events) == [
        (WatchKind.PUT, prefix + "after", b"1"),
        (WatchKind.PUT, prefix + "kept", b"1"),
        (WatchKind.DELETE, prefix + "before", b""),
    ]
    folded = dict(snapshot.values)
    for event in events:
        if event.kind is WatchKind.PUT:
            folded[event.key] = event.value
        else:
            del folded[event.key]
    final = await heartbeat_store.snapshot(prefix)
    assert folded == final.values
    assert final.revision == events[-1].revision


async def test_prefixes_are_isolated(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    watched = prefix + "job-1/"
    start = (await heartbeat_store.snapshot(watched)).revision + 1
    await heartbeat_store.put(prefix + "job-10/learners/0", b"other job")
    await heartbeat_store.put(prefix + "job-1", b"not under the prefix")
    await heartbeat_store.put(watched + "learners/0", b"mine")
    await heartbeat_store.delete(prefix + "job-10/learners/0")
    await heartbeat_store.put(watched + "learners/1", b"mine too")

    events = await next_events(heartbeat_store, watched, start, count=2)

    assert changes(events) == [
        (WatchKind.PUT, watched + "learners/0", b"mine"),
        (WatchKind.PUT, watched + "learners/1", b"mine too"),
    ]
    assert (await heartbeat_store.snapshot(watched)).values == {
        watched + "learners/0": b"mine",
        watched + "learners/1": b"mine too",
    }


async def test_put_with_an_unknown_lease_is_refused(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    lease = await heartbeat_store.grant(30)
    await heartbeat_store.revoke(lease)

    with pytest.raises(LookupError):
        await heartbeat_store.put(prefix + "a", b"1", lease)
    assert (await heartbeat_store.snapshot(prefix)).values == {}


async def test_watch_needs_a_positive_start_revision(heartbeat_store: HeartbeatStore, prefix: str) -> None:
    with pytest.raises(ValueError, match="revisions start at 1"):
        await next_events(heartbeat_store, prefix, 0, count=1)
