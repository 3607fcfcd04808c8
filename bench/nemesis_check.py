"""The nemesis' checker: once the faults stop and the system settles, what the client was told
must be true of the platform (architecture §5, §11).

- Every acknowledged submission is present, on every API replica.
- Every job is settled (ended, or halted) and consistent: it holds no GPUs and no learner process of
  it lives on; an acknowledged cancel that changed the job ended it CANCELLED.
- ``ffdl verify`` over the exported log is clean (no GPU held by two jobs, no seq gap, no stale
  fencing token accepted), and the log holds no job the client did not submit; ``ffdl verify
  --redecide`` decides every command again with today's deciders and gets the same events.
- Every API replica's projection equals a rebuild from the log.
- Every job's last retained MQTT status equals its state.
- No dead letter but the poison the workload injected on purpose.

The platform is then stopped in order: the writers first (workers, schedulers), then each replica
once its projection has applied the whole log, so that the rebuild compares like with like.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiomqtt
import httpx

from bench.nemesis_stack import ADMIN, REPLICAS, Stack, learner_processes
from ffdl.handlers.messaging import DEAD_LETTER_REASON_HEADER, Topics
from ffdl.tools.sre import rebuild_projections, started_bus
from tests.harness import settings_environment
from tests.services import wait_until_async

if TYPE_CHECKING:
    from bench.nemesis import Ledger

#: States in which a job, once the faults stopped, may stay: it ended, or it was halted.
SETTLED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "HALTED"})
#: Seconds the retained MQTT statuses have to converge on the jobs' states.
MQTT_CONVERGE_S = 30.0


@dataclass
class CheckReport:
    lost_jobs: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    projection_matches_rebuild: bool | None = None
    final_states: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0


async def listed_jobs(
    client: httpx.AsyncClient, url: str, headers: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Every job an admin lists on the replica at ``url``, page after page."""
    jobs: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, "order": "oldest"}
        if cursor:
            params["cursor"] = cursor
        response = await client.get(f"{url}/v1/jobs", params=params, headers=headers)
        response.raise_for_status()
        page = response.json()
        jobs.update({job["job_id"]: job for job in page["jobs"]})
        cursor = page["next_cursor"]
        if cursor is None:
            return jobs


async def caught_up(client: httpx.AsyncClient, url: str) -> bool:
    try:
        response = await client.get(f"{url}/readyz")
    except httpx.TransportError:
        return False
    return response.status_code == 200 and response.json()["behind"] == {}


async def settle(stack: Stack, ledger: Ledger, timeout_s: float) -> float | None:
    """Wait until every replica has applied the whole log and shows every job settled with no
    GPUs held; the seconds it took, or None when it did not happen within ``timeout_s``."""
    began = time.monotonic()
    async with httpx.AsyncClient(timeout=15) as client:
        while time.monotonic() - began < timeout_s:
            try:
                settled = True
                for url in stack.api_urls.values():
                    jobs = await listed_jobs(client, url, stack.auth(ADMIN))
                    settled = settled and await caught_up(client, url) and set(ledger.jobs) <= set(jobs)
                    settled = settled and all(
                        job["state"] in SETTLED and job["placement"] is None for job in jobs.values()
                    )
                if settled:
                    return time.monotonic() - began
            except (httpx.TransportError, httpx.HTTPStatusError):
                pass  # a replica still starting
            await asyncio.sleep(2)
    return None


async def retained_statuses(stack: Stack) -> dict[str, str]:
    """Each job's last retained status on the MQTT broker: job id → state."""
    states: dict[str, str] = {}
    async with aiomqtt.Client(stack.mqtt.host, stack.mqtt.port, identifier=None, timeout=10) as client:
        await client.subscribe("ffdl/+/jobs/+/status", qos=1)
        try:
            async with asyncio.timeout(3):
                async for message in client.messages:
                    if not message.retain:
                        continue
                    job_id = str(message.topic).split("/")[3]
                    payload = (
                        bytes(message.payload) if isinstance(message.payload, (bytes, bytearray)) else b""
                    )
                    if payload:
                        states[job_id] = json.loads(payload)["state"]
                    else:
                        states.pop(job_id, None)
        except TimeoutError:
            pass  # every retained message came at once on subscribing
    return states


def deleted_jobs(log_path: os.PathLike[str]) -> set[str]:
    """The jobs the exported log says were deleted (a DELETE of an ended job deletes it)."""
    deleted = set()
    with open(log_path, encoding="utf-8") as lines:
        for line in lines:
            if '"JobDeleted"' in line:
                deleted.add(json.loads(line)["job_id"])
    return deleted


