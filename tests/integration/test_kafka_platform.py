"""The whole platform on a real Kafka-protocol broker (tansu): the same handlers, the log on Kafka.

Each test runs the platform in this process on the module's broker, with topics and consumer groups
of its own (a unique topic prefix). Learners are instant (they start and exit 0 at once, through the
heartbeat store and the normal monitor path) except where a test runs real learner processes.

Pinned here: a real job completes on Kafka; bad commands are dead-lettered with their reason and
origin and counted by class while the partitions keep moving; a stale owner's conflicting events
are ignored by readers, counted and reported by ``verify``; a broker frozen for 10 s loses nothing;
a platform started before its broker waits for it with backoff.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI

from ffdl.cli.serve import api_server
from ffdl.events import job_commands as cmd
from ffdl.events.codec import any_event_from_json, command_to_json
from ffdl.events.envelope import Command, Event
from ffdl.events.model import JobSpec
from ffdl.events.position import Position
from ffdl.handlers.messaging import PRINCIPAL_HEADER
from ffdl.handlers.owner import JobOwner
from ffdl.handlers.ports import OutgoingRecord, Record
from ffdl.tools.sre import rebuild_projections, verify_log
from ffdl.wiring.config import KafkaConfig, Settings
from ffdl.wiring.platform import Platform
from tests.harness import Api, fast_settings, manifest
from tests.services import TansuBroker, free_port, wait_until_async

pytestmark = pytest.mark.integration

#: Short sessions: tansu holds a group join for about half the session timeout, and a member lost
#: with a frozen broker comes back quicker.
FAST = KafkaConfig(session_timeout_s=2.0, heartbeat_interval_s=0.2, request_timeout_s=30.0)
INSTANT_JOB = "name: instant\ncommand: 'true'\nlearners: 2\ngpus: 1\n"
#: The headers of a command the API sends for the open platform's tenant.
AS_TENANT = ((PRINCIPAL_HEADER, b"tenant:default"),)


@pytest.fixture
def launcher() -> str:
    return "instant"


@pytest.fixture
async def settings(tmp_path: Path, broker: TansuBroker, launcher: str) -> Settings:
    return kafka_settings(tmp_path, broker.url, launcher)


def kafka_settings(tmp_path: Path, bus_url: str, launcher: str = "instant") -> Settings:
    return fast_settings(
        tmp_path / "ffdl",
        bus=bus_url,
        kafka=FAST,
        launcher=launcher,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}",
        nodes=[{"name": "node-a", "gpus": 8}],
    )


async def wait_all(api: Api, job_ids: list[str], state: str, timeout_s: float = 60.0) -> None:
    async def all_there() -> bool:
        jobs = [await api.job(job_id) for job_id in job_ids]
        return all(job["state"] == state for job in jobs)

    await wait_until_async(all_there, timeout_s, interval_s=0.2, what=f"{len(job_ids)} jobs {state}")


async def assert_log_clean(settings: Settings) -> None:
    report = await verify_log(settings)
    assert report["violations"] == []
    rebuilt = await rebuild_projections(settings)
    assert rebuilt["identical"] is True


def command(job_id: str, data: cmd.CommandData) -> Command:
    return Command(
        command_id=uuid.uuid4(),
        job_id=job_id,
        tenant="default",
        issued_at="2026-01-01T00:00:00Z",
        producer="test",
        data=data,
    )


def rewritten(value: bytes, **changes: Any) -> bytes:
    """A command's JSON with top-level fields changed."""
    return json.dumps({**json.loads(value), **changes}).encode()


@pytest.mark.parametrize("launcher", ["local"])
async def test_a_job_with_real_learner_processes_runs_to_completed_on_kafka(
    api: Api, settings: Settings
) -> None:
    job_id = await api.submit(manifest("real", args=["--steps", "20", "--delay", "0.02"]))
    job = await api.wait(job_id, "COMPLETED", released=True)
    assert [learner["exit_code"] for learner in job["learners"]] == [0, 0]
    assert all(learner["step"] == 20 for learner in job["learners"])
    await assert_log_clean(settings)


