"""Status API under load: 100,000 jobs in the projections, reads by ``wrk`` and an open-loop client, SSE.

    python bench/api_bench.py [--jobs 100000] [--seconds 10] [--connections 1,2,4,16,64] [--rate 500]
                              [--followers 500] [--api-workers N]

Needs ``wrk`` on the PATH (``apt-get install -y wrk``).

1. Projects ``--jobs`` jobs (submitted, admitted, queued; half of them scheduled), copies of event
   histories the real decider made, into the projection file of a fresh data directory, and
   creates one admin tenant: every request carries its bearer token, as a deployed API needs.
2. Starts the API as users deploy it for reads, ``ffdl up --roles api`` in a process of its own
   (the read role alone: it serves from the projection file and needs only the bus to exist), with
   ffdl's default number of API worker processes (one per usable CPU) or ``--api-workers``
   (``FFDL_API_WORKERS``); the figures' server CPU is that of the process and its workers.
   The request mix everywhere is 70 % ``GET /v1/jobs/{id}`` over random ids and 30 % list pages
   (``limit=50``, a state filter and a cursor collected beforehand by walking pages).

   * ``wrk`` (C, epoll) drives it closed-loop, after an uncounted warm-up run, at each
     ``--connections`` count: each connection sends its next request when the previous answer
     arrived. One wrk thread per connection, so that its Lua script can time GETs and list pages
     apart. Reports requests/s, p50/p99 per kind, and the CPU used by the server and by wrk.
     Closed loop hides queueing (coordinated omission): a slow answer delays the requests behind
     it instead of making them wait, so these latencies are what N busy clients see, not what
     requests arriving at that rate would see.
   * A Python client (asyncio, keep-alive HTTP/1.1 written by hand: httpx, used before 2026-12-03,
     ran out of CPU at about 150 requests/s) open-loop at ``--rate``: requests are sent on a fixed
     schedule, each on an idle connection or a new one, so a slow server cannot slow the load down
     and hide its own latency. Reports the achieved rate, p50/p99 per kind and errors.
3. Stops it and starts ``ffdl up`` with every role (the earlier runs' set-up): the same open-loop
   client as the baseline, then one busy job (8 learners reporting progress) followed by
   ``--followers`` SSE streams (the caps on open streams raised to admit them all; any refused
   are counted), each on a connection of its own read by the same hand-written client; reports
   the delivery lag (receipt time - the event's ``occurred_at``) past the backlog replayed at
   connect, and the CPU of the server and of the client meanwhile.

The benchmark runs one server at a time and nothing else while it measures; each result line
carries the server's and the load generator's CPU (cores busy) so that a load generator that
competes with the server for the machine's cores shows, and the CPU the hypervisor gave to other
guests meanwhile (``steal``: on a shared virtual machine the same run's rate varies with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx

from ffdl.adapters.tenants import TenantRegistry
from ffdl.core.decider import decide
from ffdl.core.job import Job, evolve
from ffdl.events import job_commands as cmd
from ffdl.events.envelope import Command, CommandData, Event
from ffdl.events.model import JobSpec, LearnerPlacement, Placement
from ffdl.projections.store import LoggedEvent, Projection, rebuild

#: A pre-built job's id (printf format of its index); the wrk script builds GET paths with it too.
JOB_ID = "bench-%06d"
LEARNER = Path(__file__).resolve().parents[1] / "tests" / "learners" / "counting.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The pre-built histories' log partition: one the bus never has (at most 1,024 partitions), so the
#: projector's skip of already-applied offsets never drops the events of jobs submitted during the run.
PREBUILT_PARTITION = 1024
#: List pages walked per state filter to collect the cursors the list requests use.
LIST_PAGES_PER_STATE = 100
GET_P99_TARGET_MS = 20.0
LIST_P99_TARGET_MS = 50.0
#: Connections of the uncounted wrk run first (``--seconds`` long), so no counted run pays the start.
WARM_UP_CONNECTIONS = 2

WRK_SCRIPT = """
-- 70 % GETs of random jobs, 30 % list pages. Arguments: the number of jobs, the printf format of a
-- job's path, and the file of list-page paths (one a line). init() must stay cheap: wrk runs the
-- threads' init() one after another, starts each thread at once after its own, and starts its clock
-- after the last, so a slow init() would count early threads' requests against a shorter run.
-- One connection per thread, so a thread's responses answer its requests in order: each is timed
-- by kind, from request() (just before wrk writes it) to response().
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clock, bench_timespec *now);
]]
local CLOCK_MONOTONIC, now = 1, ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, now)
  return tonumber(now.tv_sec) * 1000 + tonumber(now.tv_nsec) / 1e6
