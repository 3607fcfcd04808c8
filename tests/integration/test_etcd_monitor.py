"""The monitor against a real etcd: adoption at start, grace for re-registration, loss at once otherwise.

The monitor runs in this process with a 1 s TTL and a short grace; heartbeats are written the way
learner agents write them; the commands it sends land on an embedded log and are read back.
These are the orderings the platform tests cannot force: a store read before the jobs are folded,
a key deleted inside a grace period.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import aetcd
import pytest

from ffdl.adapters.heartbeats import EtcdHeartbeatStore, exit_key, learner_key
from ffdl.core.authorization import Principal
from ffdl.core.job import Job, evolve
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import CommandData, Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.exit_records import saved_on_the_way_out
from ffdl.handlers.heartbeat_keys import JOBS_PREFIX, LearnerBeat, encode_exit
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from ffdl.handlers.ports import Bus
from tests.job_history import folded_job
from tests.services import EtcdServer, wait_until_async

pytestmark = pytest.mark.integration

TTL_S = 1.0
GRACE_S = 1.5
# Scheduling slack on a busy two-core machine.
SLACK_S = 1.5


@pytest.fixture
async def store(etcd_server: EtcdServer) -> AsyncIterator[EtcdHeartbeatStore]:
    store = EtcdHeartbeatStore(etcd_server.host, etcd_server.port, timeout_s=0.5)
    yield store
    await store.close()


@dataclass
class Running:
    monitor: Monitor
    bus: Bus
    started_at: float

    async def sent(self) -> list[CommandData]:
        return [command_from_json(r.value).data async for r in self.bus.read(Topics().commands, 0)]

    async def losses(self) -> list[cmd.ReportLearnerLost]:
        return [data for data in await self.sent() if isinstance(data, cmd.ReportLearnerLost)]


@pytest.fixture
async def running(store: EtcdHeartbeatStore, bus: Bus) -> AsyncIterator[Running]:
    monitor = Monitor(
        store,
        CommandSender(bus, Topics(), "monitor@test", Principal.platform("monitor")),
        heartbeat_ttl_s=TTL_S,
        grace_s=GRACE_S,
        check_interval_s=0.05,
        progress_interval_s=0.0,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    yield Running(monitor, bus, time.monotonic())
    stop.set()
    await task


def running_job(learners: int = 1) -> tuple[Job, Event]:
    """A job RUNNING its first attempt, every learner started, folded from its events; and its last event."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    spec = JobSpec(name="monitored", command="true", learners=learners, gpus=1)
    placement = Placement(
        learners=tuple(LearnerPlacement(rank=rank, node="node-a", gpus=(rank,)) for rank in range(learners))
    )
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
        *[ev.LearnerStarted(rank=rank, attempt=1) for rank in range(learners)],
        ev.JobRunning(attempt=1),
    ]
    job, events = folded_job(datas, datetime.now(UTC), job_id=job_id)
    return job, events[-1]


def beat(step: int) -> bytes:
    return LearnerBeat(attempt=1, pid=4242, host="test", step=step, last_progress=time.time()).to_json()


async def until_past_grace(running: Running) -> None:
    """Wait out the monitor's start grace (plus slack), to assert that something did not happen."""
    await asyncio.sleep(max(0.0, running.started_at + GRACE_S + SLACK_S - time.monotonic()))


async def test_an_exit_recorded_before_the_job_is_adopted_is_reported_as_an_exit(
    store: EtcdHeartbeatStore, running: Running
) -> None:
    job, _ = running_job()
    await store.put(exit_key(job.job_id, 1, 0), encode_exit(0))
    await wait_until_async(lambda: running.monitor.healthy, 5, what="the monitor following etcd")

    running.monitor.observe(None, job)

    async def exit_reported() -> bool:
        return cmd.ReportLearnerExited(rank=0, attempt=1, exit_code=0) in await running.sent()

    await wait_until_async(exit_reported, 2, what="the exit report")
    await until_past_grace(running)
    assert await running.losses() == []


async def test_exit_records_are_deleted_once_their_job_has_moved_past_them(
    store: EtcdHeartbeatStore, running: Running
) -> None:
    job, last = running_job(learners=2)
    await wait_until_async(lambda: running.monitor.healthy, 5, what="the monitor following etcd")
    running.monitor.observe(last, job)
    for rank in (0, 1):
        await store.put(exit_key(job.job_id, 1, rank), encode_exit(0))

    async def both_reported() -> bool:
        sent = await running.sent()
        return all(cmd.ReportLearnerExited(rank=r, attempt=1, exit_code=0) in sent for r in (0, 1))

    await wait_until_async(both_reported, 5, what="both exits reported")
    prefix = f"{JOBS_PREFIX}{job.job_id}/exits/"
    assert len((await store.snapshot(prefix)).values) == 2, "kept while the job is on that attempt"

    stored = Event(
        event_id=uuid.uuid4(),
        job_id=job.job_id,
        tenant=job.tenant,
        seq=job.seq + 1,
        occurred_at=datetime.now(UTC),
        producer="test",
        data=ev.JobStoring(attempt=1),
    )
    running.monitor.observe(stored, evolve(job, stored))

    async def collected() -> bool:
        return (await store.snapshot(prefix)).values == {}

    await wait_until_async(collected, 5, what="the spent exit records deleted")

    await store.put(exit_key(job.job_id, 1, 1), encode_exit(-15))  # a learner stopped late
    await wait_until_async(collected, 5, what="an exit record written after its attempt deleted")


