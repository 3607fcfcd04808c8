"""How fast ``KafkaBus.publish`` appends, on one tansu broker it starts (memory storage).

Publishes ``--records`` records of ``--size`` bytes (the lifecycle bench's average message, headers
included, is 629) keyed by ``--jobs`` job ids over 8 partitions, ``--per-publish`` records to a
publish, one publish after another (as an owner flushes its fetches), and prints records/s per
publish size. Run it twice, on the code before and after a change, against the same machine state:

    PYTHONPATH=src .venv/bin/python -m bench.bus_publish_bench --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.handlers.ports import OutgoingRecord
from tests.services import TansuBroker


async def measure(bootstrap: str, records: int, size: int, jobs: int, per_publish: int) -> float:
    bus = KafkaBus(bootstrap, 8)
    await bus.start()
    try:
        topic = f"publish-{uuid.uuid4().hex[:8]}"
        await bus.publish(topic, [OutgoingRecord("warm-up", b"x")])
        value = b"v" * (size - 100)
        headers = (("ce_type", b"io.ffdl.JobQueued.v1"), ("ffdl_command_offset", b"123456"))
        batch = [OutgoingRecord(f"job-{i % jobs}", value, headers) for i in range(records)]
        started = time.perf_counter()
        for at in range(0, records, per_publish):
            await bus.publish(topic, batch[at : at + per_publish])
        return records / (time.perf_counter() - started)
    finally:
        await bus.close()


async def main(args: argparse.Namespace) -> dict[str, float]:
    broker = TansuBroker()
    broker.start()
    try:
        results: dict[str, float] = {}
        for per_publish in args.per_publish:
            count = min(args.records, per_publish * 400)
            rate = await measure(broker.bootstrap, count, args.size, args.jobs, per_publish)
            results[f"{per_publish} per publish"] = round(rate, 1)
        return results
    finally:
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=629)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--per-publish", type=int, nargs="+", default=[1, 50, 500, 5000])
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    print(
        json.dumps(figures)
        if arguments.json
        else "\n".join(f"{k}: {v} records/s" for k, v in figures.items())
    )
