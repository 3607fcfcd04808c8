"""Lifecycle benchmark on Kafka: how many jobs per second the platform takes from submitted to COMPLETED.

Everything runs on one machine, against one tansu broker (the Kafka-protocol test broker, memory
storage) that this script starts:

1. **Lifecycles.** The platform runs as ``ffdl up`` processes (by default three: ``workers``,
   ``scheduler`` and ``projector``; ``--layout`` chooses) with instant learners
   (``FFDL_LAUNCHER=instant``: each learner starts and exits 0 at once, through the heartbeat store
   and the normal monitor path) on 64 nodes x 8 GPUs. After one warm-up job, ``--jobs`` one-GPU
   ``SubmitJob`` commands are put on the commands topic at once, as an outside producer would, and
   the clock stops when the last job's ``GpusReleased`` (the last event of a lifecycle) is on the
   events topic. Reported: jobs/s, events/s, all messages (commands and events) per second, and the
   CPU time each process and the broker spent per job.
2. **The limit.** The very records the lifecycles wrote (every command and event: same count, keys,
   values and headers) are produced again with plain aiokafka (``acks=all``) into a fresh topic with
   the same partition count by one process, while another process consumes them: messages/s from
   the first send to the last receipt, and CPU per message. The ratio is the platform's messages/s
   over the raw pipeline's: the share of the broker-and-client limit that the platform's own work
   leaves.
3. **Latency.** Jobs are submitted at half the measured lifecycle rate for ``--latency-seconds``;
   an event's latency is the time from its record's timestamp (set by the producer as it appends)
   to the moment the projection's stored position passes its offset (polled every 2 ms). Reported:
   p50, p99 and max.

On a machine shared with other work the rates move with its load; the CPU times per job and per
message do not, much.

Run from the repository root (a few minutes):

    .venv/bin/python -m bench.lifecycle_bench [--jobs 1000] [--latency-seconds 15] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import platform
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ffdl.adapters.bus.kafka import KafkaBus
from ffdl.core.authorization import Principal
from ffdl.core.kinds import JOBS
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command
from ffdl.events.model import JobSpec
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.wiring.logging import configure_logging
from tests.services import TansuBroker

PARTITIONS = 8
#: The inventory: enough GPUs for many instant jobs at once, as many nodes as a small cluster has.
NODES = 64
GPUS_PER_NODE = 8
SUBMIT_CHUNK = 500
#: How often the latency run polls the projection's positions.
POLL_S = 0.002
SPEC = JobSpec(name="bench", command="true", learners=1, gpus=1)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: A record as the raw pipeline replays it: key, value, headers.
RawRecord = tuple[bytes, bytes, list[tuple[str, bytes]]]


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --------------------------------------------------------------------------- the platform


def start_platform(
    broker: TansuBroker, prefix: str, data_dir: Path, layout: Sequence[str], profile: Path | None = None
) -> list[subprocess.Popen[bytes]]:
    """The platform's processes; with ``profile``, each runs under cProfile and writes
    ``<profile>/<roles>.prof`` as it exits."""
    env = {
        **os.environ,
        "FFDL_DATA_DIR": str(data_dir),
        "FFDL_BUS": broker.url,
        "FFDL_TOPIC_PREFIX": prefix,
        "FFDL_PARTITIONS": str(PARTITIONS),
        "FFDL_LAUNCHER": "instant",
        "FFDL_NODES": json.dumps([{"name": f"node-{n}", "gpus": GPUS_PER_NODE} for n in range(NODES)]),
        "FFDL_LOG_LEVEL": "warning",
        "FFDL_LOG_FORMAT": "json",
    }
    processes = []
    for index, roles in enumerate(layout):
        profiler = ["-m", "cProfile", "-o", str(profile / f"{roles}.prof")] if profile else []
        with (data_dir.parent / f"platform-{index}.log").open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [sys.executable, *profiler, "-m", "ffdl.cli", "up", "--open", "--roles", roles],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return processes


def stop_platform(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class EventWatch:
    """Follows the events topic: which of our jobs released their GPUs, and where each event landed."""

    jobs: set[str]
    released: set[str] = field(default_factory=set)
    events: int = 0
    #: (partition, offset) -> the record's timestamp (s), for the latency run.
    stamps: dict[tuple[int, int], float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def see(self, partition: int, offset: int, key: str, timestamp_ms: int, headers: Sequence[Any]) -> None:
        self.events += 1
        self.stamps[(partition, offset)] = timestamp_ms / 1000
        if key in self.jobs and b"io.ffdl.GpusReleased" in dict(headers).get("ce_type", b""):
            self.released.add(key)
            if len(self.released) == len(self.jobs):
                self.done.set()


async def watch_events(
    bootstrap: str, topic: str, watch: EventWatch, ready: asyncio.Event, stop: asyncio.Event
) -> None:
    """Feed ``watch`` every event appended after ``ready`` is set, until ``stop``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=20)
    await consumer.start()
    try:
        everywhere = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(everywhere)
        await consumer.seek_to_end(*everywhere)
        for where in everywhere:
            await consumer.position(where)
        ready.set()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=50, max_records=5000)
            for messages in batches.values():
                for m in messages:
                    watch.see(m.partition, m.offset, m.key.decode(), m.timestamp, m.headers)
    finally:
        await consumer.stop()


