"""Heartbeat benchmarks on a real etcd: how fast a lost or hung learner is detected, and what 2,000 cost.

Detection latency (the whole platform as one ``ffdl up`` process, real learner agents and learners):

* ``sigkill``: ``--trials`` one-learner jobs run; each learner's agent and user process (one process
  group) are killed with SIGKILL, a quarter second apart; the latency of a trial runs from the kill
  to the ``occurred_at`` of the job's ``LearnerLost`` event (the owner's decision). Target: at most
  TTL + 1 s.
* ``hang``: ``--trials`` learners write two lines and then sleep, alive but making no progress; the
  latency runs from the learner's last progress (``last_progress`` in its heartbeat: when the agent
  read its last output) to ``LearnerLost(hung)``. Target: at most ``progress_timeout`` + 1 s.

Heartbeat load (``--learners`` simulated learners, no learner processes): ``--simulators``
processes each run their share of learners as asyncio tasks on one etcd client, each learner
doing what an agent does: a lease of the TTL, its key written with a heartbeat, a keepalive every
TTL/3 (over one keepalive stream per simulator process, see :class:`KeepaliveStream`), and a new
heartbeat (a new step) every ``--put-interval`` seconds. Once every key exists, a
monitor process starts: the real :class:`~ffdl.handlers.monitoring.Monitor`, watching every
learner's job (as if its partitions held them all) and sending its commands to an embedded log.
Over ``--duration`` seconds the benchmark reads, from ``/proc/<pid>/stat``, the CPU of etcd, of the
monitor and of the simulators (in % of one core), and measures the monitor's lag: each heartbeat
carries the time it was written (a ``put_at`` metric), the monitor forwards the metrics in the
``ReportProgress`` it sends, and the lag is the command's ``issued_at`` minus ``put_at``. It also
counts leases that expired (keepalive said gone) and learners the monitor reported lost (both
should be 0).

Run from the repository root (needs ``/usr/bin/etcd``; one run takes about two minutes):

    .venv/bin/python -m bench.heartbeat_bench [--ttl 5] [--progress-timeout 5] [--trials 20]
        [--learners 2000] [--put-interval 5] [--duration 30] [--only detection|load] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform as host
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.synchronize import Event as StopFlag
from pathlib import Path
from typing import Any

import aetcd
import httpx
import yaml
from aetcd import rpc

from ffdl.adapters.bus import open_bus
from ffdl.adapters.heartbeats import JOBS_PREFIX, EtcdHeartbeatStore, learner_key, parse_key
from ffdl.core.authorization import Principal
from ffdl.core.job import Job, evolve, start
from ffdl.events import job_commands as cmd
from ffdl.events import job_events as ev
from ffdl.events.codec import command_from_json
from ffdl.events.envelope import Event, EventData
from ffdl.events.model import JobSpec, LearnerPlacement, LossReason, Placement
from ffdl.handlers.heartbeat_keys import LearnerBeat
from ffdl.handlers.messaging import CommandSender, Topics
from ffdl.handlers.monitoring import Monitor
from ffdl.tools.log_reading import merged_events
from ffdl.wiring.config import NodeConfig, Settings
from ffdl.wiring.logging import configure_logging
from tests.harness import fast_settings, learner_variables, manifest
from tests.services import EtcdServer, free_port

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
KILL_STAGGER_S = 0.25
#: A learner alive but making no progress once it has written its second line.
HANGING_PROGRAM = "; ".join(
    [
        "import time",
        "print('working', flush=True)",
        "time.sleep(0.5)",
        "print('hung', flush=True)",
        "time.sleep(3600)",
    ]
)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p99": round(at(0.99), 3),
        "max": round(ordered[-1], 3),
        "min": round(ordered[0], 3),
    }


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (fields 14 and 15 of ``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def etcd_pid(server: EtcdServer) -> int:
    """The pid of the etcd serving ``server``'s client port, found by its command line."""
    wanted = f"--listen-client-urls=http://{server.host}:{server.port}"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                    return int(entry.name)
            except OSError:
                continue
    raise LookupError(f"no etcd process listens on {server.port}")


# -- detection latency ----------------------------------------------------------------------------


