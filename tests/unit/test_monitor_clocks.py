"""The monitor's shell reads time from its injected clocks only, the wall clock of launch timeouts too.

The monitor runs on the embedded heartbeat store and log; the job's events carry the real time,
and the injected clocks are an hour ahead: only a monitor that asks them decides the loss.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import EmbeddedHeartbeatStore
from ffdl.core.authorization import Principal
from ffdl.core.job import Job
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from tests.job_history import folded_job
from tests.services import wait_until_async

GRACE_S = 15.0
LAUNCH_TIMEOUT_S = 120.0


def launching_since(at: datetime) -> tuple[Job, Event]:
    """A job launching its first attempt since ``at``, and its last event."""
    spec = JobSpec(name="clocked", command="true", learners=1, gpus=1)
    placement = Placement(learners=(LearnerPlacement(rank=0, node="node-a", gpus=(0,)),))
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
    ]
    job, events = folded_job(datas, at)
    return job, events[-1]


async def test_a_launch_timeout_is_measured_on_the_injected_clocks(tmp_path: Path) -> None:
    store = EmbeddedHeartbeatStore(tmp_path / "heartbeats.sqlite", poll_interval_s=0.02)
    bus = open_bus(f"embedded://{tmp_path / 'log'}", 1)
    await bus.start()
    real_now = datetime.now(UTC)
    monotonic = 0.0
    monitor = Monitor(
        store,
        CommandSender(bus, Topics(), "monitor@test", Principal.platform("monitor")),
        grace_s=GRACE_S,
        launch_timeout_s=LAUNCH_TIMEOUT_S,
        check_interval_s=0.02,
        clock=lambda: monotonic,
        wall_clock=lambda: real_now + timedelta(hours=1),
    )
    stop = asyncio.Event()
    running = asyncio.create_task(monitor.run(stop))
    try:
        await wait_until_async(lambda: monitor.healthy, 5, what="the monitor following the store")
        job, last = launching_since(real_now)
        monitor.observe(last, job)
        monotonic += GRACE_S  # the store's start grace is over

        async def losses() -> list[cmd.ReportLearnerLost]:
            sent = [command_from_json(record.value).data async for record in bus.read(Topics().commands, 0)]
            return [data for data in sent if isinstance(data, cmd.ReportLearnerLost)]

        await wait_until_async(losses, 5, what="the loss decided by the injected clocks")
        assert await losses() == [
            cmd.ReportLearnerLost(
                rank=0,
                attempt=1,
                reason=LossReason.EXPIRED,
                detail=f"no heartbeat within {LAUNCH_TIMEOUT_S:.0f}s",
            )
        ]
    finally:
        stop.set()
        await running
        await store.close()
        await bus.close()
