"""``ffdl demo``: the whole platform in one process carrying a real 2-learner training job to COMPLETED.

It starts the platform on embedded backends in a fresh directory, serves the API on a free port,
submits the digits example (data-parallel softmax regression on scikit-learn's digits), shows a
progress bar per learner, kills one learner with SIGKILL partway (unless ``--no-chaos``), and
waits while the platform notices, restarts the gang from the last checkpoint and completes the
job. Then it prints the accuracy, the timeline and the invariant check of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ffdl.cli.render import console, styled, timeline_table
from ffdl.cli.serve import api_server
from ffdl.core.states import JobState
from ffdl.tools.sre import verify_log
from ffdl.wiring.config import Settings
from ffdl.wiring.logging import configure_logging
from ffdl.wiring.platform import Platform

DEMO_TIMEOUT_S = 110.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_manifest(steps: int) -> str:
    command = f"{sys.executable} -m ffdl.examples.digits.train --steps {steps} --step-delay 0.05"
    return (
        "name: digits-demo\nlearners: 2\ngpus: 1\ncpus: 1\nmemory_mb: 512\n"
        f"command: {command}\nmax_restarts: 3\nprogress_timeout_s: 30\nlabels: {{demo: 'true'}}\n"
    )


async def run_demo(*, chaos: bool, steps: int, keep: bool, linger_s: float = 0.0) -> int:
    """Run the demo job to its end; the API and dashboard stay up ``linger_s`` more seconds so that a
    person (or a browser) watching the job sees its final state before the platform stops."""
    data_dir = Path(tempfile.mkdtemp(prefix="ffdl-demo-"))
    log_file = data_dir / "platform.log"
    with log_file.open("w") as log_stream:
        configure_logging("json", "info", log_stream)
        port = _free_port()
        settings = Settings(
            data_dir=data_dir,
            api=f"http://127.0.0.1:{port}",
            heartbeat_ttl_s=2.0,
            monitor_grace_s=6.0,
            stop_grace_s=5.0,
            restart_backoff_base_s=0.5,
        )
        console.print(f"ffdl demo: platform data in {data_dir} (log: {log_file})")
        console.print(
            "ffdl demo: the API runs OPEN on the loopback interface (no tenants: every caller is admin)"
        )
        started = time.monotonic()
        async with Platform(settings) as platform:
            server = api_server(platform, settings.api, open_api=True)
            serving = asyncio.create_task(server.serve())
            try:
                job = await asyncio.wait_for(_drive(settings, steps, chaos), DEMO_TIMEOUT_S)
                if linger_s > 0:
                    console.print(f"the dashboard stays up {linger_s:.0f} s more: {settings.api}/")
                    await asyncio.sleep(linger_s)
            finally:
                server.should_exit = True
                await serving
        elapsed = time.monotonic() - started
        report = await verify_log(settings)
    console.print(timeline_table(job))
    accuracy = job["result"]["metrics"].get("accuracy") if job.get("result") else None
    console.print(
        f"job {job['job_id']} ended {styled(job['state'])} after {job['restarts']} restart(s) "
        f"in {elapsed:.1f}s; final test accuracy: {accuracy if accuracy is None else f'{accuracy:.3f}'}"
    )
    console.print(f"ffdl verify: {report['events']} events, {len(report['violations'])} violation(s)")
    for line in keep_looking(settings.api, data_dir, job["job_id"], keep=keep):
        console.print(line, soft_wrap=True, highlight=False)
    if not keep:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(settings.work_dir, ignore_errors=True)
    return 0 if job["state"] == "COMPLETED" and not report["violations"] else 1


def keep_looking(api: str, data_dir: Path, job_id: str, *, keep: bool) -> list[str]:
    """What the demo says last: its platform has stopped (the dashboard address it printed is closed)
    and how to keep looking at the job."""
    lines = [f"the demo's platform has stopped: {api}/ is closed now. To keep looking:"]
    if keep:
        lines += [
            f"  FFDL_DATA_DIR={data_dir} ffdl up --open     serves this log and its dashboard again "
            "(http://127.0.0.1:8080/)",
            f"  FFDL_DATA_DIR={data_dir} ffdl replay --job {job_id}     the job's timeline from the log",
        ]
    else:
        lines.append(
            "  ffdl demo --keep       keeps the log, to serve it again with `ffdl up --open` or replay it"
        )
    lines.append("  ffdl demo --linger 300     keeps the dashboard up 5 minutes after the job ends")
    return lines


async def _wait_ready(client: httpx.AsyncClient) -> None:
    for _ in range(200):
        try:
            if (await client.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the API did not come up")


def kill_tree(pid: int) -> None:
    """SIGKILL a learner's command and every process below it: its command runs under a shell, and
    killing the shell alone would leave the training running (and reporting) as an orphan."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    tree, found = [pid], 0
    while found < len(tree):
        tree += children.get(tree[found], [])
        found += 1
    for member in reversed(tree):  # the deepest first: none of them outlives its parent to go on
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    # a signal is delivered, not done, when kill returns: a write under way may still land (a last
    # report); the step the demo prints is read once every one of them has died
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_running(member) for member in tree) and time.monotonic() < deadline:
        time.sleep(0.01)


