"""What is particular to the heartbeat adapters beyond the shared contract: choosing one by URL, and
the embedded store's file (shared by processes, compacted, unusable)."""

from __future__ import annotations

import asyncio
import re
import sys
from contextlib import aclosing
from pathlib import Path

import pytest

from ffdl.adapters.heartbeats import (
    EmbeddedHeartbeatStore,
    EtcdHeartbeatStore,
    exit_key,
    learner_key,
    open_store,
    parse_key,
)
from ffdl.handlers.ports import StoreUnavailable, WatchKind


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("embedded:///var/lib/ffdl/heartbeats.sqlite", EmbeddedHeartbeatStore),
        ("etcd://127.0.0.1:2379", EtcdHeartbeatStore),
        ("etcd://etcd.ffdl.svc:2379/", EtcdHeartbeatStore),
    ],
)
def test_open_store_picks_the_adapter_the_url_names(url: str, kind: type) -> None:
    assert isinstance(open_store(url), kind)


@pytest.mark.parametrize(
    "url",
    [
        "embedded://relative/heartbeats.sqlite",
        "embedded:heartbeats.sqlite",
        "etcd://127.0.0.1",
        "etcd://127.0.0.1:port",
        "etcd://127.0.0.1:2379/prefix",
        "etcd://127.0.0.1:2379?timeout=1",
        "redis://127.0.0.1:6379",
        "/var/lib/ffdl/heartbeats.sqlite",
    ],
)
def test_open_store_refuses_other_urls_and_names_the_accepted_forms(url: str) -> None:
    with pytest.raises(ValueError, match=re.escape("embedded:///ABSOLUTE/PATH.sqlite or etcd://HOST:PORT")):
        open_store(url)


def test_key_layout_is_reexported_for_agents() -> None:
    assert learner_key("job-1", 2) == "/ffdl/jobs/job-1/learners/2"
    assert exit_key("job-1", 3, 2) == "/ffdl/jobs/job-1/exits/3/2"
    learner = parse_key(learner_key("job-1", 2))
    exited = parse_key(exit_key("job-1", 3, 2))
    assert learner is not None
    assert (learner.kind, learner.job_id, learner.attempt, learner.rank) == ("learner", "job-1", None, 2)
    assert exited is not None
    assert (exited.kind, exited.job_id, exited.attempt, exited.rank) == ("exit", "job-1", 3, 2)
    assert parse_key("/ffdl/jobs/job-1/other/2") is None


async def test_watch_from_a_compacted_revision_asks_for_a_resync(tmp_path: Path) -> None:
    store = EmbeddedHeartbeatStore(tmp_path / "heartbeats.sqlite", retained_revisions=10)
    try:
        start = (await store.snapshot("/p/")).revision + 1
        for index in range(15):
            await store.put("/p/key", str(index).encode())

        with pytest.raises(StoreUnavailable, match="compacted"):
            await anext(store.watch("/p/", start))

        snapshot = await store.snapshot("/p/")
        await store.put("/p/key", b"after")
        async with aclosing(store.watch("/p/", snapshot.revision + 1)) as watch:
            change = await anext(watch)
        assert (change.kind, change.value, change.revision) == (
            WatchKind.PUT,
            b"after",
            snapshot.revision + 1,
        )
    finally:
        await store.close()


@pytest.mark.parametrize("make_unusable", ["missing directory", "not a database"])
async def test_an_unusable_file_is_store_unavailable(tmp_path: Path, make_unusable: str) -> None:
    if make_unusable == "missing directory":
        path = tmp_path / "absent" / "heartbeats.sqlite"
    else:
        path = tmp_path / "heartbeats.sqlite"
        path.write_bytes(b"this is not a SQLite database, it is text " * 100)
    store = EmbeddedHeartbeatStore(path)
    try:
        with pytest.raises(StoreUnavailable, match=str(path)):
            await store.grant(1)
        with pytest.raises(StoreUnavailable):
            await store.snapshot("/")
    finally:
        await store.close()


async def test_a_closed_store_is_unavailable(tmp_path: Path) -> None:
    store = EmbeddedHeartbeatStore(tmp_path / "heartbeats.sqlite")
    await store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.snapshot("/")


AGENT = """
import asyncio, sys
from pathlib import Path
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore

async def beat() -> None:
    store = EmbeddedHeartbeatStore(Path(sys.argv[1]))
    lease = await store.grant(float(sys.argv[3]))
    await store.put(sys.argv[2], b"alive", lease)
    print("beating", flush=True)
    while await store.keepalive(lease):
        await asyncio.sleep(0.1)

asyncio.run(beat())
"""


async def test_a_heartbeat_from_another_process_lives_while_it_beats_and_expires_when_it_dies(
    tmp_path: Path,
) -> None:
    path = tmp_path / "heartbeats.sqlite"
    ttl_s = 1.0
    store = EmbeddedHeartbeatStore(path, poll_interval_s=0.05)
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT,
        str(path),
        "/ffdl/jobs/j/learners/0",
        str(ttl_s),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None
        async with asyncio.timeout(30):
            assert await agent.stdout.readline() == b"beating\n"
        async with aclosing(store.watch("/ffdl/jobs/", 1)) as watch:
            async with asyncio.timeout(5):
                first = await anext(watch)
            assert (first.kind, first.key) == (WatchKind.PUT, "/ffdl/jobs/j/learners/0")

            # Well past the TTL, the other process's keepalives have kept its key.
            await asyncio.sleep(2.5 * ttl_s)
            assert (await store.snapshot("/ffdl/jobs/")).values == {"/ffdl/jobs/j/learners/0": b"alive"}

            agent.kill()
            await agent.wait()
            async with asyncio.timeout(ttl_s + 5):
                lost = await anext(watch)
            assert (lost.kind, lost.key) == (WatchKind.DELETE, "/ffdl/jobs/j/learners/0")
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        await store.close()