@pytest.fixture
async def forged(
    etcd_server: EtcdServer, store: EtcdHeartbeatStore
) -> AsyncIterator[tuple[Job, Event, aetcd.Client]]:
    """A job of two learners, rank 0's exit record (naming its checkpoint) stored beside a key that
    is not UTF-8, before the monitor (requested after this fixture) first reads the store; and a raw
    client to forge more."""
    job, last = running_job(learners=2)
    async with aetcd.Client(etcd_server.host, etcd_server.port, timeout=5) as raw:
        await raw.put(f"{JOBS_PREFIX}{job.job_id}/exits/1/".encode() + b"\xff", b"forged")
        await store.put(exit_key(job.job_id, 1, 0), encode_exit(0, {"uri": "file:///c/40.pt", "step": 40}))
        yield job, last, raw


async def test_keys_that_are_not_utf_8_are_passed_over_and_the_records_beside_them_read(
    forged: tuple[Job, Event, aetcd.Client], store: EtcdHeartbeatStore, running: Running
) -> None:
    """On Kubernetes a job's login may write any key under its job's prefix: one that is not text
    must neither stop the monitor (every tenant's) nor the relaunch that reads the job's exits."""
    job, last, raw = forged
    await wait_until_async(lambda: running.monitor.healthy, 5, what="the monitor following etcd")
    running.monitor.observe(last, job)
    await raw.put(f"{JOBS_PREFIX}{job.job_id}/exits/1/1".encode() + b"\xc3", b"forged")  # on the watch
    await store.put(exit_key(job.job_id, 1, 1), encode_exit(0))

    async def both_reported() -> bool:
        sent = await running.sent()
        return all(cmd.ReportLearnerExited(rank=r, attempt=1, exit_code=0) in sent for r in (0, 1))

    await wait_until_async(both_reported, 5, what="both exits reported")
    assert running.monitor.healthy
    found = await saved_on_the_way_out(store, job.job_id, 1, range(2))
    assert [(checkpoint.rank, checkpoint.step) for checkpoint in found] == [(0, 40)]


async def test_a_quiet_learner_seen_before_its_job_is_adopted_is_not_reaped(
    store: EtcdHeartbeatStore, running: Running
) -> None:
    job, _ = running_job()
    lease = await store.grant(30)
    await store.put(learner_key(job.job_id, 0), beat(step=7), lease)
    await wait_until_async(lambda: running.monitor.healthy, 5, what="the monitor following etcd")

    running.monitor.observe(None, job)

    async def progress_reported() -> bool:
        return cmd.ReportProgress(rank=0, attempt=1, step=7) in await running.sent()

    await wait_until_async(progress_reported, 2, what="the adopted heartbeat's progress")
    await until_past_grace(running)
    assert await running.losses() == []
    await store.revoke(lease)


async def test_a_deletion_within_the_grace_waits_for_the_learner_to_re_register(
    store: EtcdHeartbeatStore, running: Running
) -> None:
    job, _ = running_job(learners=2)
    running.monitor.observe(None, job)
    leases = [await store.grant(30) for _ in range(2)]
    for rank, lease in enumerate(leases):
        await store.put(learner_key(job.job_id, rank), beat(step=1), lease)
    await wait_until_async(lambda: running.monitor.healthy, 5, what="the monitor following etcd")

    for lease in leases:  # both keys go, as when etcd expires leases after an outage
        await store.revoke(lease)
    back = await store.grant(30)
    await store.put(learner_key(job.job_id, 0), beat(step=2), back)  # only rank 0 comes back
    assert time.monotonic() < running.started_at + GRACE_S, "the test ran past the grace: too slow"

    async def rank_1_lost() -> bool:
        return bool(await running.losses())

    await wait_until_async(rank_1_lost, GRACE_S + SLACK_S, what="rank 1 reaped at the end of the grace")
    assert time.monotonic() >= running.started_at + GRACE_S
    [loss] = await running.losses()
    assert (loss.rank, loss.attempt, loss.reason) == (1, 1, LossReason.EXPIRED)
    assert "not re-registered" in loss.detail
    await store.revoke(back)


async def test_outside_a_grace_an_expired_lease_is_a_loss_at_once(
    store: EtcdHeartbeatStore, running: Running
) -> None:
    job, last_event = running_job()
    running.monitor.observe(last_event, job)  # followed live, not adopted: no grace of its own
    lease = await store.grant(TTL_S)
    await store.put(learner_key(job.job_id, 0), beat(step=1), lease)

    async def renew() -> None:
        while True:
            assert await store.keepalive(lease)
            await asyncio.sleep(TTL_S / 4)

    renewing = asyncio.create_task(renew())
    await until_past_grace(running)
    renewing.cancel()
    started = time.monotonic()  # the lease is not renewed any more: it expires within the TTL
    assert running.monitor.healthy and await running.losses() == []

    async def lost() -> bool:
        return bool(await running.losses())

    await wait_until_async(lost, TTL_S + SLACK_S, what="the loss")
    assert time.monotonic() - started <= TTL_S + SLACK_S
    [loss] = await running.losses()
    assert (loss.rank, loss.reason, loss.detail) == (0, LossReason.EXPIRED, "heartbeat lease expired")