class PlatformProcess:
    """``ffdl up`` (every role) in a process of its own, so that the benchmark's polling of the log
    and of etcd never competes with the monitor and the owners for their event loop; driven over HTTP.
    """

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self._log_path = log_path
        self._process: asyncio.subprocess.Process | None = None
        self.http = httpx.AsyncClient(base_url=settings.api, timeout=60)

    async def __aenter__(self) -> PlatformProcess:
        s = self.settings
        nodes = [node.model_dump() for node in s.nodes or []]
        env = {
            **os.environ,
            "FFDL_DATA_DIR": str(s.data_dir),
            "FFDL_API": s.api,
            "FFDL_HEARTBEATS": s.heartbeats_url,
            "FFDL_HEARTBEAT_TTL_S": str(s.heartbeat_ttl_s),
            "FFDL_MONITOR_GRACE_S": str(s.monitor_grace_s),
            "FFDL_STOP_GRACE_S": str(s.stop_grace_s),
            "FFDL_PARTITIONS": str(s.partitions),
            "FFDL_NODES": json.dumps(nodes),
            "FFDL_LOG_FORMAT": "json",
            "FFDL_LOG_LEVEL": s.log_level,
            **learner_variables(s),
        }
        with self._log_path.open("ab") as out:
            self._process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "ffdl.cli", "up", "--open"),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not await self._healthy():
            if time.monotonic() > deadline or self._process.returncode is not None:
                raise RuntimeError(f"the platform did not come up; see {self._log_path}")
            await asyncio.sleep(0.1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._process.wait(), 30)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()

    async def _healthy(self) -> bool:
        try:
            return (await self.http.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    async def submit(self, text: str) -> str:
        response = await self.http.post(
            "/v1/jobs", content=text, headers={"Content-Type": "application/yaml"}
        )
        response.raise_for_status()
        return str(response.json()["job_id"])

    async def wait_running(self, job_id: str, *, stepped: bool) -> dict[str, Any]:
        """The job once RUNNING (and, with ``stepped``, its learner past step 0)."""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            job: dict[str, Any] = (await self.http.get(f"/v1/jobs/{job_id}")).json()
            if job["state"] == "RUNNING" and (not stepped or job["learners"][0]["step"] >= 1):
                return job
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not run within 180 s")


async def loss_times(
    settings: Settings, job_ids: Sequence[str], timeout_s: float
) -> dict[str, tuple[float, LossReason]]:
    """Wait until every job has a ``LearnerLost``; per job, the first one's ``occurred_at`` and reason."""
    deadline = time.monotonic() + timeout_s
    wanted = set(job_ids)
    found: dict[str, tuple[float, LossReason]] = {}
    topic = Topics.with_prefix(settings.topic_prefix).events
    while True:
        bus = open_bus(settings.bus_url, settings.partitions)
        await bus.start()
        try:
            async for logged in merged_events(bus, topic):
                event = logged.event
                if (
                    isinstance(event, Event)
                    and event.job_id in wanted
                    and isinstance(event.data, ev.LearnerLost)
                    and event.job_id not in found
                ):
                    found[event.job_id] = (event.occurred_at.timestamp(), event.data.reason)
        finally:
            await bus.close()
        if len(found) == len(wanted):
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(wanted) - len(found)} jobs have no LearnerLost after {timeout_s} s")
        await asyncio.sleep(0.5)


async def sigkill_trials(platform: PlatformProcess, trials: int) -> list[float]:
    texts = [
        manifest(f"kill-{i}", learners=1, args=["--steps", "1000000", "--delay", "0.05"], max_restarts=0)
        for i in range(trials)
    ]
    job_ids = [await platform.submit(text) for text in texts]
    jobs = [await platform.wait_running(job_id, stepped=True) for job_id in job_ids]
    killed_at: dict[str, float] = {}
    for job in jobs:
        group = os.getpgid(job["learners"][0]["pid"])
        killed_at[job["job_id"]] = time.time()
        os.killpg(group, signal.SIGKILL)
        await asyncio.sleep(KILL_STAGGER_S)
    settings = platform.settings
    lost = await loss_times(settings, list(killed_at), timeout_s=60 + 2 * settings.heartbeat_ttl_s)
    latencies = []
    for job_id, kill_time in killed_at.items():
        lost_at, reason = lost[job_id]
        assert reason == LossReason.EXPIRED, (job_id, reason)
        latencies.append(lost_at - kill_time)
    return latencies


def hanging_job(index: int, timeout_s: float) -> str:
    """A learner that writes two lines, then sleeps: its last output is its last progress."""
    spec = {
        "name": f"hang-{index}",
        "learners": 1,
        "gpus": 1,
        "command": f'{sys.executable} -c "{HANGING_PROGRAM}"',
        "max_restarts": 0,
        "progress_timeout_s": timeout_s,
    }
    return yaml.safe_dump(spec)


