"""A spent exit record is deleted only once the reports queued before it was spent are on the log.

A relaunch reads the exit records of the ranks it stopped and reports their checkpoints itself; a
record it finds gone must mean the monitor's report of that checkpoint is on the log already. Here
the log refuses the monitor's first appends, and the record of a rank stopped for a restart, which
names a checkpoint, must outlive the refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore
from ffdl.core.authorization import Principal
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import EventData
from ffdl.events.model import Checkpoint, JobSpec, LearnerPlacement, Placement
from ffdl.events.position import Position
from ffdl.handlers.heartbeat_keys import encode_exit, exit_key
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from ffdl.handlers.ports import Bus, BusUnavailable, OutgoingRecord
from tests.job_history import folded_job
from tests.services import wait_until_async

REFUSALS = 3


class Journal:
    """What the log and the store were asked to do, in order."""

    def __init__(self) -> None:
        self.entries: list[str] = []


class RefusingBus:
    """A log that refuses its first ``REFUSALS`` appends, as a broker that is down for a while."""

    def __init__(self, bus: Bus, journal: Journal) -> None:
        self._bus = bus
        self._journal = journal
        self.refused = 0

    async def publish(self, topic: str, records: Sequence[OutgoingRecord]) -> list[Position]:
        if self.refused < REFUSALS:
            self.refused += 1
            raise BusUnavailable("the broker is down")
        positions = await self._bus.publish(topic, records)
        for record in records:
            self._journal.entries.append(f"sent {command_from_json(record.value).type}")
        return positions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)


class JournaledStore(EmbeddedHeartbeatStore):
    journal = Journal()

    async def delete(self, key: str) -> None:
        await super().delete(key)
        self.journal.entries.append(f"deleted {key}")


async def test_the_record_of_a_rank_stopped_for_a_restart_outlives_the_unsent_report_of_its_checkpoint(
    tmp_path: Path,
) -> None:
    journal = JournaledStore.journal = Journal()
    store = JournaledStore(tmp_path / "heartbeats.sqlite", poll_interval_s=0.02)
    bus = open_bus(f"embedded://{tmp_path / 'log'}", 1)
    await bus.start()
    refusing = RefusingBus(bus, journal)
    monitor = Monitor(
        store,
        CommandSender(refusing, Topics(), "monitor@test", Principal.platform("monitor")),
        grace_s=0.0,
        check_interval_s=0.02,
    )
    spec = JobSpec(name="gang", command="train", learners=2, gpus=1)
    placement = Placement(
        learners=tuple(LearnerPlacement(rank=rank, node="node-a", gpus=(rank,)) for rank in range(2))
    )
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
        ev.LearnerStarted(rank=0, attempt=1),
        ev.LearnerStarted(rank=1, attempt=1),
        ev.JobRunning(attempt=1),
        ev.LearnerExited(rank=1, attempt=1, exit_code=1),
        ev.JobRestarting(attempt=2, reason="learner 1 exited with code 1", backoff_s=5.0),
    ]
    job, events = folded_job(datas, datetime.now(UTC))
    stop = asyncio.Event()
    running = asyncio.create_task(monitor.run(stop))
    key = exit_key(job.job_id, 1, 0)
    try:
        await wait_until_async(lambda: monitor.healthy, 5, what="the monitor following the store")
        monitor.observe(events[-1], job)
        await store.put(key, encode_exit(-15, {"uri": "file:///c/40.pt", "step": 40}))

        await wait_until_async(
            lambda: f"deleted {key}" in journal.entries, 10, what="the spent record deleted"
        )

        assert refusing.refused == REFUSALS
        assert journal.entries.index("sent ReportCheckpoint") < journal.entries.index(f"deleted {key}")
        sent = [command_from_json(record.value).data async for record in bus.read(Topics().commands, 0)]
        assert sent == [
            cmd.ReportCheckpoint(checkpoint=Checkpoint(uri="file:///c/40.pt", step=40, rank=0, attempt=1))
        ]
    finally:
        stop.set()
        await running
        await store.close()
        await bus.close()
