"""Export, import, verify and rebuild on real buses: the embedded log and Kafka (a tansu broker).

A generated log (many jobs through realistic lives, decided by the real decider) is imported into an
empty bus and exported again: the export must be the very file imported, on either bus, and every
tool must read the bus as it reads the file. Rebuilding the projections from the bus twice, or from
the file, must give byte-identical projections. A log with a node's events round-trips the same
way, and a record of the bus that decodes to no event is reported at its position by every tool.
"""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ffdl.adapters.bus import open_bus
from ffdl.core.restart import RestartPolicy
from ffdl.events.codec import command_to_json
from ffdl.events.envelope import Event
from ffdl.handlers.ports import OutgoingRecord
from ffdl.projections.store import LoggedEvent, Projection
from ffdl.tools.log_files import EventFilter, decode_line, read_log
from ffdl.tools.redecide import (
    commands_beside,
    commands_topic,
    export_commands_beside,
    read_commands,
    redecide,
)
from ffdl.tools.sre import (
    TargetNotEmptyError,
    events_topic,
    export_log,
    import_log,
    rebuild_file,
    rebuild_projections,
    verify_events,
    verify_log,
)
from ffdl.wiring.config import Settings
from tests.golden.record import GOLDEN_DIR, write_generated_log
from tests.node_history import NODE, write_node_history
from tests.services import TansuBroker

pytestmark = pytest.mark.integration

PARTITIONS = 8


@dataclass(frozen=True)
class GeneratedLog:
    path: Path
    text: str

    @property
    def events(self) -> int:
        return self.text.count("\n")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> GeneratedLog:
    path = tmp_path_factory.mktemp("logs") / "generated.jsonl"
    write_generated_log(path, 800, lanes=4)
    return GeneratedLog(path, path.read_text())