async def test_bad_commands_are_dead_lettered_with_their_reason_and_origin_and_counted(
    api: Api, platform: Platform, broker: TansuBroker
) -> None:
    topics = platform.topics
    submit = command_to_json(command("job-ok", cmd.SubmitJob(spec=JobSpec(name="ok", command="true"))))
    bad = {
        "undecodable": OutgoingRecord("job-a", b"\xff\x00 this is not JSON"),
        "unknown_type": OutgoingRecord("job-b", rewritten(submit, type="LaunchRockets", job_id="job-b")),
        "schema_version": OutgoingRecord("job-c", rewritten(submit, schema_version=7, job_id="job-c")),
        "unknown_job": OutgoingRecord("job-d", command_to_json(command("job-d", cmd.ResumeJob())), AS_TENANT),
        "bad_principal": OutgoingRecord(
            "job-g", rewritten(submit, job_id="job-g"), ((PRINCIPAL_HEADER, b"root"),)
        ),
        "refused": OutgoingRecord("job-h", rewritten(submit, job_id="job-h", tenant="other"), AS_TENANT),
        "wrong_key": OutgoingRecord("job-e", rewritten(submit, job_id="job-not-e")),
        "wrong_partition": OutgoingRecord("job-f", rewritten(submit, job_id="job-f")),
    }
    positions = dict(
        zip(bad, await platform.bus.publish(topics.commands, list(bad.values())[:-1]), strict=False)
    )
    # A producer that picks partitions its own way: the owner of that partition does not serve the job.
    home = platform.bus.partition_for("job-f")
    elsewhere = (home + 1) % platform.bus.partitions
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            topics.commands, bad["wrong_partition"].value, key=b"job-f", partition=elsewhere
        )
    finally:
        await producer.stop()
    positions["wrong_partition"] = Position(topics.commands, sent.partition, sent.offset)

    # The partitions keep moving: a good job submitted after the bad input runs.
    job_id = await api.submit(INSTANT_JOB)
    await api.wait(job_id, "COMPLETED")
    # An illegal command for a known job is no dead letter: its refusal is an event of the job.
    refused = await api.http.post(f"/v1/jobs/{job_id}:resume")
    assert refused.status_code == 409
    assert "only a HALTED job can be resumed" in refused.text

    parked: list[Record] = []

    async def all_parked() -> bool:
        parked[:] = [
            record
            for partition in range(platform.bus.partitions)
            async for record in platform.bus.read(topics.deadletter, partition)
        ]
        return len(parked) >= len(bad)

    await wait_until_async(all_parked, 30, interval_s=0.2, what="every bad command dead-lettered")
    assert len(parked) == len(bad)
    by_origin = {}
    for record in parked:
        headers = dict(record.headers)
        origin = (
            headers["ffdl_dlq_topic"].decode(),
            int(headers["ffdl_dlq_partition"]),
            int(headers["ffdl_dlq_offset"]),
        )
        by_origin[origin] = (headers["ffdl_dlq_reason"].decode(), record)
    reasons = {}
    for kind, position in positions.items():
        reason, record = by_origin[(position.topic, position.partition, position.offset)]
        assert (record.key, record.value) == (bad[kind].key, bad[kind].value), (
            f"{kind} was not parked as sent"
        )
        reasons[kind] = reason
    assert reasons["undecodable"].startswith("not JSON")
    assert reasons["unknown_type"] == "unknown type 'LaunchRockets'"
    assert reasons["schema_version"] == (
        f"SubmitJob schema_version 7 is newer than this platform's {cmd.SubmitJob.VERSION}"
    )
    assert reasons["unknown_job"] == "no job job-d for ResumeJob"
    assert reasons["bad_principal"].startswith("bad ffdl_principal header: 'root' names no kind of principal")
    assert reasons["refused"] == (
        "SubmitJob from tenant:default refused: job belongs to another tenant than 'default'"
    )
    assert reasons["wrong_key"] == "record key 'job-e' is not the command's key 'job-not-e'"
    assert (
        reasons["wrong_partition"]
        == f"wrong partition: key 'job-f' belongs on partition {home}, not {elsewhere}"
    )

    async def counted() -> bool:
        text = (await api.http.get("/metrics")).text
        return all(f'ffdl_dead_letters_total{{reason="{kind}"}} 1.0' in text for kind in positions)

    await wait_until_async(counted, 10, interval_s=0.2, what="the dead letters counted by reason")


