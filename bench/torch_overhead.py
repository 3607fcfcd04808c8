"""The platform's overhead on a real PyTorch job: the same training run by torchrun and through ffdl.

The training is ``ffdl.examples.torch_ddp.train`` (DDP over gloo on CPUs, ``--steps`` steps, two
processes, a checkpoint every 100 steps, one thread each), run three ways, one after another:

* **torchrun**: ``python -m torch.distributed.run --nproc-per-node 2 -m ffdl.examples.torch_ddp.train``
  as a user runs it on one machine, its wall time from start to exit;
* **ffdl, 2 learners**: the plain script as a 2-learner job (one process each, ffdl's environment
  for ``env://``), submitted over HTTP to a running platform (``ffdl up``, embedded, one process);
* **ffdl, torchrun**: one learner with ``launcher: torchrun`` and ``nproc_per_node: 2``.

For the ffdl runs the wall time runs from the submission to the job's ``COMPLETED`` as the API
reports it (polled every 50 ms), so it holds queueing, the launch, the agents and the stores'
records, the final scans and the results. *Submit to first step* runs from the submission (or the
start of torchrun) to the moment the first ``step 1`` line is in the output (polled every 20 ms).
A one-step torchrun run first, unmeasured, brings torch's files into the page cache for every run
alike. Reported: seconds, and each ffdl run's ratio to torchrun's, from the same script on the
same machine, so the machine's speed cancels out (its load does not: on a shared machine run it
twice).

Run from the repository root (a minute or two; needs the test extra's torch):

    .venv/bin/python -m bench.torch_overhead [--steps 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform as host
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from bench.heartbeat_bench import PlatformProcess
from tests.harness import fast_settings

TRAIN = ["-m", "ffdl.examples.torch_ddp.train"]
FIRST_STEP = "step 1 loss"


def train_args(steps: int) -> list[str]:
    return ["--steps", str(steps), "--log-every", "1", "--checkpoint-every", "100"]


async def poll(
    check: Callable[[], Awaitable[bool] | bool], interval_s: float, timeout_s: float = 600
) -> float:
    """Poll ``check`` until it holds; the monotonic time it was first seen to."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if await result if not isinstance(result, bool) else result:
            return time.monotonic()
        await asyncio.sleep(interval_s)
    raise TimeoutError("the benchmark's job did not get there in time")


async def torchrun(steps: int, work: Path) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHECKPOINT_DIR": str(work / "direct")}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        *TRAIN,
        *train_args(steps),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    first = 0.0
    async for line in process.stdout:
        if not first and line.startswith(FIRST_STEP.encode()):
            first = time.monotonic()
    if await process.wait() != 0:
        raise RuntimeError("torchrun failed")
    return {"wall_s": time.monotonic() - started, "first_step_s": first - started}


async def through_ffdl(platform: PlatformProcess, spec: dict[str, Any]) -> dict[str, float]:
    started = time.monotonic()
    job_id = await platform.submit(yaml.safe_dump(spec))
    log = platform.settings.work_dir / job_id / "logs" / "attempt-1" / "learner-0.log"
    checked = {"at": 0.0}

    async def in_state(state: str) -> bool:
        job: dict[str, Any] = (await platform.http.get(f"/v1/jobs/{job_id}")).json()
        if job["state"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"job {job_id} {job['state']}: {job.get('reason')}")
        return bool(job["state"] == state)

    async def stepped() -> bool:
        if log.exists() and FIRST_STEP in log.read_text():
            return True
        if time.monotonic() - checked["at"] > 1:  # a job that failed never steps
            checked["at"] = time.monotonic()
            await in_state("")
        return False

    first = await poll(stepped, 0.02)
    done = await poll(lambda: in_state("COMPLETED"), 0.05)
    return {"wall_s": done - started, "first_step_s": first - started}


async def measure(steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ffdl-torch-bench-") as tmp:
        work = Path(tmp)
        shims = work / "bin"
        shims.mkdir()
        (shims / "torchrun").write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
        (shims / "torchrun").chmod(0o755)
        os.environ["PATH"] = f"{shims}:{os.environ['PATH']}"
        await torchrun(1, work / "warm-up")  # torch's files into the page cache, for every run alike
        results: dict[str, Any] = {"torchrun": await torchrun(steps, work)}
        # the platform's default heartbeat TTL and grace, not the tests' fast ones: a loaded machine
        # may hold an agent up for longer than a second
        settings = fast_settings(
            work / "ffdl", log_level="warning", heartbeat_ttl_s=5.0, monitor_grace_s=15.0
        )
        command = " ".join([sys.executable, *TRAIN, *train_args(steps)])
        base = {"gpus": 0, "cpus": 1, "progress_timeout_s": 120, "max_restarts": 0, "framework": "pytorch"}
        async with PlatformProcess(settings, work / "platform.log") as platform:
            results["ffdl_2_learners"] = await through_ffdl(
                platform, {"name": "plain", "learners": 2, "command": command, **base}
            )
            torchrun_command = " ".join([*TRAIN, *train_args(steps)])
            results["ffdl_torchrun"] = await through_ffdl(
                platform,
                {
                    **base,
                    "name": "torchrun",
                    "learners": 1,
                    "cpus": 2,
                    "launcher": "torchrun",
                    "nproc_per_node": 2,
                    "command": torchrun_command,
                },
            )
    direct = results["torchrun"]["wall_s"]
    for name in ("ffdl_2_learners", "ffdl_torchrun"):
        results[name]["wall_ratio"] = results[name]["wall_s"] / direct
    return {
        "steps": steps,
        "python": host.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        **results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.steps))
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.steps} steps, 2 processes, CPython {result['python']}, load {result['load_average']}")
    for name in ("torchrun", "ffdl_2_learners", "ffdl_torchrun"):
        row = result[name]
        ratio = f"  x{row['wall_ratio']:.2f} of torchrun" if "wall_ratio" in row else ""
        print(
            f"{name:16} wall {row['wall_s']:6.2f} s  submit->first step {row['first_step_s']:5.2f} s{ratio}"
        )


if __name__ == "__main__":
    main()
