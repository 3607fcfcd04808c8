"""MQTT (aiomqtt, e.g. Mosquitto): the notifier's status sink out, learner telemetry in.

Out: :class:`MqttStatusSink` is the notifier's port (``handlers/notifier.py``) on the broker:
QoS 1, so a publish returns once the broker has acknowledged it.

In: learners (or anything speaking for them) may publish progress on
``ffdl/<tenant>/jobs/<job>/learners/<rank>/progress`` as ``{"attempt", "step", "metrics"}``, an
alternative to progress in the heartbeat store. Each message becomes a ``ReportProgress`` command
sent for the tenant the topic names (the broker's ACLs let a tenant write only under its own
``ffdl/<tenant>/``); the job's owner refuses one for another tenant's job, like any other command. Anyone may
publish on the broker, so a message that stands for no valid command is logged and dropped.

Telemetry is progress: of each learner only the latest report matters. So the bridge keeps, per
tenant, the latest command of each learner not sent yet, and sends at most
:data:`TELEMETRY_PER_TENANT` of a tenant's every :data:`TELEMETRY_FLUSH_S`, the oldest waiting
first; a report that comes meanwhile replaces its learner's. Before, each message became a command
as it came: one tenant publishing 60,000 messages a minute put 2,400 commands a second on the log
for the owners to decide, and the broker dropped other tenants' telemetry behind it. A tenant may
have :data:`TELEMETRY_PENDING_MAX` learners waiting; a new one past that is dropped (logged).

:class:`MqttBridge` keeps one connection for both, and connects again with backoff after the
broker goes away.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from urllib.parse import urlparse

import aiomqtt
import structlog
from pydantic import BaseModel, Field, FiniteFloat, ValidationError

from ffdl.core.authorization import Principal
from ffdl.core.kinds import JOBS
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command
from ffdl.events.reports import bound_metrics
from ffdl.handlers.aio import Backoff, sleep_or_stop
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.notifier import Notifier
from ffdl.handlers.ports import Bus, BusUnavailable
from ffdl.handlers.runtime import consume

log = structlog.get_logger(__name__)

TELEMETRY_TOPIC = "ffdl/+/jobs/+/learners/+/progress"
#: How often waiting telemetry is sent, how many learners' reports of a tenant at a time, and how
#: many learners of a tenant may wait (see the module docstring).
TELEMETRY_FLUSH_S = 0.2
TELEMETRY_PER_TENANT = 200
TELEMETRY_PENDING_MAX = 10_000
#: Messages the MQTT client holds before the bridge takes them (past it, the client drops them).
QUEUED_MESSAGES_MAX = 10_000


class Telemetry(BaseModel):
    attempt: int = Field(ge=1)
    step: int = Field(ge=0)
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)


def parse_url(url: str) -> tuple[str, int]:
    address = urlparse(url)
    if address.scheme != "mqtt" or not address.hostname:
        raise ValueError(f"unsupported MQTT URL {url!r}: use mqtt://HOST:PORT")
    return address.hostname, address.port or 1883


def progress_command(sender: CommandSender, topic: str, payload: object) -> Command:
    """The ``ReportProgress`` command a telemetry message stands for; ValueError (a pydantic
    ValidationError among them) when it stands for none."""
    parts = topic.split("/")
    if (
        len(parts) != 7
        or (parts[0], parts[2], parts[4], parts[6]) != ("ffdl", "jobs", "learners", "progress")
        or not (parts[5].isascii() and parts[5].isdecimal())
    ):
        raise ValueError("not a telemetry topic")
    if not isinstance(payload, bytes | bytearray | str):
        raise ValueError("the payload is not JSON")
    telemetry = Telemetry.model_validate_json(payload)
    bounded = bound_metrics(telemetry.metrics)  # too many, or badly named: cut, with the reasons
    progress = cmd.ReportProgress(
        rank=int(parts[5]),
        attempt=telemetry.attempt,
        step=telemetry.step,
        metrics=bounded.metrics,
        dropped=bounded.dropped,
    )
    return sender.make(JOBS.address(parts[3], parts[1]), progress)


class MqttStatusSink:
    """The notifier's :class:`~ffdl.handlers.notifier.StatusSink` on an MQTT connection (QoS 1)."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self._client = client

    async def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        await self._client.publish(topic, payload, qos=1, retain=retain)


