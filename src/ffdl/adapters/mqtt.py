"""MQTT: a retained status message per job out, learner telemetry in (aiomqtt, e.g. Mosquitto).

Out: the notifier role folds the events topic and, on every state transition, publishes the
job's status, retained, QoS 1, on ``ffdl/<tenant>/jobs/<job>/status``; deleting an ended job
clears it (an empty retained message). It commits a batch only after the broker acknowledged
every publish, so a subscriber may see a status twice, never miss the last one.

In: learners (or anything speaking for them) may publish progress on
``ffdl/<tenant>/jobs/<job>/learners/<rank>/progress`` as ``{"attempt", "step", "metrics"}``, an
alternative to progress in the heartbeat store. Each message becomes a ``ReportProgress`` command
sent for the tenant the topic names (the broker's ACLs let a tenant write only under its own
``ffdl/<tenant>/``); the job's owner refuses one for another tenant's job, like any other command.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlparse

import aiomqtt
import structlog
from pydantic import BaseModel, Field, ValidationError

from ffdl.core.aggregate import Applied, Kinds
from ffdl.core.authorization import Principal
from ffdl.core.job import Job
from ffdl.core.kinds import JOBS
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.envelope import Event
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.ports import Bus
from ffdl.handlers.runtime import EventFollower, consume

log = structlog.get_logger(__name__)

TELEMETRY_TOPIC = "ffdl/+/jobs/+/learners/+/progress"


def status_topic(tenant: str, job_id: str) -> str:
    return f"ffdl/{tenant}/jobs/{job_id}/status"


def status_payload(job: Job) -> bytes:
    entered = job.history[-1]
    return json.dumps(
        {
            "job_id": job.job_id,
            "tenant": job.tenant,
            "state": str(job.state),
            "since": entered.at.isoformat(),
            "reason": entered.reason,
            "attempt": job.attempt,
            "seq": job.seq,
        },
        sort_keys=True,
    ).encode()


class Telemetry(BaseModel):
    attempt: int = Field(ge=1)
    step: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)


def parse_url(url: str) -> tuple[str, int]:
    address = urlparse(url)
    if address.scheme != "mqtt" or not address.hostname:
        raise ValueError(f"unsupported MQTT URL {url!r}: use mqtt://HOST:PORT")
    return address.hostname, address.port or 1883


class StatusPublisher(EventFollower):
    """The consumer-group processor that turns transitions into retained status messages."""

    def __init__(self, bus: Bus, topics: Topics, client: aiomqtt.Client) -> None:
        super().__init__(bus, topics.events, Kinds(JOBS))  # a node's event changes no job's status
        self._client = client

    async def policy(self, applied: Applied[Any, Any]) -> None:
        folded = applied.of(JOBS)
        if folded is not None:
            await self._publish(folded.event, folded.before, folded.after)

    async def _publish(self, event: Event, before: Job | None, job: Job) -> None:
        topic = status_topic(job.tenant, job.job_id)
        if isinstance(event.data, ev.JobDeleted):
            await self._client.publish(topic, b"", qos=1, retain=True)
        elif before is None or before.state is not job.state:
            await self._client.publish(topic, status_payload(job), qos=1, retain=True)


class MqttBridge:
    def __init__(self, url: str, bus: Bus, topics: Topics, sender: CommandSender, group: str) -> None:
        self._host, self._port = parse_url(url)
        self._group = group
        self._bus = bus
        self._topics = topics
        self._sender = sender

    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected until ``stop``: reconnect with backoff after the broker goes away."""
        backoff = 0.5
        while not stop.is_set():
            try:
                async with aiomqtt.Client(self._host, self._port, identifier=None, timeout=10) as client:
                    log.info("connected to MQTT", host=self._host, port=self._port)
                    backoff = 0.5
                    await client.subscribe(TELEMETRY_TOPIC, qos=1)
                    publisher = StatusPublisher(self._bus, self._topics, client)
                    tasks = [
                        asyncio.create_task(
                            consume(self._bus, self._group, [self._topics.events], publisher, stop)
                        ),
                        asyncio.create_task(self._telemetry(client)),
                    ]
                    try:
                        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                        for task in done:
                            task.result()
                    finally:
                        for task in tasks:
                            task.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)
            except aiomqtt.MqttError as exc:
                log.warning("MQTT broker unreachable; retrying", error=str(exc), retry_in_s=backoff)
                try:
                    await asyncio.wait_for(stop.wait(), backoff)
                except TimeoutError:
                    backoff = min(10.0, backoff * 2)

    async def _telemetry(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            await self.accept(str(message.topic), message.payload)

    async def accept(self, topic: str, payload: Any) -> None:
        """Turn one telemetry message into a ``ReportProgress`` command (or log why not)."""
        parts = topic.split("/")
        if len(parts) != 7 or parts[0] != "ffdl" or parts[2] != "jobs" or not parts[5].isdigit():
            log.warning("telemetry on an unexpected topic ignored", topic=topic)
            return
        tenant, job_id, rank = parts[1], parts[3], int(parts[5])
        try:
            raw = payload if isinstance(payload, bytes | bytearray | str) else b""
            telemetry = Telemetry.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("malformed telemetry ignored", topic=topic, error=str(exc.errors()[0]["msg"]))
            return
        progress = cmd.ReportProgress(
            rank=rank, attempt=telemetry.attempt, step=telemetry.step, metrics=telemetry.metrics
        )
        command = self._sender.make(JOBS.address(job_id, tenant), progress)
        await self._sender.send(command, principal=Principal.tenant(tenant))
