"""Nemesis: minutes of seeded random faults on the real services, against a living workload, and a
checker that proves nothing was lost (architecture §11).

    python -m bench.nemesis --minutes 2 --seed 7 [--json] [--keep DIR]

The stack (:mod:`bench.nemesis_stack`): tansu, etcd and mosquitto; three worker processes, two
scheduler candidates and two API replicas with their projectors; the local launcher running
learners that train a little, checkpoint and report, some failing on purpose.

The workload (:class:`Workload`) drives the API at a steady pace and keeps a ledger of what was
acknowledged: submissions of mixed gang sizes, tenants and priorities; halts, resumes and cancels;
node cordons, drains and uncordons; a few poison records on the commands topic (the only dead
letters the run may leave). A write whose answer never came (the replica was killed, the broker
frozen) is recorded as unknown: it may or may not have happened, and either is fine.

The nemesis (:class:`Nemesis`) injects one fault at a time, drawn from the seed: kill -9 of any
platform process (started again after a moment, as a supervisor would), of learners and of their
agents; SIGSTOP/SIGCONT of the broker and of etcd, sometimes for longer than the learners' lease
TTL; an etcd restart; a worker cut off from broker and etcd in its network namespace (or frozen,
where no namespace can be made); an API replica killed with a request in flight. The first faults
go through every kind in a seeded order, so any run longer than two minutes injects at least five.
The seed fixes the schedule of faults and of the workload's actions (kinds, targets by index,
durations); what the system does in between depends on timing, so a replay reproduces the same
storm, not always the same interleaving.

The checker (:mod:`bench.nemesis_check`), once the faults stop and the system settles, checks the
guarantees of architecture §5 and reports every violation; a failing run prints its seed and the
command that replays it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.nemesis_check import CheckReport, check, settle
from bench.nemesis_stack import ADMIN, HEARTBEAT_TTL_S, NODES, TENANTS, Stack, learner_processes
from ffdl.handlers.messaging import PRINCIPAL_HEADER, Topics
from ffdl.handlers.ports import OutgoingRecord
from ffdl.tools.sre import started_bus
from ffdl.wiring.logging import configure_logging
from tests.harness import learner_command

#: Every kind of fault, in the names the report counts them by.
FAULT_KINDS = (
    "kill-platform-process",
    "kill-learner",
    "kill-agent",
    "pause-broker",
    "pause-etcd",
    "pause-etcd-past-ttl",
    "restart-etcd",
    "partition-worker",
    "kill-api-mid-request",
)
#: Seconds from the end of one fault to the start of the next (drawn uniformly).
FAULT_GAP_S = (3.0, 7.0)
#: Seconds between two actions of the workload (drawn uniformly).
ACTION_GAP_S = (1.0, 2.5)
#: Most poison records a run puts on the commands topic.
MAX_POISON = 3


@dataclass
class Write:
    """One write of the workload and what became of it: ``acked`` (the API answered 2xx),
    ``refused`` (4xx: the platform said no, which is an answer), ``unknown`` (no answer came)."""

    action: str
    job_id: str | None
    outcome: str
    name: str = ""
    at: str = ""
    detail: str = ""


@dataclass
class Ledger:
    """What the client knows it wrote: the truth the checker holds the platform to."""

    writes: list[Write] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)  # acknowledged submissions: job id → tenant
    poison: list[bytes] = field(default_factory=list)

    def record(self, write: Write) -> None:
        write.at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.writes.append(write)
        if write.action == "submit" and write.outcome == "acked" and write.job_id:
            self.jobs[write.job_id] = write.detail

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f"{w.action}:{w.outcome}" for w in self.writes).items()))


def job_manifest(rng: random.Random, name: str) -> str:
    """A small training: a gang of 1 to 3 learners of one GPU each, a few seconds of steps with a
    checkpoint every 5; one in six fails once and recovers from its checkpoint, one in twelve fails
    on every attempt (and so ends FAILED)."""
    steps = rng.randint(20, 60)
    args = ["--steps", str(steps), "--delay", "0.1", "--checkpoint-every", "5"]
    fate = rng.random()
    restarts = 4
    if fate < 1 / 12:
        args += ["--fail-at", str(steps // 2)]
        restarts = 1
    elif fate < 1 / 4:
        args += ["--fail-at", str(steps // 2), "--once"]
    spec = {
        "name": name,
        "learners": rng.choice((1, 1, 2, 3)),
        "gpus": 1,
        "priority": rng.choice((0, 0, 10, 50)),
        "placement": rng.choice(("pack", "spread")),
        "max_restarts": restarts,
        "command": learner_command(*args),
    }
    return yaml.safe_dump(spec)


class Workload:
    """A client driving the API replicas at a steady pace, keeping its ledger."""

    def __init__(self, stack: Stack, rng: random.Random, ledger: Ledger) -> None:
        self._stack = stack
        self._rng = rng
        self.ledger = ledger
        self._count = 0
        self._halted: list[str] = []
        self._cordoned: set[str] = set()
        self._client = httpx.AsyncClient(timeout=15)

    async def close(self) -> None:
        await self._client.aclose()

    def replica(self) -> str:
        return self._stack.api_urls[self._rng.choice(sorted(self._stack.api_urls))]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            action = self._rng.choices(
                ("submit", "halt", "resume", "cancel", "cordon", "uncordon", "poison"),
                weights=(50, 8, 8, 8, 5, 5, 1),
            )[0]
            await getattr(self, action)(self.replica())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._rng.uniform(*ACTION_GAP_S))

    async def _call(self, action: str, job_id: str | None, method: str, url: str, **kwargs: Any) -> Write:
        """One write: acked on 2xx, refused on 4xx, unknown when no answer (or a 5xx) came."""
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            write = Write(action, job_id, "unknown", detail=type(exc).__name__)
        else:
            if response.is_success:
                write = Write(action, job_id, "acked", detail=response.text[:200])
            elif 400 <= response.status_code < 500:
                write = Write(action, job_id, "refused", detail=response.text[:200])
            else:
                write = Write(
                    action, job_id, "unknown", detail=f"{response.status_code} {response.text[:200]}"
                )
        self.ledger.record(write)
        return write

    async def submit(self, url: str) -> Write:
        tenant = self._rng.choice(TENANTS)
        self._count += 1
        name = f"nem-{self._count}"
        text = job_manifest(self._rng, name)
        try:
            response = await self._client.post(
                f"{url}/v1/jobs",
                content=text,
                headers={"Content-Type": "application/yaml", **self._stack.auth(tenant)},
            )
        except httpx.TransportError as exc:
            write = Write("submit", None, "unknown", name=name, detail=type(exc).__name__)
        else:
            if response.status_code == 201:
                write = Write("submit", response.json()["job_id"], "acked", name=name, detail=tenant)
            elif 400 <= response.status_code < 500:
                write = Write("submit", None, "refused", name=name, detail=response.text[:200])
            else:
                write = Write("submit", None, "unknown", name=name, detail=str(response.status_code))
        self.ledger.record(write)
        return write

    def _some_job(self) -> tuple[str, str] | None:
        if not self.ledger.jobs:
            return None
        job_id = self._rng.choice(sorted(self.ledger.jobs))
        return job_id, self.ledger.jobs[job_id]

    async def halt(self, url: str) -> None:
        if (picked := self._some_job()) is None:
            return
        job_id, tenant = picked
        write = await self._call(
            "halt", job_id, "POST", f"{url}/v1/jobs/{job_id}:halt", headers=self._stack.auth(tenant)
        )
        if write.outcome == "acked":
            self._halted.append(job_id)

    async def resume(self, url: str) -> None:
        if not self._halted:
            return
        job_id = self._halted.pop(self._rng.randrange(len(self._halted)))
        headers = self._stack.auth(self.ledger.jobs[job_id])
        await self._call("resume", job_id, "POST", f"{url}/v1/jobs/{job_id}:resume", headers=headers)

    async def cancel(self, url: str) -> None:
        """Cancel a job the client believes live (a DELETE of an ended job would delete it)."""
        if (picked := self._some_job()) is None:
            return
        job_id, tenant = picked
        try:
            current = await self._client.get(f"{url}/v1/jobs/{job_id}", headers=self._stack.auth(tenant))
        except httpx.TransportError:
            return
        if current.status_code != 200 or current.json()["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
            return
        await self._call(
            "cancel", job_id, "DELETE", f"{url}/v1/jobs/{job_id}", headers=self._stack.auth(tenant)
        )

    async def cordon(self, url: str) -> None:
        node = self._rng.choice(NODES).name
        drain = self._rng.random() < 0.5
        write = await self._call(
            "drain" if drain else "cordon",
            None,
            "POST",
            f"{url}/v1/nodes/{node}:cordon",
            json={"reason": "nemesis", "drain": drain},
            headers=self._stack.auth(ADMIN),
        )
        if write.outcome != "refused":
            self._cordoned.add(node)

    async def uncordon(self, url: str) -> None:
        if not self._cordoned:
            return
        node = self._rng.choice(sorted(self._cordoned))
        write = await self._call(
            "uncordon",
            None,
            "POST",
            f"{url}/v1/nodes/{node}:uncordon",
            json={},
            headers=self._stack.auth(ADMIN),
        )
        if write.outcome == "acked":
            self._cordoned.discard(node)

    async def uncordon_all(self, deadline_s: float) -> None:
        """Uncordon every node the workload cordoned, retrying until acknowledged (the end of a run:
        queued jobs must be placeable for the system to settle)."""
        end = time.monotonic() + deadline_s
        for node in NODES:
            while time.monotonic() < end:
                write = await self._call(
                    "uncordon",
                    None,
                    "POST",
                    f"{self.replica()}/v1/nodes/{node.name}:uncordon",
                    json={},
                    headers=self._stack.auth(ADMIN),
                )
                if write.outcome != "unknown":
                    break
                await asyncio.sleep(1)
        self._cordoned.clear()

    async def poison(self, _url: str) -> None:
        """Put a record on the commands topic that is no command: its owner must dead-letter it and
        go on. These are the only dead letters the checker accepts."""
        if len(self.ledger.poison) >= MAX_POISON:
            return
        settings = self._stack.settings
        assert settings is not None
        payload = f"\xff nemesis poison {len(self.ledger.poison)} {uuid.uuid4()}".encode()
        topic = Topics.with_prefix(settings.topic_prefix).commands
        try:
            bus = await asyncio.wait_for(started_bus(settings.bus_url, settings.partitions, topic), 10)
            try:
                header = ((PRINCIPAL_HEADER, b"tenant:acme"),)
                await asyncio.wait_for(
                    bus.publish(topic, [OutgoingRecord(f"poison-{uuid.uuid4().hex[:8]}", payload, header)]),
                    10,
                )
            finally:
                await bus.close()
        except Exception as exc:
            self.ledger.record(Write("poison", None, "unknown", detail=repr(exc)[:200]))
            return
        self.ledger.poison.append(payload)
        self.ledger.record(Write("poison", None, "acked"))


class Nemesis:
    """Seeded faults, one at a time; every kill of a platform process is followed by its restart."""

    def __init__(self, stack: Stack, rng: random.Random, workload: Workload) -> None:
        self._stack = stack
        self._rng = rng
        self._workload = workload
        self.faults: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.last_fault_end = time.monotonic()
        self.partition_mode = "netns" if stack.partition.available else "sigstop"

    async def run(self, stop: asyncio.Event) -> None:
        order = list(FAULT_KINDS)
        self._rng.shuffle(order)
        while not stop.is_set():
            gap = self._rng.uniform(*FAULT_GAP_S)
            try:
                await asyncio.wait_for(stop.wait(), gap)
                return
            except TimeoutError:
                pass
            kind = order.pop(0) if order else self._rng.choice(FAULT_KINDS)
            started, began = time.monotonic(), datetime.now(UTC)
            detail = await getattr(self, kind.replace("-", "_"))()
            self.last_fault_end = time.monotonic()
            if detail is None:  # nothing to hit now (no learner running): this kind comes again
                order.append(kind)
            else:
                self.faults[kind] += 1
                self.log.append(
                    {
                        "kind": kind,
                        "detail": detail,
                        "at": began.isoformat(timespec="milliseconds"),
                        "lasted_s": round(self.last_fault_end - started, 2),
                    }
                )

    def _kill(self, name: str) -> None:
        """SIGKILL a platform process; the supervisor starts it again after a drawn pause."""
        process = self._stack.processes[name]
        process.down_until = time.monotonic() + self._rng.uniform(0.5, 3.0)
        process.kill()

    async def kill_platform_process(self) -> str:
        name = self._rng.choice(sorted(self._stack.processes))
        self._kill(name)
        return name

    async def _kill_learner(self, agent: bool) -> str | None:
        candidates = sorted(pid for pid, (_, is_agent) in learner_processes().items() if is_agent is agent)
        if not candidates:
            return None
        pid = self._rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return f"pid {pid}"

    async def kill_learner(self) -> str | None:
        return await self._kill_learner(agent=False)

    async def kill_agent(self) -> str | None:
        return await self._kill_learner(agent=True)

    async def _pause(self, service: Any, seconds: float) -> str:
        service.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            service.resume()
        return f"{seconds:.1f} s"

    async def pause_broker(self) -> str:
        return await self._pause(self._stack.broker, self._rng.uniform(1.0, 6.0))

    async def pause_etcd(self) -> str:
        return await self._pause(self._stack.etcd, self._rng.uniform(0.5, HEARTBEAT_TTL_S * 0.8))

    async def pause_etcd_past_ttl(self) -> str:
        return await self._pause(
            self._stack.etcd, self._rng.uniform(HEARTBEAT_TTL_S + 1, 3 * HEARTBEAT_TTL_S)
        )

    async def restart_etcd(self) -> str:
        await asyncio.to_thread(self._stack.etcd.restart)
        return "SIGTERM and start on the same data"

    async def partition_worker(self) -> str:
        seconds = self._rng.uniform(3.0, 12.0)
        worker = self._stack.cut_worker
        if self._stack.partition.available:
            self._stack.partition.cut()
            try:
                await asyncio.sleep(seconds)
            finally:
                self._stack.partition.heal()
        else:
            worker.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(seconds)
            finally:
                worker.signal(signal.SIGCONT)
        return f"{worker.name} for {seconds:.1f} s ({self.partition_mode})"

    async def kill_api_mid_request(self) -> str:
        """Send a submission to one replica and kill it with SIGKILL while it is being served."""
        replica = self._rng.choice(sorted(self._stack.api_urls))
        process = self._stack.processes[f"api-{replica}"]
        url = self._stack.api_urls[replica]
        request = asyncio.create_task(self._workload.submit(url))
        await asyncio.sleep(self._rng.uniform(0.0, 0.05))
        self._kill(process.name)
        write = await request
        return f"{process.name}, its submission {write.outcome}"


@dataclass
class Run:
    seed: int
    minutes: float
    ledger: Ledger
    faults: dict[str, int]
    fault_log: list[dict[str, Any]]
    partition_mode: str
    report: CheckReport
    durations: dict[str, float]
    crashes: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.report.violations and not self.report.lost_jobs

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "ok": self.ok,
            "jobs_submitted": len(self.ledger.jobs),
            "lost_jobs": self.report.lost_jobs,
            "violations": self.report.violations,
            "faults": dict(sorted(self.faults.items())),
            "fault_kinds": len(self.faults),
            "partition": self.partition_mode,
            "projection_matches_rebuild": self.report.projection_matches_rebuild,
            "final_states": self.report.final_states,
            "writes": self.ledger.counts(),
            "dead_letters": self.report.dead_letters,
            "crashes": self.crashes,
            "durations": self.durations,
            "replay": replay_command(self.seed, self.minutes),
        }


def replay_command(seed: int, minutes: float) -> str:
    return f"python -m bench.nemesis --minutes {minutes:g} --seed {seed}"


async def run_nemesis(minutes: float, seed: int, root: Path) -> Run:
    """Start the stack, run the workload and the nemesis for ``minutes``, settle, check, stop."""
    rng = random.Random(seed)
    stack = Stack(root)
    durations: dict[str, float] = {}
    began = time.monotonic()
    try:
        await asyncio.to_thread(stack.start_services)
        stack.configure()
        stack.start_platform()
        await stack.ready(120)
        durations["start_s"] = round(time.monotonic() - began, 1)
        ledger = Ledger()
        workload = Workload(stack, random.Random(rng.getrandbits(64)), ledger)
        nemesis = Nemesis(stack, random.Random(rng.getrandbits(64)), workload)
        stop = asyncio.Event()
        crashes: Counter[str] = Counter()
        storm = time.monotonic()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(workload.run(stop))
                tasks.create_task(nemesis.run(stop))
                tasks.create_task(supervise(stack, stop, crashes))
                await asyncio.sleep(minutes * 60)
                stop.set()
            durations["faults_s"] = round(time.monotonic() - storm, 1)
            stack.restart_dead()
            await workload.uncordon_all(60)
        finally:
            await workload.close()
        settled_in = await settle(stack, ledger, timeout_s=max(120.0, minutes * 30))
        durations["settle_after_last_fault_s"] = round(time.monotonic() - nemesis.last_fault_end, 1)
        durations["settled"] = settled_in is not None
        checked = time.monotonic()
        report = await check(stack, ledger)
        durations["check_s"] = round(time.monotonic() - checked, 1)
        durations["total_s"] = round(time.monotonic() - began, 1)
        return Run(
            seed,
            minutes,
            ledger,
            dict(nemesis.faults),
            nemesis.log,
            nemesis.partition_mode,
            report,
            durations,
            dict(crashes),
        )
    finally:
        await asyncio.to_thread(stack.stop)


async def supervise(stack: Stack, stop: asyncio.Event, crashes: Counter[str]) -> None:
    """Start again every platform process that is down, as a supervisor would: one the nemesis
    killed once its drawn pause is over, one that died by itself at once (and count it)."""
    while not stop.is_set():
        now = time.monotonic()
        for process in stack.processes.values():
            if not process.alive and now >= process.down_until:
                if process.down_until == 0.0:
                    crashes[process.name] += 1
                process.down_until = 0.0
                process.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def print_table(run: Run) -> None:
    data = run.as_json()
    rows = [
        ("seed", data["seed"]),
        ("minutes", data["minutes"]),
        ("jobs submitted (acknowledged)", data["jobs_submitted"]),
        ("writes", ", ".join(f"{k} {v}" for k, v in data["writes"].items())),
        ("faults", ", ".join(f"{k} {v}" for k, v in data["faults"].items())),
        ("partition by", data["partition"]),
        ("final states", ", ".join(f"{k} {v}" for k, v in data["final_states"].items())),
        ("lost jobs", len(data["lost_jobs"])),
        ("violations", len(data["violations"])),
        ("projection = rebuild", data["projection_matches_rebuild"]),
        ("dead letters", data["dead_letters"]),
        *((f"{k}", v) for k, v in data["durations"].items()),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for violation in data["violations"]:
        print(f"  VIOLATION {violation}")
    for job in data["lost_jobs"]:
        print(f"  LOST {job}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="a directory to keep the run's files in")
    args = parser.parse_args(argv)
    configure_logging(level="warning")  # to stderr: with --json, stdout is the report alone
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    root = args.keep or Path(tempfile.mkdtemp(prefix="ffdl-nemesis-"))
    root.mkdir(parents=True, exist_ok=True)
    run = asyncio.run(run_nemesis(args.minutes, seed, root))
    files = {**run.as_json(), "fault_log": run.fault_log, "write_log": [asdict(w) for w in run.ledger.writes]}
    (root / "nemesis.json").write_text(json.dumps(files, indent=2))
    if args.json:
        print(json.dumps(run.as_json(), indent=2))
    else:
        print_table(run)
    if not run.ok:
        print(
            f"nemesis FAILED with seed {seed}; files in {root}; replay: {replay_command(seed, args.minutes)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