end

local threads, jobs, job_path, lists, kind, sent_at = {}, 0, nil, {}, nil, nil
get_ms, list_ms = {}, {}  -- globals: done() reads them from each thread

function setup(thread)
  threads[#threads + 1] = thread
  thread:set("thread_index", #threads)
end

function init(args)
  jobs, job_path = tonumber(args[1]), args[2]
  for line in io.lines(args[3]) do lists[#lists + 1] = line end
  math.randomseed(os.time() * 1000 + thread_index)
end

function request()
  sent_at = now_ms()
  if math.random() < 0.7 then
    kind = get_ms
    return wrk.format("GET", string.format(job_path, math.random(0, jobs - 1)))
  end
  kind = list_ms
  return wrk.format("GET", lists[math.random(#lists)])
end

function response(status, headers, body)
  if status == 200 then kind[#kind + 1] = now_ms() - sent_at end
end

local function collected(name)
  local texts = {}
  for _, thread in ipairs(threads) do
    for _, ms in ipairs(thread:get(name)) do texts[#texts + 1] = string.format("%.3f", ms) end
  end
  return table.concat(texts, ",")
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "max_us": %d, "get_ms": [%s], "list_ms": [%s]}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max, collected("get_ms"), collected("list_ms")))
end
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def server_processes(pid: int) -> Iterator[tuple[int, list[str]]]:
    """``ffdl up`` process ``pid`` and its API workers (not its learners), each with the fields of its
    ``/proc/PID/stat`` after the command name (state, ppid, ...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(entry.name) == pid or (
                int(fields[1]) == pid and b"ffdl.cli.api_worker" in (entry / "cmdline").read_bytes()
            ):
                yield int(entry.name), fields
        except OSError:  # gone meanwhile
            continue


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time so far of ``ffdl up`` process ``pid`` and its living API workers
    (fields 14 and 15 of ``/proc/PID/stat``)."""
    return sum(int(fields[11]) + int(fields[12]) for _, fields in server_processes(pid)) / CLOCK_TICKS


def api_processes(pid: int) -> int:
    """How many processes serve the API of ``ffdl up`` process ``pid``: its API workers, or itself."""
    return sum(1 for worker, _ in server_processes(pid) if worker != pid) or 1


def stolen_seconds() -> float:
    """CPU time the hypervisor gave to other guests so far, all CPUs (``steal`` in ``/proc/stat``)."""
    return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[8]) / CLOCK_TICKS


def template_events(variant: int) -> list[Event]:
    """One job's events through the real decider: queued (even) or scheduled (odd variant)."""
    now = datetime.now(UTC)
    spec = JobSpec(name="bench", command="true", learners=2, gpus=1)
    steps: list[CommandData] = [cmd.SubmitJob(spec=spec), cmd.AdmitJob()]
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
        job_id = JOB_ID % index
        ids.append(job_id)
        changes = {"job_id": job_id, "tenant": f"tenant-{index % 5}"}
        for event in templates[index % 2]:
            copy = event.model_copy(update={**changes, "event_id": uuid.uuid4()})
            logged.append(LoggedEvent(copy, PREBUILT_PARTITION, len(logged)))
    projection = Projection(path)
    rebuild(projection, logged, batch_size=20_000)
    projection.close()
    return ids


def list_paths(api: str, headers: dict[str, str]) -> list[str]:
    """List-page paths (both state filters, first page and cursors) found by walking the pages."""
    paths = []
    with httpx.Client(base_url=api, headers=headers, timeout=10) as client:
        for state in ("QUEUED", "SCHEDULED"):
            path = f"/v1/jobs?limit=50&state={state}"
            for _ in range(LIST_PAGES_PER_STATE):
                paths.append(path)
                response = client.get(path)
                response.raise_for_status()
                cursor = response.json()["next_cursor"]
                if cursor is None:
                    break
                path = f"/v1/jobs?limit=50&state={state}&cursor={quote(cursor, safe='')}"
    return paths


def run_wrk(
    api: str,
    token: str,
    script: Path,
    jobs: int,
    list_file: Path,
    connections: int,
    seconds: float,
    server: int,
) -> dict[str, float]:
    """One closed-loop wrk run (``connections`` connections, one thread each), with the CPU it cost."""
    command = [
        "wrk",
        f"--threads={connections}",
        f"--connections={connections}",
        f"--duration={seconds:g}s",
        "--timeout=10s",
        f"--header=Authorization: Bearer {token}",
        f"--script={script}",
        api,
        "--",
        str(jobs),
        f"/v1/jobs/{JOB_ID}",
        str(list_file),
    ]
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before, stolen_before, started = cpu_seconds(server), stolen_seconds(), time.perf_counter()
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    server_used, stolen = cpu_seconds(server) - server_before, stolen_seconds() - stolen_before
    window = time.perf_counter() - started  # the CPU figures' span: wrk's start and end included
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_used = sum(
        getattr(children_after, field) - getattr(children_before, field) for field in ("ru_utime", "ru_stime")
    )
    summary = json.loads(output.strip().splitlines()[-1])
    elapsed = summary["duration_us"] / 1e6
    return {
        "connections": connections,
        "requests": summary["requests"],
        "rate_per_s": round(summary["requests"] / elapsed, 1),
        "errors": summary["non_2xx"] + summary["socket_errors"],
        "p50_ms": round(summary["p50_us"] / 1000, 2),
        "p99_ms": round(summary["p99_us"] / 1000, 2),
        "max_ms": round(summary["max_us"] / 1000, 2),
        "get_p50_ms": round(percentile(summary["get_ms"], 0.5), 2),
        "get_p99_ms": round(percentile(summary["get_ms"], 0.99), 2),
        "list_p50_ms": round(percentile(summary["list_ms"], 0.5), 2),
        "list_p99_ms": round(percentile(summary["list_ms"], 0.99), 2),
        "server_cores": round(server_used / window, 2),
        "wrk_cores": round(wrk_used / window, 2),
        "stolen_cores": round(stolen / window, 2),
    }


class Connection:
    """One keep-alive HTTP/1.1 connection of the Python load generators, written and read by hand: a
    general client (httpx) costs the generator more CPU per request than the API costs the server,
    so the generator, not the server, would set the figures."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        self._reader, self._writer, self._head = reader, writer, head

    @classmethod
    async def open(cls, api: str, token: str) -> Connection:
        address = httpx.URL(api)
        reader, writer = await asyncio.open_connection(address.host, address.port)
        head = f"Host: {address.host}\r\nAuthorization: Bearer {token}\r\n".encode()
        return cls(reader, writer, head)

    async def request(self, path: str) -> int:
        """``GET path``: its status once the whole answer has been read (not a streamed one)."""
        self._writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\n" + self._head + b"\r\n")
        status, length = await self._head_of_answer()
        await self._reader.readexactly(length)
        return status

    async def stream(self, path: str) -> AsyncIterator[bytes]:
        """``GET path`` answered by a stream: its lines as they come (200 only; chunk sizes included:
        a Server-Sent Event never starts like one)."""
        self._writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\n" + self._head + b"\r\n")
        status, _ = await self._head_of_answer()
        if status != 200:
            raise ConnectionRefusedError(f"answered {status}")
        while line := await self._reader.readline():
            yield line

    async def _head_of_answer(self) -> tuple[int, int]:
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionResetError("closed by the server")
        status = int(status_line.split()[1])
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, length

    def close(self) -> None:
        self._writer.close()


async def drive_load(
    api: str, token: str, gets: list[str], lists: list[str], rate: float, seconds: float, server: int
) -> dict[str, object]:
    """The open-loop client: ``rate`` requests/s on a fixed schedule, whatever the answers' latency;
    each request goes on an idle keep-alive connection, or on a new one if none is idle."""
    latencies: dict[str, list[float]] = {"get": [], "list": []}
    errors = 0
    idle: list[Connection] = []
    opened: list[Connection] = []

    async def one(kind: str, path: str) -> None:
        nonlocal errors
        started = time.perf_counter()
        connection = idle.pop() if idle else None
        try:
            if connection is not None:
                try:
                    status = await asyncio.wait_for(connection.request(path), 10)
                except ConnectionResetError:  # closed while idle (the server's keep-alive timeout)
                    connection.close()
                    connection = None
            if connection is None:  # the time to connect counts in the request's latency
                connection = await Connection.open(api, token)
                opened.append(connection)
                status = await asyncio.wait_for(connection.request(path), 10)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            errors += 1
            return
        idle.append(connection)
        if status != 200:
            errors += 1
            return
        latencies[kind].append((time.perf_counter() - started) * 1000)

    tasks = []
    server_before, client_before, stolen_before = cpu_seconds(server), time.process_time(), stolen_seconds()
    start = time.perf_counter()
    total = int(rate * seconds)
    for index in range(total):
        # always yield, so requests already sent make progress while the schedule is behind
        await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
        kind = "get" if random.random() < 0.7 else "list"
        tasks.append(asyncio.create_task(one(kind, random.choice(gets if kind == "get" else lists))))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    server_used, client_used = cpu_seconds(server) - server_before, time.process_time() - client_before
    stolen = stolen_seconds() - stolen_before
    for connection in opened:
        connection.close()
    return {
        "requests": total,
        "achieved_rate": round(total / elapsed, 1),
        "errors": errors,
        "connections": len(opened),
        "get_p50_ms": round(percentile(latencies["get"], 0.5), 2),
        "get_p99_ms": round(percentile(latencies["get"], 0.99), 2),
        "list_p50_ms": round(percentile(latencies["list"], 0.5), 2),
        "list_p99_ms": round(percentile(latencies["list"], 0.99), 2),
        "server_cores": round(server_used / elapsed, 2),
        "client_cores": round(client_used / elapsed, 2),
        "stolen_cores": round(stolen / elapsed, 2),
    }


async def fan_out(api: str, token: str, followers: int, seconds: float, server: int) -> dict[str, object]:
    command = f"{sys.executable} {LEARNER} --steps 100000 --delay 0.01"
    manifest = f"name: busy\nlearners: 8\ngpus: 0\ncpus: 0.1\nmemory_mb: 64\ncommand: {command}\n"
    lags: list[float] = []
    received = 0
    refused = 0
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=60) as client:
        job_id = (await client.post("/v1/jobs", content=manifest)).json()["job_id"]
        deadline = time.monotonic() + seconds

        async def follow() -> None:
            nonlocal received, refused
            connection = await Connection.open(api, token)
            try:
                async for line in connection.stream(f"/v1/jobs/{job_id}/events?follow=true"):
                    if line.startswith(b"data: "):
                        event = json.loads(line[6:])
                        lag = time.time() - datetime.fromisoformat(event["occurred_at"]).timestamp()
                        if event["seq"] > 10:  # the backlog replayed at connect time is not delivery lag
                            lags.append(lag * 1000)
                        received += 1
                    if time.monotonic() > deadline:
                        return
            except ConnectionRefusedError:
                refused += 1
            finally:
                connection.close()

        server_before, client_before, started = cpu_seconds(server), time.process_time(), time.perf_counter()
        await asyncio.gather(*(follow() for _ in range(followers)), return_exceptions=True)
        elapsed = time.perf_counter() - started
        server_used, client_used = cpu_seconds(server) - server_before, time.process_time() - client_before
        await client.delete(f"/v1/jobs/{job_id}")
    return {
        "followers": followers,
        "followers_refused": refused,
        "events_delivered": received,
        "lag_p50_ms": round(percentile(lags, 0.5), 1),
        "lag_p99_ms": round(percentile(lags, 0.99), 1),
        "server_cores": round(server_used / elapsed, 2),
        "client_cores": round(client_used / elapsed, 2),
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


@contextmanager
def running_platform(env: dict[str, str], roles: str | None) -> Iterator[int]:
    """``ffdl up`` (``--roles roles``, or every role) in a child process for the block; yields its pid."""
    command = [sys.executable, "-m", "ffdl.cli", "up", *(["--roles", roles] if roles else [])]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(env["FFDL_API"])
        yield server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def emit(name: str, result: object) -> None:
    print(json.dumps({name: result}), flush=True)


def measure(args: argparse.Namespace, data_dir: Path) -> None:
    started = time.perf_counter()
    ids = build_projection(data_dir / "projections.sqlite", args.jobs)
    token = TenantRegistry(data_dir / "tenants.json").add("bench", admin=True)
    emit("setup", {"jobs": args.jobs, "projected_s": round(time.perf_counter() - started, 1)})
    emit("machine", {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]})
    stream_cap = args.followers * max(args.api_workers or 0, os.cpu_count() or 1)
    port = 18000 + os.getpid() % 1000
    api = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "FFDL_DATA_DIR": str(data_dir),
        "FFDL_API": api,
        "FFDL_LOG_LEVEL": "warning",
        "FFDL_NODES": '[{"name": "node", "gpus": 0, "cpus": 64}]',
        # every follower admitted (the default caps, 256 in all and 16 a tenant, would refuse most),
        # however the connections spread over the API processes (each admits its share of a cap)
        "FFDL_MAX_FOLLOWERS": str(stream_cap),
        "FFDL_MAX_FOLLOWERS_PER_TENANT": str(stream_cap),
    }
    if args.api_workers is not None:
        env["FFDL_API_WORKERS"] = str(args.api_workers)

    gets = [f"/v1/jobs/{job_id}" for job_id in ids]
    list_file, script = data_dir / "lists.txt", data_dir / "mix.lua"
    script.write_text(WRK_SCRIPT)
    with running_platform(env, "api") as server:
        emit("api_processes", api_processes(server))
        lists = list_paths(api, {"Authorization": f"Bearer {token}"})
        list_file.write_text("\n".join(lists) + "\n")
        warm_up = run_wrk(api, token, script, args.jobs, list_file, WARM_UP_CONNECTIONS, args.seconds, server)
        emit("wrk_warm_up_not_counted", warm_up)
        rows = []
        for connections in (int(count) for count in args.connections.split(",")):
            rows.append(run_wrk(api, token, script, args.jobs, list_file, connections, args.seconds, server))
            emit("wrk_api_only", rows[-1])
        meeting = [
            row
            for row in rows
            if row["get_p99_ms"] < GET_P99_TARGET_MS and row["list_p99_ms"] < LIST_P99_TARGET_MS
        ]
        best = max(meeting, key=lambda row: row["rate_per_s"], default=None)
        emit("wrk_best_meeting_p99_targets", best)
        load = asyncio.run(drive_load(api, token, gets, lists, args.rate, args.seconds, server))
        emit("open_loop_api_only", load)
    with running_platform(env, None) as server:
        load = asyncio.run(drive_load(api, token, gets, lists, args.rate, args.seconds, server))
        emit("open_loop_all_roles", load)
        emit("sse_all_roles", asyncio.run(fan_out(api, token, args.followers, args.seconds, server)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10, help="of each load run and of the SSE run")
    parser.add_argument("--connections", default="1,2,4,16,64", help="wrk connection counts, comma-separated")
    parser.add_argument("--rate", type=float, default=500, help="of the open-loop client, requests/s")
    parser.add_argument("--followers", type=int, default=500)
    parser.add_argument(
        "--api-workers", type=int, default=None, help="API processes (FFDL_API_WORKERS); default: ffdl's own"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("wrk is not on the PATH: apt-get install -y wrk")
    with tempfile.TemporaryDirectory(prefix="ffdl-api-bench-") as data_dir:
        measure(args, Path(data_dir))


if __name__ == "__main__":
    main()
