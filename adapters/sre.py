"""SRE commands over the configured log: verify the invariants, rebuild the projections.

A rebuild folds the whole log into a fresh file beside the live projections and compares the two
row by row: they must be identical, since projections are a pure function of the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ffdl.adapters.bus import open_bus
from ffdl.adapters.config import Settings
from ffdl.adapters.log_reading import merged_events
from ffdl.core.invariants import InvariantChecker
from ffdl.events.codec import DecodeError, event_from_json
from ffdl.handlers.messaging import Topics
from ffdl.projections.store import LoggedEvent, Projection, rebuild


async def verify_log(settings: Settings) -> dict[str, Any]:
    bus = open_bus(settings.bus_url, settings.partitions)
    await bus.start()
    checker = InvariantChecker()
    try:
        async for logged in merged_events(bus, Topics.with_prefix(settings.topic_prefix).events):
            checker.feed(logged.event, logged.position)
    finally:
        await bus.close()
    violations = checker.finish()
    return {
        "events": checker.events,
        "jobs": len(checker.jobs),
        "duplicates": checker.duplicates,
        "violations": [{k: str(v) for k, v in dataclasses.asdict(v).items()} for v in violations],
    }


async def rebuild_projections(settings: Settings) -> dict[str, Any]:
    bus = open_bus(settings.bus_url, settings.partitions)
    await bus.start()
    try:
        events: list[LoggedEvent] = []
        topic = Topics.with_prefix(settings.topic_prefix).events
        for partition in sorted(await bus.end_offsets(topic)):
            async for record in bus.read(topic, partition):
                try:
                    events.append(LoggedEvent(event_from_json(record.value), record.partition, record.offset))
                except DecodeError:
                    continue
    finally:
        await bus.close()
    live_path = settings.projection_path
    rebuilt_path = live_path.with_name("projections.rebuilt.sqlite")
    for suffix in ("", "-wal", "-shm"):
        rebuilt_path.with_name(rebuilt_path.name + suffix).unlink(missing_ok=True)
    rebuilt = Projection(rebuilt_path)
    applied = await asyncio.to_thread(rebuild, rebuilt, events)
    rebuilt_dump = await asyncio.to_thread(rebuilt.dump)
    rebuilt.close()
    identical = None
    if live_path.exists():
        live = Projection(live_path)
        identical = await asyncio.to_thread(live.dump) == rebuilt_dump
        live.close()
    return {"events": applied, "path": str(rebuilt_path), "identical": identical}