class MqttBridge:
    def __init__(self, url: str, bus: Bus, topics: Topics, sender: CommandSender, group: str) -> None:
        self._host, self._port = parse_url(url)
        self._group = group
        self._bus = bus
        self._topics = topics
        self._sender = sender
        # tenant -> (job, rank) -> the latest command of that learner not sent yet
        self._waiting: dict[str, OrderedDict[tuple[str, int], Command]] = {}
        self._full: set[str] = set()  # tenants told of, whose new learners are dropped until sent
        self._arrived = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected until ``stop``: reconnect with backoff after the broker goes away."""
        backoff = Backoff(0.5, 10.0)
        while not stop.is_set():
            try:
                async with aiomqtt.Client(
                    self._host,
                    self._port,
                    identifier=None,
                    timeout=10,
                    max_queued_incoming_messages=QUEUED_MESSAGES_MAX,
                ) as client:
                    log.info("connected to MQTT", host=self._host, port=self._port)
                    backoff.reset()
                    await self._serve(client, stop)
            except aiomqtt.MqttError as exc:
                delay = backoff.next_delay()
                log.warning("MQTT broker unreachable; retrying", error=str(exc), retry_in_s=delay)
                await sleep_or_stop(stop, delay)

    async def _serve(self, client: aiomqtt.Client, stop: asyncio.Event) -> None:
        """Publish statuses and take telemetry on ``client`` until ``stop`` or until either fails."""
        await client.subscribe(TELEMETRY_TOPIC, qos=1)
        notifier = Notifier(self._bus, self._topics.events, MqttStatusSink(client))
        tasks = [
            asyncio.create_task(consume(self._bus, self._group, [self._topics.events], notifier, stop)),
            asyncio.create_task(self._telemetry(client)),
            asyncio.create_task(self._send_waiting()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _telemetry(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            self.accept(str(message.topic), message.payload)

    async def _send_waiting(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            await self.send_waiting()
            await asyncio.sleep(TELEMETRY_FLUSH_S)

    def accept(self, topic: str, payload: object) -> None:
        """Keep the ``ReportProgress`` a telemetry message stands for as its learner's latest, to be
        sent (:meth:`send_waiting`); log and drop a message that stands for none."""
        try:
            command = progress_command(self._sender, topic, payload)
        except ValidationError as exc:
            log.warning("malformed telemetry ignored", topic=topic, error=str(exc.errors()[0]["msg"]))
            return
        except ValueError as exc:
            log.warning("malformed telemetry ignored", topic=topic, error=str(exc))
            return
        assert isinstance(command.data, cmd.ReportProgress)
        waiting = self._waiting.setdefault(command.tenant, OrderedDict())
        learner = (command.job_id, command.data.rank)
        if learner not in waiting and len(waiting) >= TELEMETRY_PENDING_MAX:
            if command.tenant not in self._full:  # once, not once a message of a flood
                self._full.add(command.tenant)
                log.warning(
                    "telemetry dropped: too many of the tenant's learners wait", tenant=command.tenant
                )
            return
        waiting[learner] = command
        self._arrived.set()

    async def send_waiting(self) -> None:
        """Send the oldest waiting telemetry of each tenant, at most :data:`TELEMETRY_PER_TENANT`.

        Progress is reported again with the next message, so what cannot be sent now (the log is
        unreachable) is dropped, rather than taking the statuses' connection down with it."""
        for tenant in list(self._waiting):
            waiting = self._waiting[tenant]
            commands = [
                waiting.popitem(last=False)[1] for _ in range(min(len(waiting), TELEMETRY_PER_TENANT))
            ]
            self._full.discard(tenant)
            if not waiting:
                del self._waiting[tenant]
            else:
                self._arrived.set()  # the rest goes next time
            try:
                await self._sender.send(*commands, principal=Principal.tenant(tenant))
            except BusUnavailable as exc:
                log.warning("telemetry dropped: the log is unreachable", tenant=tenant, error=str(exc))