def ffdl(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``ffdl`` CLI against the platform's log."""
    assert stack.settings is not None
    env = {**os.environ, **settings_environment(stack.settings)}
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


async def check(stack: Stack, ledger: Ledger) -> CheckReport:
    """Every check of the module docstring; stops the platform (not the services) on the way."""
    report = CheckReport()
    async with httpx.AsyncClient(timeout=30) as client:
        states = await _check_replicas(client, stack, ledger, report)
        await _check_mqtt(stack, states[REPLICAS[0]], report)
        # The writers stop first; each replica then applies the whole log and stops.
        await asyncio.to_thread(stack.stop_platform, [n for n in stack.processes if not n.startswith("api-")])
        for replica, url in stack.api_urls.items():
            with contextlib.suppress(TimeoutError):
                await wait_until_async(lambda url=url: caught_up(client, url), 60, interval_s=0.5)
            await asyncio.to_thread(stack.stop_platform, [f"api-{replica}"])
    await _check_log(stack, ledger, states, report)
    matches = True
    for replica, settings in stack.replica_settings.items():
        rebuilt = await rebuild_projections(settings)
        if rebuilt["identical"] is not True:
            matches = False
            report.violations.append(f"api-{replica}'s projection differs from a rebuild from the log")
    report.projection_matches_rebuild = matches
    await _check_dead_letters(stack, ledger, report)
    return report


async def _check_replicas(
    client: httpx.AsyncClient, stack: Stack, ledger: Ledger, report: CheckReport
) -> dict[str, dict[str, str]]:
    """Every job settled, holding no GPUs, with no learner alive, the same on every replica; an
    acknowledged cancel that changed a job ended it CANCELLED. Returns each replica's states."""
    states: dict[str, dict[str, str]] = {}
    for replica, url in stack.api_urls.items():
        jobs = await listed_jobs(client, url, stack.auth(ADMIN))
        states[replica] = {job_id: job["state"] for job_id, job in jobs.items()}
        for job_id, job in jobs.items():
            if job["state"] not in SETTLED:
                report.violations.append(f"{job_id} on api-{replica}: not settled, {job['state']}")
            if job["placement"] is not None:
                report.violations.append(f"{job_id} on api-{replica}: {job['state']} and holds GPUs")
    first = states[REPLICAS[0]]
    for replica in REPLICAS[1:]:
        for job_id in sorted(set(first) | set(states[replica])):
            if first.get(job_id) != states[replica].get(job_id):
                report.violations.append(
                    f"{job_id}: api-{REPLICAS[0]} says {first.get(job_id)}, "
                    f"api-{replica} says {states[replica].get(job_id)}"
                )
    report.final_states = dict(sorted(_count(first.values()).items()))
    for pid, (job_id, agent) in sorted(learner_processes().items()):
        if first.get(job_id) in SETTLED:
            kind = "agent" if agent else "learner"
            report.violations.append(f"{job_id} is {first[job_id]} but its {kind} {pid} lives")
    cancelled = [
        w.job_id for w in ledger.writes if w.action == "cancel" and w.job_id and '"changed":true' in w.detail
    ]
    for job_id in cancelled:
        if first.get(job_id, "CANCELLED") != "CANCELLED":  # absent: deleted, looked at with the log
            report.violations.append(
                f"{job_id}: a cancel that changed it was acknowledged, it ended {first[job_id]}"
            )
    return states


async def _check_log(
    stack: Stack, ledger: Ledger, states: dict[str, dict[str, str]], report: CheckReport
) -> None:
    """Export the log; every acknowledged job on every replica (or deleted on the log); ``ffdl
    verify`` and ``ffdl verify --redecide`` clean; no job on the log that was never submitted."""
    log_path = stack.root / "log.events.jsonl"
    exported = await asyncio.to_thread(ffdl, stack, "export", "--commands", "-o", str(log_path))
    if exported.returncode != 0:
        report.violations.append(f"ffdl export failed: {exported.stderr[-500:]}")
        return
    deleted = deleted_jobs(log_path)
    for job_id in sorted(ledger.jobs):
        if any(job_id not in jobs for jobs in states.values()) and job_id not in deleted:
            report.lost_jobs.append(job_id)
    verified = await asyncio.to_thread(ffdl, stack, "verify", str(log_path), "--json")
    try:
        verdict = json.loads(verified.stdout)
    except ValueError:
        report.violations.append(f"ffdl verify gave no report: {verified.stderr[-500:]}")
    else:
        report.violations += [f"ffdl verify: {json.dumps(v, sort_keys=True)}" for v in verdict["violations"]]
        submitted = sum(1 for w in ledger.writes if w.action == "submit" and w.outcome != "refused")
        if verdict["jobs"] > submitted:
            report.violations.append(
                f"the log holds {verdict['jobs']} jobs, the client submitted {submitted}"
            )
    redecided = await asyncio.to_thread(ffdl, stack, "verify", str(log_path), "--redecide", "--json")
    try:
        divergences = json.loads(redecided.stdout)["divergences"]
    except (ValueError, KeyError):
        report.violations.append(f"ffdl verify --redecide gave no report: {redecided.stderr[-500:]}")
    else:
        if divergences:
            report.violations.append(
                f"ffdl verify --redecide: {divergences} decisions differ (see {log_path})"
            )


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


async def _check_mqtt(stack: Stack, states: dict[str, str], report: CheckReport) -> None:
    """Every job's retained status equals its state, once the notifiers had time to catch up."""
    deadline = time.monotonic() + MQTT_CONVERGE_S
    while True:
        retained = await retained_statuses(stack)
        wrong = {j: (retained.get(j), s) for j, s in states.items() if retained.get(j) != s}
        if not wrong or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    for job_id, (published, state) in sorted(wrong.items()):
        report.violations.append(f"{job_id}: retained MQTT status {published}, state {state}")


async def _check_dead_letters(stack: Stack, ledger: Ledger, report: CheckReport) -> None:
    assert stack.settings is not None
    topic = Topics.with_prefix(stack.settings.topic_prefix).deadletter
    bus = await started_bus(stack.settings.bus_url, stack.settings.partitions, topic)
    try:
        for partition in sorted(await bus.end_offsets(topic)):
            async for record in bus.read(topic, partition):
                report.dead_letters += 1
                if record.value not in ledger.poison:
                    reason = dict(record.headers).get(DEAD_LETTER_REASON_HEADER, b"").decode(errors="replace")
                    report.violations.append(f"dead letter not injected: {reason} {record.value[:120]!r}")
    finally:
        await bus.close()
