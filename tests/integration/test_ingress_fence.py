"""An ingress relay frozen for real (SIGSTOP) past its session, on the embedded log and on Kafka
(tansu): the group gives its partition to another relay, which copies the records; thawed, the
frozen relay is refused before it appends the copies it had worked out, so each record is copied
once (``docs/kafka.md``, the ingress relay).

The frozen relay runs in a child process, which stops itself right after it read back the commands
topic (its copies worked out, none appended) and is then frozen with SIGSTOP, its heartbeats with
it: the same point the embedded log's unit test (``tests/unit/test_ingress_redelivery.py``) freezes
a relay at, here with the broker's own group coordinator deciding who is expelled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.handlers.ingress import INGRESS_HEADER, IngressRelay
from ffdl.handlers.messaging import Topics
from ffdl.handlers.ports import Bus, OutgoingRecord
from ffdl.handlers.runtime import consume
from ffdl.wiring.config import KafkaConfig
from tests.services import TansuBroker, wait_until_async

pytestmark = pytest.mark.integration

TENANT = "acme"
WAIT_S = 30.0
#: Short sessions: tansu holds a group join for about half the session timeout.
FAST = KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2, request_timeout_s=20.0)

_CHILD_RELAY = """
import asyncio, sys
from pathlib import Path
from ffdl.adapters.bus.embedded import EmbeddedBus
from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.handlers.ingress import IngressRelay
from ffdl.handlers.messaging import Topics
from ffdl.handlers.runtime import StaleMember, consume
from ffdl.wiring.config import KafkaConfig

class StopsAfterReadingBack:
    def __init__(self, bus, commands):
        self._bus, self._commands, self.stopped = bus, commands, False

    def __getattr__(self, name):
        return getattr(self._bus, name)

    async def read(self, topic, partition, start=0, end=None):
        async for record in self._bus.read(topic, partition, start, end):
            yield record
        if topic == self._commands and not self.stopped:
            self.stopped = True
            print("read back", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

async def main():
    kind, where, prefix = sys.argv[1:4]
    if kind == "kafka":
        settings = KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2, request_timeout_s=20.0)
        bus = KafkaBus(where, 1, settings=settings)
    else:
        bus = EmbeddedBus(Path(where), 1, session_timeout_s=1.0)
    await bus.start()
    topics = Topics.with_prefix(prefix)
    stopping = StopsAfterReadingBack(bus, topics.commands)
    relay = IngressRelay(stopping, topics, ["acme"])
    try:
        await consume(stopping, prefix + ".ingress", relay.topics, relay, asyncio.Event(), fenced=True)
    except StaleMember:
        print("refused", flush=True)
    await bus.abandon()

asyncio.run(main())
"""


@pytest.fixture(params=["embedded", "kafka"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Bus, str, str]]:
    """A log of one partition per topic, and how the child process opens it: (bus, kind, where)."""
    if request.param == "kafka":
        broker: TansuBroker = request.getfixturevalue("broker")
        bus: Bus = KafkaBus(broker.bootstrap, 1, settings=FAST)
        where = broker.bootstrap
    else:
        path = tmp_path / "log.sqlite"
        bus = EmbeddedBus(path, 1)
        where = str(path)
    await bus.start()
    yield bus, request.param, where
    await bus.close()


async def _wait_for_line(child: asyncio.subprocess.Process, wanted: str, timeout_s: float = WAIT_S) -> bool:
    """Read the child's output (its log lines included) until ``wanted`` comes; False if it does not."""
    assert child.stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            while line := await child.stdout.readline():
                if line.decode().strip() == wanted:
                    return True
    except TimeoutError:
        pass
    return False


async def _copies(bus: Bus, topics: Topics) -> Counter[bytes]:
    """How often each record of the tenant's topic was copied to the commands topic."""
    records = [record async for record in bus.read(topics.commands, 0)]
    return Counter(value for record in records for name, value in record.headers if name == INGRESS_HEADER)


async def test_a_relay_frozen_past_its_session_appends_none_of_its_copies(
    log: tuple[Bus, str, str],
) -> None:
    bus, kind, where = log
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    topics = Topics.with_prefix(prefix)
    group = f"{prefix}.ingress"
    await bus.publish(topics.commands, [OutgoingRecord("job-0", b"a command the platform sent")])
    await bus.publish(topics.ingress(TENANT), [OutgoingRecord("job-1", b"command %d" % n) for n in range(3)])
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD_RELAY,
        kind,
        where,
        prefix,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert await _wait_for_line(child, "read back"), "the child relay never read back"
        os.kill(child.pid, signal.SIGSTOP)
        try:
            relay = IngressRelay(bus, topics, [TENANT])
            stop = asyncio.Event()
            running = asyncio.create_task(consume(bus, group, relay.topics, relay, stop, fenced=True))

            async def copied() -> bool:
                if running.done():
                    running.result()
                return (await bus.committed(group, topics.ingress(TENANT))).get(0) == 3

            try:
                await wait_until_async(copied, WAIT_S, what="the records copied by the relay that took over")
            finally:
                stop.set()
                await running
            assert len(await _copies(bus, topics)) == 3
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write(b"thaw\n")
        await child.stdin.drain()
        refused = await _wait_for_line(child, "refused", 15.0)
        copies = await _copies(bus, topics)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()

    assert set(copies.values()) == {1}, f"the frozen relay appended its copies after the other's: {copies}"
    assert refused, "the frozen relay was not refused"
