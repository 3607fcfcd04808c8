"""A 2-learner NCCL DDP job through ffdl on a machine with NVIDIA GPUs (not part of the suite).

The platform runs as one ``ffdl up`` process with no configured nodes, so its inventory is this
machine as the local discovery finds it (``nvidia-smi``: its GPUs and their type). The job is the
PyTorch example (``ffdl.examples.torch_ddp``, which picks NCCL when CUDA is there) with one GPU per
learner and as many learners as there are GPUs, at most two (one on a one-GPU machine: NCCL with a
world of one). Each learner first prints what it sees (``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER``, the devices torch finds); the script checks that the inventory is real
GPUs, that each learner saw exactly its own GPU, that the backend was NCCL, and that the job
completed with its last checkpoint recorded, and prints one JSON object. Exit status 0 when all
held, 1 when one did not, 2 when this machine has no NVIDIA GPU.

Run from the repository root, with ffdl and a CUDA build of torch installed:

    python -m tests.gpu.nccl_ddp [--steps 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.heartbeat_bench import PlatformProcess
from ffdl.adapters.gpus import detect_local_node
from tests.harness import fast_settings

PROBE = (
    "import os, torch; e = os.environ; print('sees', e['CUDA_VISIBLE_DEVICES'], e.get('CUDA_DEVICE_ORDER'), "
    "torch.cuda.device_count(), torch.cuda.get_device_name(0), flush=True)"
)


async def run(steps: int) -> dict[str, Any]:
    node = detect_local_node()
    learners = min(2, node.gpus)
    result: dict[str, Any] = {
        "node": node.name,
        "gpus": node.gpus,
        "gpu_type": node.gpu_type,
        "learners": learners,
    }
    with tempfile.TemporaryDirectory(prefix="ffdl-gpu-") as tmp:
        settings = fast_settings(Path(tmp) / "ffdl", nodes=None, launch_timeout_s=120.0)
        train = f"{sys.executable} -m ffdl.examples.torch_ddp.train --steps {steps} --checkpoint-every 25"
        spec = {
            "name": "nccl-ddp",
            "learners": learners,
            "gpus": 1,
            "cpus": 1,
            "framework": "pytorch",
            "progress_timeout_s": 300,
            "max_restarts": 0,
            "command": f'{sys.executable} -c "{PROBE}" && {train}',
        }
        async with PlatformProcess(settings, Path(tmp) / "platform.log") as platform:
            started = time.monotonic()
            job_id = await platform.submit(yaml.safe_dump(spec))
            job: dict[str, Any] = {}
            while time.monotonic() - started < 600:
                job = (await platform.http.get(f"/v1/jobs/{job_id}")).json()
                if job["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                    break
                await asyncio.sleep(0.2)
            result["wall_s"] = round(time.monotonic() - started, 2)
            logs = settings.work_dir / job_id / "logs" / "attempt-1"
            outputs = [(logs / f"learner-{rank}.log").read_text() for rank in range(learners)]
        placed = [learner["gpus"] for learner in (job.get("placement") or {}).get("learners", [])]
    seen = [
        next((line.split()[1:] for line in out.splitlines() if line.startswith("sees ")), [])
        for out in outputs
    ]
    result |= {
        "state": job.get("state"),
        "reason": job.get("reason"),
        "latest_checkpoint": (job.get("latest_checkpoint") or {}).get("step"),
        "learners_saw": seen,
        "backends": [line for out in outputs for line in out.splitlines() if line.startswith("rank ")],
        "placement": placed,
        "last_lines": [out.splitlines()[-3:] for out in outputs],
    }
    result["ok"] = (
        node.gpu_type != "simulated"
        and job.get("state") == "COMPLETED"
        and result["latest_checkpoint"] == steps
        and len({tuple(saw[:1]) for saw in seen}) == learners  # each its own GPU
        and all(saw[1:3] == ["PCI_BUS_ID", "1"] for saw in seen)
        and all("(nccl on " in line for line in result["backends"])
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    if detect_local_node().gpu_type == "simulated":
        print(json.dumps({"ok": False, "reason": "no NVIDIA GPU found by nvidia-smi"}))
        return 2
    result = asyncio.run(run(args.steps))
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