async def hang_trials(
    platform: PlatformProcess, store: EtcdHeartbeatStore, trials: int, timeout_s: float
) -> list[float]:
    job_ids = [await platform.submit(hanging_job(i, timeout_s)) for i in range(trials)]
    progress_seen: dict[str, set[float]] = {job_id: set() for job_id in job_ids}
    losing = asyncio.create_task(loss_times(platform.settings, job_ids, timeout_s=120 + 3 * timeout_s))
    while not losing.done():
        for key, value in (await store.snapshot(JOBS_PREFIX)).values.items():
            parsed = parse_key(key)
            if parsed is not None and parsed.kind == "learner" and parsed.job_id in job_ids:
                progress_seen[parsed.job_id].add(LearnerBeat.from_json(value).last_progress)
        await asyncio.wait({losing}, timeout=0.1)
    lost = losing.result()
    latencies = []
    for job_id in job_ids:
        lost_at, reason = lost[job_id]
        assert reason == LossReason.HUNG, (job_id, reason)
        # The last progress before the decision: a stopped learner's final heartbeat comes later.
        latencies.append(lost_at - max(t for t in progress_seen[job_id] if t <= lost_at))
    return latencies


async def detection(
    server: EtcdServer, ttl_s: float, progress_timeout_s: float, trials: int, log_level: str
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ffdl-heartbeat-bench-") as work:
        settings = fast_settings(
            Path(work) / "ffdl",
            heartbeats=server.url,
            heartbeat_ttl_s=ttl_s,
            monitor_grace_s=ttl_s,
            stop_grace_s=1.0,
            nodes=[NodeConfig(name="bench", gpus=trials)],
            api=f"http://127.0.0.1:{free_port()}",
            log_level=log_level,
        )
        store = EtcdHeartbeatStore(server.host, server.port)
        try:
            async with PlatformProcess(settings, Path(work) / "platform.log") as platform:
                kills = await sigkill_trials(platform, trials)
                hangs = await hang_trials(platform, store, trials, progress_timeout_s)
        finally:
            await store.close()
    return {
        "ttl_s": ttl_s,
        "progress_timeout_s": progress_timeout_s,
        "sigkill_to_lost_s": percentiles(kills),
        "sigkill_target_s": ttl_s + 1,
        "hang_to_lost_s": percentiles(hangs),
        "hang_target_s": progress_timeout_s + 1,
    }


# -- heartbeat load ------------------------------------------------------------------------------


def load_job(index: int) -> Job:
    """Job ``load-NNNN``: RUNNING its first attempt with one started learner, folded from its events."""
    job_id = f"load-{index:05d}"
    spec = JobSpec(name="load", command="true", learners=1, gpus=1)
    placement = Placement(learners=(LearnerPlacement(rank=0, node="bench", gpus=(0,)),))
    datas: list[EventData] = [
        ev.JobSubmitted(spec=spec),
        ev.JobAccepted(),
        ev.JobQueued(),
        ev.GpusAllocated(placement=placement),
        ev.JobLaunching(attempt=1),
        ev.LearnerStarted(rank=0, attempt=1),
        ev.JobRunning(attempt=1),
    ]
    now = datetime.now(UTC)
    events = [
        Event(
            event_id=uuid.uuid4(),
            job_id=job_id,
            tenant="bench",
            seq=seq,
            occurred_at=now,
            producer="bench",
            data=data,
        )
        for seq, data in enumerate(datas, start=1)
    ]
    job = start(events[0])
    for event in events[1:]:
        job = evolve(job, event)
    return job


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What the load part runs: against which etcd, how many learners, how often they write."""

    host: str
    port: int
    learners: int
    simulators: int
    ttl_s: float
    put_interval_s: float
    duration_s: float
    log_level: str


class KeepaliveStream:
    """Renews many leases over one ``LeaseKeepAlive`` stream, as etcd's Go client does.

    A learner agent opens a stream per renewal (``EtcdHeartbeatStore.keepalive``); a simulator that
    did the same for a thousand learners would spend its CPU on gRPC call setup, not on load.
    """

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self._client = aetcd.Client(host, port, timeout=timeout_s)
        self._timeout_s = timeout_s
        self._requests: asyncio.Queue[int] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[bool]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._client.connect()
        call = self._client.leasestub.LeaseKeepAlive(self._outgoing(), metadata=self._client.metadata)
        self._reader = asyncio.create_task(self._read(call))

    async def _outgoing(self) -> AsyncIterator[Any]:
        while True:
            yield rpc.LeaseKeepAliveRequest(ID=await self._requests.get())

    async def _read(self, call: Any) -> None:
        async for reply in call:
            waiter = self._waiting.pop(int(reply.ID), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(int(reply.TTL) > 0)

    async def keepalive(self, lease: int) -> bool:
        waiter = self._waiting[lease] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(lease)
        try:
            return await asyncio.wait_for(waiter, self._timeout_s)
        except TimeoutError as error:
            raise ConnectionError(f"no keepalive answer for lease {lease}") from error

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._client.close()


def simulate_learners(plan: LoadPlan, indexes: range, stop: StopFlag, results: Any) -> None:
    """A simulator process: one asyncio task per learner, all on one etcd connection."""
    configure_logging("json", plan.log_level)
    ttl_s, put_interval_s = plan.ttl_s, plan.put_interval_s

    async def run() -> dict[str, int]:
        store = EtcdHeartbeatStore(plan.host, plan.port, timeout_s=max(2.0, ttl_s))
        renewals = KeepaliveStream(plan.host, plan.port, timeout_s=max(2.0, ttl_s))
        await renewals.start()
        stats = {"puts": 0, "keepalives": 0, "expired": 0, "errors": 0}

        async def learner(index: int) -> None:
            key = learner_key(f"load-{index:05d}", 0)
            step = 0

            def beat() -> bytes:
                now = time.time()
                return LearnerBeat(
                    attempt=1, pid=index, host="sim", step=step, last_progress=now, metrics={"put_at": now}
                ).to_json()

            await asyncio.sleep(random.uniform(0, ttl_s / 2))  # no thundering herd at start
            lease = await store.grant(ttl_s)
            await store.put(key, beat(), lease)
            next_put = time.monotonic() + random.uniform(0, put_interval_s)
            while not stop.is_set():
                await asyncio.sleep(ttl_s / 3)
                try:
                    stats["keepalives"] += 1
                    if not await renewals.keepalive(lease):
                        stats["expired"] += 1
                        lease = await store.grant(ttl_s)
                        await store.put(key, beat(), lease)
                    if time.monotonic() >= next_put:
                        step += 1
                        await store.put(key, beat(), lease)
                        stats["puts"] += 1
                        next_put += put_interval_s
                except (ConnectionError, LookupError):
                    stats["errors"] += 1

        tasks = [asyncio.create_task(learner(index)) for index in indexes]
        await asyncio.to_thread(stop.wait)
        await asyncio.gather(*tasks, return_exceptions=True)
        await renewals.close()
        await store.close()
        return stats

    results.put(asyncio.run(run()))


def run_monitor(plan: LoadPlan, log_dir: str, stop: StopFlag) -> None:
    """The monitor process: the real Monitor, watching every simulated learner's job."""
    configure_logging("json", plan.log_level)

    async def run() -> None:
        store = EtcdHeartbeatStore(plan.host, plan.port)
        bus = open_bus(f"embedded://{log_dir}", 8)
        await bus.start()
        sender = CommandSender(bus, Topics(), "monitor@bench", Principal.platform("monitor"))
        monitor = Monitor(store, sender, heartbeat_ttl_s=plan.ttl_s, grace_s=2 * plan.ttl_s)
        for index in range(plan.learners):
            monitor.observe(None, load_job(index))
        done = asyncio.Event()
        task = asyncio.create_task(monitor.run(done))
        await asyncio.to_thread(stop.wait)
        done.set()
        await task
        await bus.close()
        await store.close()

    asyncio.run(run())


async def key_count(store: EtcdHeartbeatStore) -> int:
    return len((await store.snapshot(JOBS_PREFIX)).values)


async def load(server: EtcdServer, plan: LoadPlan) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    results = spawn.Queue()
    learners, ttl_s, duration_s = plan.learners, plan.ttl_s, plan.duration_s
    shares = [range(i, learners, plan.simulators) for i in range(plan.simulators)]
    sims = [spawn.Process(target=simulate_learners, args=(plan, share, stop, results)) for share in shares]
    store = EtcdHeartbeatStore(server.host, server.port)
    with tempfile.TemporaryDirectory(prefix="ffdl-heartbeat-load-") as log_dir:
        monitor = spawn.Process(target=run_monitor, args=(plan, log_dir, stop))
        started_at = time.monotonic()
        try:
            for sim in sims:
                sim.start()
            deadline = time.monotonic() + 120
            while await key_count(store) < learners:
                if time.monotonic() > deadline:
                    raise TimeoutError("the simulated learners did not all register within 120 s")
                await asyncio.sleep(0.5)
            monitor.start()
            await asyncio.sleep(max(5.0, 2 * ttl_s))  # the monitor's first snapshot and a steady state
            etcd = etcd_pid(server)
            pids = {
                "etcd": etcd,
                "monitor": monitor.pid or 0,
                **{f"sim{i}": s.pid or 0 for i, s in enumerate(sims)},
            }
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            window_start = time.time()
            await asyncio.sleep(duration_s)
            window_end = time.time()
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        finally:
            stop.set()
            ran_s = time.monotonic() - started_at
            stats = [results.get(timeout=60) for _ in sims]
            for process in (*sims, monitor):
                process.join(timeout=30)
            await store.close()
        lags, lost = await monitor_lags(log_dir, window_start, window_end)
    cpu = {name: round(100 * (after[name] - before[name]) / duration_s, 1) for name in before}
    totals = {k: sum(s[k] for s in stats) for k in ("puts", "keepalives", "expired", "errors")}
    return {
        "learners": learners,
        "simulator_processes": plan.simulators,
        "ttl_s": ttl_s,
        "put_interval_s": plan.put_interval_s,
        "duration_s": duration_s,
        "cpu_percent_of_one_core": {
            "etcd": cpu["etcd"],
            "monitor": cpu["monitor"],
            "simulators": round(sum(v for k, v in cpu.items() if k.startswith("sim")), 1),
        },
        "rates_per_s": {k: round(totals[k] / ran_s, 1) for k in ("puts", "keepalives")},
        "leases_expired": totals["expired"],
        "store_errors": totals["errors"],
        "learners_reported_lost": lost,
        "monitor_lag_s": percentiles(lags),
    }


async def monitor_lags(log_dir: str, start_s: float, end_s: float) -> tuple[list[float], int]:
    """Lags of the ``ReportProgress`` commands the monitor issued in the window, and its loss reports."""
    bus = open_bus(f"embedded://{log_dir}", 8)
    await bus.start()
    lags: list[float] = []
    lost = 0
    try:
        for partition in sorted(await bus.end_offsets(Topics().commands)):
            async for record in bus.read(Topics().commands, partition):
                command = command_from_json(record.value)
                issued = command.issued_at.timestamp()
                if isinstance(command.data, cmd.ReportLearnerLost):
                    lost += 1
                elif isinstance(command.data, cmd.ReportProgress) and start_s <= issued <= end_s:
                    lags.append(issued - command.data.metrics["put_at"])
    finally:
        await bus.close()
    return lags, lost


# -- the command ---------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = EtcdServer()
    server.start()
    report: dict[str, Any] = {
        "machine": f"{host.machine()}, {os.cpu_count()} cores, Python {host.python_version()}",
        "etcd": "Debian etcd-server, single member, 50 ms heartbeat / 500 ms election timeout",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        if args.only in (None, "detection"):
            report["detection"] = await detection(
                server, args.ttl, args.progress_timeout, args.trials, args.log_level
            )
        if args.only in (None, "load"):
            plan = LoadPlan(
                server.host,
                server.port,
                args.learners,
                args.simulators,
                args.ttl,
                args.put_interval,
                args.duration,
                args.log_level,
            )
            report["load"] = await load(server, plan)
    finally:
        server.stop()
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--ttl", type=float, default=5.0, help="heartbeat lease TTL (default: the platform's)"
    )
    parser.add_argument(
        "--progress-timeout", type=float, default=5.0, help="the hung jobs' progress_timeout_s"
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--learners", type=int, default=2000)
    parser.add_argument("--simulators", type=int, default=2, help="processes the simulated learners share")
    parser.add_argument(
        "--put-interval", type=float, default=5.0, help="seconds between a learner's heartbeats"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load measured")
    parser.add_argument("--only", choices=("detection", "load"))
    parser.add_argument(
        "--log-level", default="warning", help="of every process (the platform's default: info)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging("json", args.log_level)
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2) if args.json else render(report))


def render(report: dict[str, Any]) -> str:
    lines = [
        f"machine: {report['machine']}",
        f"etcd: {report['etcd']}",
        f"load average (1, 5, 15 min): {report['load_average_at_start']} -> {report['load_average_at_end']}",
    ]
    if "detection" in report:
        d = report["detection"]
        lines.append(
            f"SIGKILL -> LearnerLost(expired), TTL {d['ttl_s']} s: {d['sigkill_to_lost_s']} "
            f"(target <= {d['sigkill_target_s']} s)"
        )
        lines.append(
            f"hang -> LearnerLost(hung), progress_timeout {d['progress_timeout_s']} s: "
            f"{d['hang_to_lost_s']} (target <= {d['hang_target_s']} s)"
        )
    if "load" in report:
        lines.append(f"load: {json.dumps(report['load'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
