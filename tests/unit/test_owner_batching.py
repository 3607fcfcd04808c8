"""The owner appends what a whole fetch decided, every partition's, in one publish, and the fetch's
offsets are committed only after it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ffdl.adapters.bus import open_bus
from ffdl.adapters.election import FileElection
from ffdl.core.authorization import Principal
from ffdl.core.kinds import JOBS
from ffdl.events import job_commands as cmd
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import Bus, OutgoingRecord
from ffdl.handlers.runtime import consume
from tests.services import wait_until_async

PARTITIONS = 4


class CountingBus:
    """The embedded log, noting each publish: its topic, how many records, and the group's commits then."""

    def __init__(self, bus: Bus, topics: Topics) -> None:
        self._bus = bus
        self._topics = topics
        self.appends: list[tuple[str, int, dict[int, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        committed = await self._bus.committed("owners", self._topics.commands)
        self.appends.append((topic, len(records), committed))
        return await self._bus.publish(topic, records)


async def test_one_publish_for_every_partition_of_a_fetch(tmp_path: Path) -> None:
    log = open_bus(f"embedded://{tmp_path}", PARTITIONS)
    await log.start()
    topics = Topics()
    sender = CommandSender(log, topics, "test", Principal.tenant("default"))
    job_ids = [f"job-{n}" for n in range(8)]  # written before the owner joins: its first fetch has them all
    submit = cmd.SubmitJob(spec=JobSpec(name="j", command="true"))
    await sender.send(*(sender.make(JOBS.address(job_id, "default"), submit) for job_id in job_ids))
    bus = CountingBus(log, topics)
    owner = JobOwner(bus, topics, FileElection(tmp_path / "election"))  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(consume(bus, "owners", [topics.commands], owner, stop))  # type: ignore[arg-type]

    async def decided_and_committed() -> bool:
        return len(owner.book.jobs) == len(job_ids) and bool(await log.committed("owners", topics.commands))

    try:
        await wait_until_async(decided_and_committed, 15, what="the submissions decided and committed")
    finally:
        stop.set()
        await running
        await log.close()

    assert len({log.partition_for(j) for j in job_ids}) >= 2
    assert bus.appends == [(topics.events, len(job_ids), {})], "one append, before any commit"