async def run_jobs(
    sender: CommandSender, bootstrap: str, topics: Topics, count: int, *, rate: float | None
) -> tuple[float, EventWatch]:
    """Submit ``count`` jobs (all at once, or ``rate`` per second); wait for the end of their lifecycles."""
    commands: list[Command] = [
        sender.make(JOBS.address(f"bench-{uuid.uuid4().hex[:12]}", "default"), cmd.SubmitJob(spec=SPEC))
        for _ in range(count)
    ]
    watch = EventWatch({c.job_id for c in commands})
    ready, stop = asyncio.Event(), asyncio.Event()
    watching = asyncio.create_task(watch_events(bootstrap, topics.events, watch, ready, stop))
    await ready.wait()
    started = time.monotonic()
    if rate is None:
        for first in range(0, count, SUBMIT_CHUNK):
            await sender.send(*commands[first : first + SUBMIT_CHUNK])
    else:
        sent = 0
        while sent < count:
            due = min(count, int((time.monotonic() - started) * rate) + 1)
            if due > sent:
                await sender.send(*commands[sent:due])
                sent = due
            await asyncio.sleep(0.01)
    await asyncio.wait_for(watch.done.wait(), 900)
    elapsed = time.monotonic() - started
    stop.set()
    await watching
    return elapsed, watch


async def recorded(
    bus: KafkaBus, topics: Sequence[str], since: Mapping[str, Mapping[int, int]]
) -> tuple[list[RawRecord], dict[str, list[float]]]:
    """Every record of ``topics`` from the offsets in ``since`` to their ends; and, for each type of
    event, the seconds from the previous record of the same key to it (its hop's latency)."""
    found = [
        r for topic in topics for partition in range(PARTITIONS)
        async for r in bus.read(topic, partition, since[topic][partition])
    ]  # fmt: skip
    hops: dict[str, list[float]] = {}
    last: dict[str, int] = {}
    for r in sorted(found, key=lambda r: (r.timestamp_ms, r.topic != bus_commands(topics))):
        kind = dict(r.headers).get("ce_type", b"?").decode().removeprefix("io.ffdl.")
        if r.key in last:
            hops.setdefault(kind, []).append((r.timestamp_ms - last[r.key]) / 1000)
        last[r.key] = r.timestamp_ms
    return [(r.key.encode(), r.value, list(r.headers)) for r in found], hops


def bus_commands(topics: Sequence[str]) -> str:
    """The commands topic among ``topics`` (a command precedes the events it causes at equal times)."""
    return next(topic for topic in topics if topic.endswith(".commands"))


