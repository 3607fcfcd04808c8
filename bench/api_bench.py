"""Status API under load: 100,000 jobs in the projections, 500 requests/s, and SSE fan-out.

    python bench/api_bench.py [--jobs 100000] [--rate 500] [--seconds 20] [--followers 500]

1. Projects 100,000 jobs (submitted, admitted, queued; half of them scheduled), copies of
   event histories the real decider made, into the projection file of a fresh data directory.
2. Starts ``ffdl up`` (all roles) on it in a child process, and drives it with an open-loop
   client (requests are sent on a fixed schedule, so a slow server cannot slow the load down and
   hide its own latency): 70 % ``GET /v1/jobs/{id}``, 30 % list pages (``limit=50``, a state
   filter and a cursor). Reports p50/p99 per kind and errors.
3. Submits one busy job (8 learners reporting progress) and opens ``--followers`` SSE streams
   on its events; reports the delivery lag (receipt time - the event's ``occurred_at``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.events import commands as cmd
from ffdl.events.envelope import Command, Event
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.projections.store import LoggedEvent, Projection, rebuild

LEARNER = Path(__file__).resolve().parents[1] / "tests" / "learners" / "counting.py"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def template_events(variant: int) -> list[Event]:
    """One job's events through the real decider: queued (even) or scheduled (odd variant)."""
    now = datetime.now(UTC)
    spec = JobSpec(name="bench", command="true", learners=2, gpus=1)
    steps: list[cmd.CommandData] = [cmd.SubmitJob(spec=spec), cmd.AdmitJob()]
    if variant % 2:
        learners = tuple(LearnerPlacement(rank=r, node="n0", gpus=(r,)) for r in range(2))
        steps.append(cmd.AllocateGpus(placement=Placement(learners=learners)))
    job: Job | None = None
    events: list[Event] = []
    for data in steps:
        command = Command(
            command_id=uuid.uuid4(), job_id="template", tenant="t", issued_at=now, producer="bench", data=data
        )
        for event in decide(job, command, now):
            job = evolve(job, event)
            events.append(event)
    return events


def build_projection(path: Path, jobs: int) -> list[str]:
    """Project ``jobs`` jobs (copies of decider-made templates, 5 tenants) into ``path``; returns ids."""
    templates = [template_events(0), template_events(1)]
    ids = []
    logged: list[LoggedEvent] = []
    for index in range(jobs):
        job_id = f"bench-{index:06d}"
        ids.append(job_id)
        changes = {"job_id": job_id, "tenant": f"tenant-{index % 5}"}
        for event in templates[index % 2]:
            copy = event.model_copy(update={**changes, "event_id": uuid.uuid4()})
            logged.append(LoggedEvent(copy, 0, len(logged)))
    projection = Projection(path)
    rebuild(projection, logged, batch_size=20_000)
    projection.close()
    return ids


async def drive_load(api: str, ids: list[str], rate: float, seconds: float) -> dict[str, object]:
    latencies: dict[str, list[float]] = {"get": [], "list": []}
    errors = 0
    cursors = [None]
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=api, timeout=10, limits=limits) as client:

        async def one(kind: str) -> None:
            nonlocal errors
            started = time.perf_counter()
            try:
                if kind == "get":
                    response = await client.get(f"/v1/jobs/{random.choice(ids)}")
                else:
                    params: dict[str, object] = {"limit": 50, "state": random.choice(["QUEUED", "SCHEDULED"])}
                    cursor = random.choice(cursors)
                    if cursor:
                        params["cursor"] = cursor
                    response = await client.get("/v1/jobs", params=params)
                    if response.status_code == 200 and len(cursors) < 200:
                        cursors.append(response.json()["next_cursor"])
                if response.status_code != 200:
                    errors += 1
                    return
            except httpx.HTTPError:
                errors += 1
                return
            latencies[kind].append((time.perf_counter() - started) * 1000)

        tasks = []
        start = time.perf_counter()
        total = int(rate * seconds)
        for index in range(total):
            # always yield, so requests already sent make progress while the schedule is behind
            await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one("get" if random.random() < 0.7 else "list")))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return {
        "requests": total,
        "achieved_rate": round(total / elapsed, 1),
        "errors": errors,
        "get_p50_ms": round(percentile(latencies["get"], 0.5), 2),
        "get_p99_ms": round(percentile(latencies["get"], 0.99), 2),
        "list_p50_ms": round(percentile(latencies["list"], 0.5), 2),
        "list_p99_ms": round(percentile(latencies["list"], 0.99), 2),
    }


async def fan_out(api: str, followers: int, seconds: float) -> dict[str, object]:
    command = f"{sys.executable} {LEARNER} --steps 100000 --delay 0.01"
    manifest = f"name: busy\nlearners: 8\ngpus: 0\ncpus: 0.1\nmemory_mb: 64\ncommand: {command}\n"
    lags: list[float] = []
    received = 0
    limits = httpx.Limits(max_connections=followers + 10)
    async with httpx.AsyncClient(base_url=api, timeout=60, limits=limits) as client:
        job_id = (await client.post("/v1/jobs", content=manifest)).json()["job_id"]
        deadline = time.monotonic() + seconds

        async def follow() -> None:
            nonlocal received
            async with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true"}) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        lag = time.time() - datetime.fromisoformat(event["occurred_at"]).timestamp()
                        if event["seq"] > 10:  # the backlog replayed at connect time is not delivery lag
                            lags.append(lag * 1000)
                        received += 1
                    if time.monotonic() > deadline:
                        return

        await asyncio.gather(*(follow() for _ in range(followers)), return_exceptions=True)
        await client.delete(f"/v1/jobs/{job_id}")
    return {
        "followers": followers,
        "events_delivered": received,
        "lag_p50_ms": round(percentile(lags, 0.5), 1),
        "lag_p99_ms": round(percentile(lags, 0.99), 1),
    }


def wait_up(api: str) -> None:
    for _ in range(300):
        try:
            if httpx.get(f"{api}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the platform did not come up")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--followers", type=int, default=500)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="ffdl-api-bench-"))
    started = time.perf_counter()
    ids = build_projection(data_dir / "projections.sqlite", args.jobs)
    print(f"projected {args.jobs} jobs in {time.perf_counter() - started:.1f}s", flush=True)
    port = 18000 + os.getpid() % 1000
    api = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "FFDL_DATA_DIR": str(data_dir),
        "FFDL_API": api,
        "FFDL_LOG_LEVEL": "warning",
        "FFDL_NODES": '[{"name": "node", "gpus": 0, "cpus": 64}]',
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "ffdl.adapters.cli", "up"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_up(api)
        load = asyncio.run(drive_load(api, ids, args.rate, args.seconds))
        print(json.dumps({"load": load}), flush=True)
        fan = asyncio.run(fan_out(api, args.followers, args.seconds))
        print(json.dumps({"sse": fan}), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


if __name__ == "__main__":
    main()