#: How long ``kill_tree`` waits for the killed processes to die.
KILL_WAIT_S = 5.0


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has died: it only waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


#: How long the demo waits for a killed learner's agent to write down where its learner ended.
EXIT_LINE_WAIT_S = 5.0

_EXIT_LINE = re.compile(r"learner exited\b.*\bstep=(\d+)")


def reported_step(settings: Settings, job_id: str, attempt: int, rank: int) -> int | None:
    """The last step a learner reported, as its agent logged it when the learner ended: the agent
    holds the learner's report channel, so its word is the learner's last report, while the
    platform's record of it lags by the heartbeats' and the projection's delays."""
    job_dir = settings.job_dir(job_id)
    if job_dir is None:
        return None
    path = job_dir / "logs" / f"attempt-{attempt}" / f"agent-{rank}.log"
    deadline = time.monotonic() + EXIT_LINE_WAIT_S
    while True:
        try:
            found = _EXIT_LINE.findall(path.read_text(errors="replace"))
        except OSError:
            found = []
        if found or time.monotonic() >= deadline:
            return int(found[-1]) if found else None
        time.sleep(0.05)


async def _drive(settings: Settings, steps: int, chaos: bool) -> dict[str, Any]:
    api = settings.api
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        await _wait_ready(client)
        response = await client.post(
            "/v1/jobs", content=demo_manifest(steps), headers={"Content-Type": "application/yaml"}
        )
        response.raise_for_status()
        job_id = response.json()["job_id"]
        console.print(f"submitted {job_id}: 2 learners x 1 GPU, {steps} steps")
        console.print(f"watch it in the dashboard: {api}/#/jobs/{job_id}")
        killed = not chaos
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            bars = [
                progress.add_task(f"learner {rank}", total=steps, info="", count=f"0/{steps}")
                for rank in range(2)
            ]
            # the job's row counts nothing: it shows the state and the attempt
            state = progress.add_task("job", total=None, info="", count="")
            told = launches = 0  # the job's history entries looked at so far; its launches among them
            while True:
                job = (await client.get(f"/v1/jobs/{job_id}")).json()
                progress.update(state, info=f"{job['state']} attempt {job['attempt']}")
                for entry in job["history"][told:]:  # what the platform noticed, and where it goes on from
                    launches += entry["state"] == "LAUNCHING"
                    if entry["state"] == "RESTARTING" or (entry["state"] == "LAUNCHING" and launches > 1):
                        progress.console.print(f"[magenta]platform:[/] {entry['state']}: {entry['reason']}")
                told = len(job["history"])
                for rank, learner in enumerate(job["learners"]):
                    loss = learner["metrics"].get("loss")
                    info = f"{learner['status']} loss {loss:.3f}" if loss is not None else learner["status"]
                    step = learner["step"]
                    progress.update(bars[rank], completed=step, info=info, count=f"{step}/{steps}")
                if JobState(job["state"]).terminal and job["placement"] is None:
                    return dict(job)
                victim = job["learners"][1]
                if (
                    not killed
                    and job["state"] == "RUNNING"
                    and victim["step"] >= steps // 3
                    and victim["pid"]
                ):
                    kill_tree(victim["pid"])
                    killed = True
                    step = reported_step(settings, job_id, job["attempt"], 1)
                    at = f"at step {step}" if step is not None else f"past step {victim['step']}"
                    progress.console.print(
                        f"[magenta]chaos:[/] killed learner 1 (pid {victim['pid']}) {at} with SIGKILL"
                    )
                await asyncio.sleep(0.3)