@pytest.fixture(params=["embedded", "kafka"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """A fresh, empty log on the bus under test (a new topic prefix on the shared broker)."""
    prefix = f"sre-{uuid.uuid4().hex[:8]}"
    if request.param == "kafka":
        broker: TansuBroker = request.getfixturevalue("broker")
        return Settings(
            data_dir=tmp_path / "ffdl", bus=broker.url, partitions=PARTITIONS, topic_prefix=prefix
        )
    return Settings(data_dir=tmp_path / "ffdl", partitions=PARTITIONS, topic_prefix=prefix)


def dump(path: Path) -> str:
    projection = Projection(path)
    try:
        return projection.dump()
    finally:
        projection.close()


def decoded(text: str) -> list[LoggedEvent]:
    return [decode_line(line, number) for number, line in enumerate(text.splitlines(), start=1)]


async def imported(settings: Settings, log: Path) -> dict[str, Any]:
    return await import_log(log, settings.bus_url, settings.partitions, events_topic(settings))


async def exported(settings: Settings, keep: EventFilter | None = None) -> str:
    out = io.StringIO()
    await export_log(
        settings.bus_url, settings.partitions, events_topic(settings), keep or EventFilter(), out
    )
    return out.getvalue()


async def test_an_imported_log_exports_again_as_the_very_same_file(
    settings: Settings, generated: GeneratedLog
) -> None:
    report = await imported(settings, generated.path)
    text = await exported(settings)

    assert report["events"] == generated.events and report["moved"] == 0
    assert text.replace(f'"topic":"{events_topic(settings)}"', '"topic":"ffdl.events"') == generated.text


async def test_export_filters_by_job_and_type(settings: Settings, generated: GeneratedLog) -> None:
    await imported(settings, generated.path)
    job_id = next(logged.event.key for logged in read_log(generated.path) if isinstance(logged.event, Event))

    text = await exported(
        settings, EventFilter(job_id=job_id, types=frozenset({"JobSubmitted", "GpusReleased"}))
    )

    kept = [(logged.event.key, logged.event.type) for logged in decoded(text)]
    assert kept == [(job_id, "JobSubmitted"), (job_id, "GpusReleased")]


async def test_import_refuses_a_log_that_is_not_empty(settings: Settings, generated: GeneratedLog) -> None:
    await imported(settings, generated.path)

    with pytest.raises(
        TargetNotEmptyError, match=r"already holds \d+ record\(s\); import only into an empty log"
    ):
        await imported(settings, generated.path)


async def test_verify_reads_the_bus_as_it_reads_the_file(settings: Settings, generated: GeneratedLog) -> None:
    await imported(settings, generated.path)

    from_bus = await verify_log(settings)
    from_file = verify_events(read_log(generated.path), "file")

    assert from_bus["violations"] == from_file["violations"] == []
    assert (from_bus["events"], from_bus["jobs"]) == (from_file["events"], from_file["jobs"]) > (0, 0)


async def test_rebuilds_from_the_bus_and_from_the_file_are_byte_identical(
    settings: Settings, generated: GeneratedLog, tmp_path: Path
) -> None:
    await imported(settings, generated.path)

    first = await rebuild_projections(settings, out=tmp_path / "first.sqlite")
    await rebuild_projections(settings, out=tmp_path / "second.sqlite")
    rebuild_file(generated.path, tmp_path / "file.sqlite")

    assert first["applied"] == first["events"] == generated.events
    assert (
        dump(tmp_path / "first.sqlite") == dump(tmp_path / "second.sqlite") == dump(tmp_path / "file.sqlite")
    )


async def test_importing_into_another_partition_count_keeps_every_jobs_order(
    generated: GeneratedLog, tmp_path: Path
) -> None:
    narrow = Settings(data_dir=tmp_path / "narrow", partitions=3)

    report = await imported(narrow, generated.path)
    again = tmp_path / "again.jsonl"
    again.write_text(await exported(narrow))

    assert report["moved"] > 0
    by_job: dict[str, list[int]] = {}
    for logged in read_log(again):
        by_job.setdefault(logged.event.key, []).append(logged.event.seq)
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in by_job.values())
    assert sorted(e.event.event_id.int for e in read_log(again)) == sorted(
        e.event.event_id.int for e in read_log(generated.path)
    )


# -- nodes' events, and records that are no event ----------------------------------------------------


@pytest.fixture(scope="module")
def node_log(tmp_path_factory: pytest.TempPathFactory) -> GeneratedLog:
    path = tmp_path_factory.mktemp("logs") / "node-history.jsonl"
    write_node_history(path)
    return GeneratedLog(path, path.read_text())


async def append_undecodable(settings: Settings, key: str) -> str:
    """Append a record no reader here can decode (a node event of a newer platform); returns its position."""
    topic = events_topic(settings)
    bus = open_bus(settings.bus_url, settings.partitions, topics=(topic,))
    await bus.start()
    try:
        value = b'{"type":"NodeMelted","schema_version":1,"node":"gpu-node-01","seq":10,"data":{}}'
        [position] = await bus.publish(topic, [OutgoingRecord(key, value)])
    finally:
        await bus.close()
    return f"{position.partition}:{position.offset}"


async def test_nodes_events_round_trip_through_import_and_export(
    settings: Settings, node_log: GeneratedLog
) -> None:
    report = await imported(settings, node_log.path)
    text = await exported(settings)
    only_node = await exported(settings, EventFilter(node=NODE))

    assert report["moved"] == 0  # each node event on its key's partition, at its exported offset
    assert text.replace(f'"topic":"{events_topic(settings)}"', '"topic":"ffdl.events"') == node_log.text
    assert {logged.event.key for logged in decoded(only_node)} == {f"node:{NODE}"}
    assert len(decoded(only_node)) == 9


async def test_a_record_that_is_no_event_is_reported_where_it_sits_never_dropped_unseen(
    settings: Settings, node_log: GeneratedLog, tmp_path: Path
) -> None:
    await imported(settings, node_log.path)
    position = await append_undecodable(settings, f"node:{NODE}")

    verified = await verify_log(settings)
    out = io.StringIO()
    export = await export_log(
        settings.bus_url, settings.partitions, events_topic(settings), EventFilter(), out
    )
    rebuilt = await rebuild_projections(settings, out=tmp_path / "rebuilt.sqlite")

    [finding] = verified["violations"]
    assert (finding["kind"], finding["node"], finding["job_id"], finding["position"]) == (
        "undecodable",
        NODE,
        None,
        position,
    )
    assert "NodeMelted" in finding["detail"]
    assert (verified["undecodable"], verified["events"], verified["nodes"]) == (1, export["written"], 1)
    assert [record["position"] for record in export["undecodable"]] == [position]
    assert out.getvalue().count("\n") == export["written"] == export["events"]
    assert (rebuilt["undecodable"], rebuilt["nodes"], rebuilt["ignored"]) == (1, 1, 0)


async def test_a_log_with_its_commands_exported_from_the_bus_re_decides_as_recorded(
    settings: Settings, tmp_path: Path
) -> None:
    """``ffdl export --commands`` on either bus: the commands topic beside the events, each command
    with its position; ``verify --redecide`` reads how each was decided off the events it caused."""
    golden = GOLDEN_DIR / "node_drain_direct_launch"
    await imported(settings, Path(f"{golden}.events.jsonl"))
    bus = open_bus(settings.bus_url, settings.partitions, topics=(commands_topic(settings),))
    await bus.start()
    try:
        recorded = list(read_commands(Path(f"{golden}.commands.jsonl")))
        await bus.publish(
            commands_topic(settings),
            [OutgoingRecord(item.command.key, command_to_json(item.command)) for item in recorded],
        )
    finally:
        await bus.close()
    events = tmp_path / "prod.events.jsonl"

    commands = await export_commands_beside(str(events), settings.bus_url, settings, EventFilter())
    events.write_text(await exported(settings))
    found = redecide(read_commands(commands_beside(events)), read_log(events), RestartPolicy())

    assert (commands["written"], commands["dead_lettered"]) == (len(recorded), [])
    assert not found.diverged, [divergence.headline() for divergence in found.divergences]
    assert (found.matched, found.undecided, found.history) == (len(recorded), [], 0)
