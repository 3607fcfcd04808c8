"""The notifier role against an in-memory status sink: one retained status per transition, the
status cleared on deletion, nothing again for a redelivered record, and every status published
again by a member that takes partitions over. Telemetry in (MQTT -> ``ReportProgress``) drops
whatever stands for no valid command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ffdl.adapters.bus import open_bus
from ffdl.adapters.mqtt import TELEMETRY_PER_TENANT, MqttBridge, progress_command
from ffdl.core.authorization import ANONYMOUS
from ffdl.core.job import Job
from ffdl.events import job_commands as cmd
from ffdl.events import nodes as nd
from ffdl.events.codec import AnyCommand, AnyEvent, any_command_from_json, command_to_json, event_to_json
from ffdl.events.envelope import Command
from ffdl.handlers.messaging import CommandSender, Topics, event_records
from ffdl.handlers.notifier import Notifier, status_payload, status_topic
from ffdl.handlers.ports import Bus, Record, TopicPartition
from tests.golden.record import (
    API,
    EVENTS_TOPIC,
    PARTITIONS,
    START,
    JobScript,
    NodeScript,
    Owner,
    positioned,
    spec,
)

TOKEN = 1


@dataclass
class MemorySink:
    """A status sink that keeps what it was sent, and what a broker would retain."""

    published: list[tuple[str, bytes, bool]] = field(default_factory=list)
    retained: dict[str, bytes] = field(default_factory=dict)

    async def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        self.published.append((topic, payload, retain))
        if retain and payload:
            self.retained[topic] = payload
        elif retain:
            self.retained.pop(topic, None)


@dataclass(frozen=True)
class Story:
    events: list[AnyEvent]
    completed: Job  # the job as its last transition left it
    completed_after: int  # how many of the events it took to get there


def story() -> Story:
    """A node joins; a job runs, completes, releases its GPUs, and is deleted."""
    owner = Owner("notifier", START)
    owner.leader_token = TOKEN
    NodeScript(
        owner,
        "gpu-node-01",
        nd.NodeSpec(gpus=4, gpu_type="a100", cpus=64, memory_mb=262_144),
        "configuration",
    ).observe(token=TOKEN)
    job = JobScript(owner, "mnist", "acme", spec("mnist"))
    job.queue_and_run(token=TOKEN)
    job.train(20)
    job.exit_all(0)
    job.finish_storing()
    completed, completed_after = job.job, len(owner.events)
    job.release()
    assert job.send(cmd.DeleteJob(), API)
    return Story(list(owner.events), completed, completed_after)


STORY = story()
TOPIC = status_topic("acme", "mnist")


def records(events: list[AnyEvent]) -> list[Record]:
    return [
        Record(EVENTS_TOPIC, logged.partition, logged.offset, logged.event.key, event_to_json(logged.event))
        for logged in positioned(events, PARTITIONS)
    ]


def states(sink: MemorySink) -> list[str]:
    return [json.loads(payload)["state"] for _, payload, _ in sink.published if payload]


@pytest.fixture
def bus(tmp_path: Path) -> Bus:
    """A log the notifier's book is built on; only the takeover test starts it."""
    return open_bus(f"embedded://{tmp_path}", PARTITIONS)


def test_each_transition_is_published_once_however_the_log_is_batched_and_redelivered(bus: Bus) -> None:
    log = records(STORY.events)

    @settings(max_examples=40, deadline=None)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        sink = MemorySink()
        notifier = Notifier(bus, EVENTS_TOPIC, sink)
        cuts = sorted(data.draw(st.sets(st.integers(1, len(log) - 1), max_size=6)))
        for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
            asyncio.run(notifier.process(log[start:end]))
            again = data.draw(st.integers(0, end), label="records redelivered")
            asyncio.run(notifier.process(log[:again]))

        assert states(sink) == [str(entry.state) for entry in STORY.completed.history]
        assert {topic for topic, _, _ in sink.published} == {TOPIC}
        assert all(retain for _, _, retain in sink.published)
        assert sink.published[-2][1] == status_payload(STORY.completed), "the last status, in full"
        assert sink.published[-1][1] == b"" and TOPIC not in sink.retained, "deleting clears it"

    check()