def poll_projection(path: Path, stop: asyncio.Event, applied_at: dict[tuple[int, int], float]) -> None:
    """Stamp each (partition, offset) with the time the projection's position first passed it."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    seen: dict[int, int] = {}
    try:
        while not stop.is_set():
            now = time.time()
            for partition, next_offset in db.execute("SELECT partition, next_offset FROM positions"):
                for offset in range(seen.get(partition, next_offset), next_offset):
                    applied_at[(partition, offset)] = now
                seen[partition] = next_offset
            time.sleep(POLL_S)
    finally:
        db.close()


# --------------------------------------------------------------------------- the raw pipeline


def raw_pipeline(bootstrap: str, records: list[RawRecord], work: Path) -> dict[str, float]:
    """One process produces ``records`` into a fresh topic while another consumes them."""
    topic = f"raw-{uuid.uuid4().hex[:8]}"
    dump = work / "raw-records.pickle"
    dump.write_bytes(pickle.dumps(records))
    script = [sys.executable, "-m", "bench.lifecycle_bench"]
    consumer = subprocess.Popen(
        [*script, "--raw-consume", bootstrap, topic, str(len(records))], stdout=subprocess.PIPE, text=True
    )
    assert consumer.stdout is not None
    if consumer.stdout.readline().strip() != "ready":
        raise RuntimeError("the raw consumer did not start")
    producer = subprocess.run(
        [*script, "--raw-produce", bootstrap, topic, str(dump)], capture_output=True, text=True, check=True
    )
    first_sent, producer_cpu = map(float, producer.stdout.split())
    last_received, consumer_cpu = map(float, consumer.stdout.readline().split())
    consumer.wait()
    return {"seconds": last_received - first_sent, "producer_cpu": producer_cpu, "consumer_cpu": consumer_cpu}


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def raw_produce(bootstrap: str, topic: str, records: list[RawRecord]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        first, cpu = time.time(), own_cpu()
        pending = [
            await producer.send(topic, value, key=key, headers=headers) for key, value, headers in records
        ]
        await asyncio.gather(*pending)
        cpu = own_cpu() - cpu
    finally:
        await producer.stop()
    print(first, cpu)


async def raw_consume(bootstrap: str, topic: str, count: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=20)
    await consumer.start()
    try:
        everywhere = [KafkaTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(everywhere)
        for where in everywhere:
            consumer.seek(where, 0)
        print("ready", flush=True)
        received, cpu = 0, None
        while received < count:
            batches = await consumer.getmany(timeout_ms=100, max_records=5000)
            if batches and cpu is None:
                cpu = own_cpu()
            received += sum(len(messages) for messages in batches.values())
        print(time.time(), own_cpu() - (cpu or 0.0), flush=True)
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- the whole run


@contextlib.asynccontextmanager
async def running_platform(
    broker: TansuBroker, prefix: str, data_dir: Path, layout: Sequence[str], profile: Path | None
) -> AsyncIterator[list[int]]:
    processes = start_platform(broker, prefix, data_dir, layout, profile)
    try:
        yield [process.pid for process in processes]
    finally:
        stop_platform(processes)


async def benchmark(
    jobs: int, latency_seconds: float, layout: Sequence[str], work: Path, profile: Path | None = None
) -> dict[str, Any]:
    broker = TansuBroker()
    broker.start()
    broker_pid = broker.pid
    topics = Topics.with_prefix(f"bench-{uuid.uuid4().hex[:6]}")
    data_dir = work / "ffdl"
    data_dir.mkdir()
    try:
        bus = KafkaBus(broker.bootstrap, PARTITIONS, topics=[topics.commands, topics.events])
        await bus.start()
        sender = CommandSender(bus, topics, "bench", Principal.tenant("default"))
        prefix = topics.commands.removesuffix(".commands")
        async with running_platform(broker, prefix, data_dir, layout, profile) as pids:
            progress(f"platform starting: {' | '.join(layout)}")
            await run_jobs(sender, broker.bootstrap, topics, 1, rate=None)  # warm-up: every role is up
            progress(f"warm-up job done; {jobs} jobs at once")
            since = {t: await bus.end_offsets(t) for t in (topics.commands, topics.events)}
            cpu_before = {pid: cpu_seconds(pid) for pid in [*pids, broker_pid]}
            elapsed, watch = await run_jobs(sender, broker.bootstrap, topics, jobs, rate=None)
            cpu_used = {pid: cpu_seconds(pid) - before for pid, before in cpu_before.items()}
            progress(f"{jobs} lifecycles in {elapsed:.1f} s")
            records, hops = await recorded(bus, [topics.commands, topics.events], since)
            rate = jobs / elapsed
            paced = max(1, round(rate / 2 * latency_seconds))
            progress(f"latency run: {paced} jobs at {rate / 2:.1f} jobs/s")
            applied_at: dict[tuple[int, int], float] = {}
            stop_polling = asyncio.Event()
            projection = data_dir.resolve() / "projections.sqlite"
            polling = asyncio.create_task(
                asyncio.to_thread(poll_projection, projection, stop_polling, applied_at)
            )
            _, paced_watch = await run_jobs(sender, broker.bootstrap, topics, paced, rate=rate / 2)
            await asyncio.sleep(0.5)  # the projection's last batch
            stop_polling.set()
            await polling
        await bus.close()
        progress(f"raw pipeline: {len(records)} records")
        broker_cpu_before = cpu_seconds(broker_pid)
        raw = raw_pipeline(broker.bootstrap, records, work)
        raw_broker_cpu = cpu_seconds(broker_pid) - broker_cpu_before
    finally:
        broker.stop()
    latencies = [
        applied_at[where] - stamp for where, stamp in paced_watch.stamps.items() if where in applied_at
    ]
    messages = len(records)
    platform_rate, raw_rate = messages / elapsed, messages / raw["seconds"]
    size = sum(len(k) + len(v) + sum(len(n) + len(x) for n, x in h) for k, v, h in records) / messages
    platform_cpu = sum(cpu_used[pid] for pid in pids)
    by_type = Counter(dict(h).get("ce_type", b"?").decode() for _, _, h in records)
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "broker": "tansu (memory)"},
        "layout": list(layout),
        "lifecycles": {
            "jobs": jobs,
            "seconds": round(elapsed, 2),
            "jobs_per_s": round(rate, 1),
            "events_per_s": round(watch.events / elapsed, 1),
            "events_per_job": round(watch.events / jobs, 2),
            "messages": messages,
            "messages_per_s": round(platform_rate, 1),
            "mean_message_bytes": round(size),
            "cpu_ms_per_job": {
                **{
                    roles: round(cpu_used[pid] / jobs * 1000, 1)
                    for roles, pid in zip(layout, pids, strict=True)
                },
                "broker": round(cpu_used[broker_pid] / jobs * 1000, 1),
            },
            "platform_cpu_us_per_message": round(platform_cpu / messages * 1e6),
            "messages_per_job_by_type": {
                name.removeprefix("io.ffdl."): round(n / jobs, 2) for name, n in by_type.most_common()
            },
            "hop_ms_p50_by_type": {
                kind: round(percentile(seconds, 0.5) * 1000, 1)
                for kind, seconds in hops.items()
                if len(seconds) >= jobs / 2
            },
        },
        "raw_pipeline": {
            "seconds": round(raw["seconds"], 2),
            "messages_per_s": round(raw_rate, 1),
            "cpu_us_per_message": round((raw["producer_cpu"] + raw["consumer_cpu"]) / messages * 1e6),
            "broker_cpu_us_per_message": round(raw_broker_cpu / messages * 1e6),
        },
        "ratio_to_raw": round(platform_rate / raw_rate, 3),
        "latency": {
            "rate_jobs_per_s": round(rate / 2, 1),
            "jobs": paced,
            "events": len(latencies),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1),
        },
    }


def render(report: Mapping[str, Any]) -> str:
    life, raw, latency = report["lifecycles"], report["raw_pipeline"], report["latency"]
    cpu = ", ".join(f"{name} {ms} ms" for name, ms in life["cpu_ms_per_job"].items())
    by_type = ", ".join(f"{name} {n}" for name, n in life["messages_per_job_by_type"].items())
    hop_ms = ", ".join(f"{name} {ms}" for name, ms in life["hop_ms_p50_by_type"].items())
    return "\n".join(
        [
            f"platform processes: {' | '.join(report['layout'])}; {report['machine']}",
            f"lifecycles: {life['jobs']} jobs in {life['seconds']} s: {life['jobs_per_s']} jobs/s, "
            f"{life['events_per_s']} events/s ({life['events_per_job']} events/job), "
            f"{life['messages_per_s']} messages/s "
            f"({life['messages']} messages, {life['mean_message_bytes']} B mean)",
            f"  CPU per job: {cpu}; platform {life['platform_cpu_us_per_message']} us per message",
            f"  messages per job: {by_type}",
            f"  median ms since the key's previous record: {hop_ms}",
            f"raw aiokafka, the same {life['messages']} records: {raw['seconds']} s, "
            f"{raw['messages_per_s']} messages/s; CPU per message: clients {raw['cpu_us_per_message']} us, "
            f"broker {raw['broker_cpu_us_per_message']} us",
            f"ratio to raw: {report['ratio_to_raw']}",
            f"event -> projection at {latency['rate_jobs_per_s']} jobs/s ({latency['events']} events): "
            f"p50 {latency['p50_ms']} ms, p99 {latency['p99_ms']} ms, max {latency['max_ms']} ms",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument(
        "--layout", nargs="+", default=["workers", "scheduler", "projector"], help="roles per process"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--profile", type=Path, help="run each platform process under cProfile, writing DIR/<roles>.prof"
    )
    parser.add_argument(
        "--raw-produce", nargs=3, metavar=("BOOTSTRAP", "TOPIC", "DUMP"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--raw-consume", nargs=3, metavar=("BOOTSTRAP", "TOPIC", "COUNT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    configure_logging("console", "warning")  # stdout carries only the report
    if args.raw_produce:
        bootstrap, topic, dump = args.raw_produce
        asyncio.run(raw_produce(bootstrap, topic, pickle.loads(Path(dump).read_bytes())))
    elif args.raw_consume:
        bootstrap, topic, count = args.raw_consume
        asyncio.run(raw_consume(bootstrap, topic, int(count)))
    else:
        with tempfile.TemporaryDirectory(prefix="ffdl-bench-") as work:
            report = asyncio.run(
                benchmark(args.jobs, args.latency_seconds, args.layout, Path(work), args.profile)
            )
        print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