async def test_a_stale_owner_cannot_corrupt_a_job_its_conflicting_events_are_ignored_and_reported(
    api: Api, platform: Platform, settings: Settings
) -> None:
    job_id = await api.submit(INSTANT_JOB)
    done = await api.wait(job_id, "COMPLETED", released=True)
    before = (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"]
    # An owner that folded the job while it was queued, then stalled (a long pause) while a rebalance
    # gave its partition to another member, which ran the job to the end. Now it wakes up and decides.
    stale = JobOwner(platform.bus, platform.topics, platform.election, producer="owner@stale")
    partition = platform.bus.partition_for(job_id)
    async for record in platform.bus.read(platform.topics.events, partition):
        event = any_event_from_json(record.value)
        if isinstance(event, Event) and event.job_id == job_id and event.seq <= 3:
            stale.book.apply(event, partition)
    assert stale.book.jobs[job_id].state.name == "QUEUED"
    cancel = command(job_id, cmd.CancelJob(reason="from a stale view"))
    cancel = cancel.model_copy(update={"tenant": done["tenant"]})
    record = Record(platform.topics.commands, partition, 0, job_id, command_to_json(cancel), AS_TENANT)
    await stale.process([record])
    await stale.flush()

    async def counted() -> bool:
        text = (await api.http.get("/metrics")).text
        return "ffdl_ignored_events_total 2.0" in text

    await wait_until_async(counted, 10, interval_s=0.2, what="the two conflicting events counted")
    after = await api.job(job_id)
    assert (after["state"], after["restarts"]) == ("COMPLETED", done["restarts"])
    assert (await api.http.get(f"/v1/jobs/{job_id}/events")).json()["events"] == before
    # verify reports the conflicts: the log holds them, whatever readers made of them.
    report = await verify_log(settings)
    assert [(v["job_id"], v["kind"]) for v in report["violations"]] == [(job_id, "seq-conflict")] * 2


async def test_a_broker_frozen_for_10_s_mid_run_loses_nothing_and_processing_resumes_by_itself(
    api: Api, settings: Settings, broker: TansuBroker
) -> None:
    before = [await api.submit(INSTANT_JOB) for _ in range(5)]
    await wait_all(api, before, "COMPLETED")
    submitted: list[str] = []

    async def keep_submitting() -> None:
        for _ in range(10):
            submitted.append(await api.submit(INSTANT_JOB))

    with structlog.testing.capture_logs() as logs:
        submitting = asyncio.create_task(keep_submitting())
        await wait_until_async(lambda: len(submitted) >= 3, 30, what="submissions under way")
        broker.pause()
        try:
            await asyncio.sleep(10.0)  # the outage the test is about
        finally:
            broker.resume()
        await asyncio.wait_for(submitting, 60)
        await wait_all(api, before + submitted, "COMPLETED", timeout_s=90)
    assert not [entry for entry in logs if entry["event"] == "role crashed; restarting"]
    for job_id in before + submitted:
        job = await api.job(job_id)
        assert job["restarts"] == 0
        assert [entry["state"] for entry in job["history"]][-1] == "COMPLETED"
    await assert_log_clean(settings)


async def test_the_platform_waits_for_an_unreachable_broker_and_starts_when_it_comes(tmp_path: Path) -> None:
    late = TansuBroker(port=free_port())
    settings = kafka_settings(tmp_path, late.url)
    platform = Platform(settings)
    with structlog.testing.capture_logs() as logs:
        starting = asyncio.create_task(platform.start())
        try:

            def retries() -> list[MutableMapping[str, Any]]:
                return [entry for entry in logs if entry["event"] == "event log unreachable; retrying"]

            await wait_until_async(lambda: len(retries()) >= 3, 30, what="three retries")
            assert not starting.done()
            for entry, step_s in zip(retries()[:3], [0.5, 1.0, 2.0], strict=True):
                assert step_s / 2 <= entry["retry_in_s"] <= step_s, "doubling delays, jittered"
            assert f"cannot reach the Kafka brokers at {late.bootstrap}" in retries()[0]["error"]
            late.start()
            await asyncio.wait_for(starting, 30)
            server = api_server(platform, settings.api, open_api=True)
            serving = asyncio.create_task(server.serve())
            try:
                async with httpx.AsyncClient(base_url=settings.api, timeout=30) as client:
                    await wait_until_async(lambda: api_up(client), 30, what="the API")
                    job_id = (await client.post("/v1/jobs", content=INSTANT_JOB)).json()["job_id"]
                    app = server.config.app
                    assert isinstance(app, FastAPI)
                    api = Api(client, app)
                    await api.wait(job_id, "COMPLETED")
            finally:
                server.should_exit = True
                await serving
        finally:
            if not starting.done():
                starting.cancel()
            await platform.stop()
            late.stop()


async def api_up(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False