async def test_a_member_taking_partitions_over_publishes_every_status_again(bus: Bus) -> None:
    """The transitions folded on assignment are never handed to the policy: a member that stopped
    after folding them but before publishing left them unpublished, so the next one publishes all."""
    completed = STORY.events[: STORY.completed_after]
    await bus.start()
    try:
        await bus.publish(EVENTS_TOPIC, event_records(completed, "test"))
        sink = MemorySink()
        notifier = Notifier(bus, EVENTS_TOPIC, sink)
        await notifier.on_assigned(frozenset(TopicPartition(EVENTS_TOPIC, p) for p in range(PARTITIONS)))
        assert sink.published == [(TOPIC, status_payload(STORY.completed), True)]
        await notifier.process(records(completed))  # redelivered: folded already
        assert len(sink.published) == 1
    finally:
        await bus.close()


def strict_json(text: bytes) -> object:
    """JSON as every other language reads it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


#: A topic level: a fair name, or one no command may carry (empty, over 63 characters, a node's key).
LEVEL = st.one_of(
    st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True),
    st.sampled_from(["", "node:gpu-1", "x" * 64, "x" * 129]),
    st.text(max_size=12),
)
RANK = st.one_of(
    st.integers(0, 10**6).map(str), st.sampled_from(["²", "٣", "-1", "1.0", ""]), st.text(max_size=6)
)


def telemetry(attempts: st.SearchStrategy[int], floats: st.SearchStrategy[float]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda attempt, step, metrics: json.dumps({"attempt": attempt, "step": step, "metrics": metrics}),
        attempts,
        st.integers(-1, 10**30),
        st.dictionaries(st.text(max_size=5), floats, max_size=3),
    )


#: Telemetry as a learner sends it, and as anything else might (attempt 0, NaN, Infinity).
FAIR_TELEMETRY = telemetry(st.integers(1, 3), st.floats(allow_nan=False, allow_infinity=False))
ANY_TELEMETRY = telemetry(st.integers(-1, 3), st.floats())


def test_telemetry_becomes_progress_of_the_learner_its_topic_names(bus: Bus) -> None:
    sender = CommandSender(bus, Topics(), "mqtt", ANONYMOUS)
    payload = json.dumps({"attempt": 2, "step": 70, "metrics": {"loss": 0.25}})

    command = progress_command(sender, "ffdl/acme/jobs/mnist/learners/1/progress", payload.encode())

    assert (command.tenant, command.job_id, command.producer) == ("acme", "mnist", "mqtt")
    assert command.data == cmd.ReportProgress(rank=1, attempt=2, step=70, metrics={"loss": 0.25})


TELEMETRY_TOPICS = st.one_of(
    st.text(max_size=80), st.builds("ffdl/{}/jobs/{}/learners/{}/progress".format, LEVEL, LEVEL, RANK)
)
PAYLOADS = st.one_of(
    FAIR_TELEMETRY,
    FAIR_TELEMETRY.map(str.encode),
    ANY_TELEMETRY,
    st.binary(max_size=64),
    st.none(),
    st.integers(),
)


def test_telemetry_that_stands_for_no_valid_command_is_refused_with_a_value_error(bus: Bus) -> None:
    sender = CommandSender(bus, Topics(), "mqtt", ANONYMOUS)

    @settings(max_examples=300, deadline=None)
    @given(topic=TELEMETRY_TOPICS, payload=PAYLOADS)
    def check(topic: str, payload: object) -> None:
        try:
            command = progress_command(sender, topic, payload)
        except ValueError:
            return
        parts = topic.split("/")
        assert isinstance(command.data, cmd.ReportProgress)
        assert (command.tenant, command.job_id, command.data.rank) == (parts[1], parts[3], int(parts[5]))
        strict_json(command_to_json(command))

    check()


def test_the_bridge_sends_what_telemetry_stands_for_and_drops_the_rest(tmp_path: Path) -> None:
    """Anyone may publish on the broker: a message that stands for no valid command is logged and
    dropped, never an exception that would take the statuses' connection down with it."""

    async def accept_all(directory: str, messages: list[tuple[str, object]]) -> None:
        bus, topics = open_bus(f"embedded://{directory}", 1), Topics()
        await bus.start()
        try:
            sender = CommandSender(bus, topics, "mqtt", ANONYMOUS)
            bridge = MqttBridge("mqtt://localhost", bus, topics, sender, "notifier")
            for topic, payload in messages:
                bridge.accept(topic, payload)
            await bridge.send_waiting()
            sent = [any_command_from_json(r.value) async for r in bus.read(topics.commands, 0)]
        finally:
            await bus.close()
        latest: dict[tuple[str, str, int], Command] = {}  # of each learner, where it first came
        for topic, payload in messages:
            with contextlib.suppress(ValueError):
                command = progress_command(sender, topic, payload)
                assert isinstance(command.data, cmd.ReportProgress)
                latest[(command.tenant, command.job_id, command.data.rank)] = command
        tenants = list(dict.fromkeys(tenant for tenant, _, _ in latest))  # sent a tenant at a time
        expected = sorted(latest.values(), key=lambda command: tenants.index(command.tenant))
        assert [(c.key, c.data) for c in sent] == [(c.key, c.data) for c in expected]

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.tuples(TELEMETRY_TOPICS, PAYLOADS), max_size=12))
    def check(messages: list[tuple[str, object]]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as directory:
            asyncio.run(accept_all(directory, messages))

    check()


def test_each_status_says_why_the_job_is_in_that_state_not_an_earlier_one(bus: Bus) -> None:
    sink = MemorySink()
    asyncio.run(Notifier(bus, EVENTS_TOPIC, sink).process(records(STORY.events)))
    published = [json.loads(payload) for _, payload, _ in sink.published if payload]
    reasons = {status["state"]: status["reason"] for status in published}
    assert [status["reason"] for status in published] == [entry.reason for entry in STORY.completed.history]
    assert reasons["RUNNING"] == "every learner of attempt 1 started", reasons
    assert reasons["COMPLETED"].startswith("results recorded"), reasons


def test_a_tenants_telemetry_flood_is_its_learners_latest_reports_a_few_at_a_time(tmp_path: Path) -> None:
    """One tenant publishing as fast as it can once became a command per message on the log, and
    the broker dropped other tenants' telemetry behind it."""

    async def flood() -> tuple[list[AnyCommand], list[AnyCommand]]:
        bus, topics = open_bus(f"embedded://{tmp_path}", 1), Topics()
        await bus.start()
        try:
            bridge = MqttBridge(
                "mqtt://localhost", bus, topics, CommandSender(bus, topics, "mqtt", ANONYMOUS), "n"
            )
            for step in range(3):
                for rank in range(TELEMETRY_PER_TENANT + 50):
                    topic = f"ffdl/acme/jobs/big/learners/{rank}/progress"
                    bridge.accept(topic, f'{{"attempt": 1, "step": {step}}}')
            bridge.accept("ffdl/globex/jobs/small/learners/0/progress", '{"attempt": 1, "step": 7}')
            await bridge.send_waiting()
            first = [any_command_from_json(r.value) async for r in bus.read(topics.commands, 0)]
            await bridge.send_waiting()
            every = [any_command_from_json(r.value) async for r in bus.read(topics.commands, 0)]
        finally:
            await bus.close()
        return first, every

    first, every = asyncio.run(flood())

    assert len(first) == TELEMETRY_PER_TENANT + 1  # acme's first learners, and globex's report
    progress = [c.data for c in every if isinstance(c.data, cmd.ReportProgress)]
    assert len(progress) == TELEMETRY_PER_TENANT + 50 + 1
    assert {p.step for c, p in zip(every, progress, strict=True) if getattr(c, "tenant", "") == "acme"} == {2}
    assert any(getattr(c, "tenant", "") == "globex" for c in first)
