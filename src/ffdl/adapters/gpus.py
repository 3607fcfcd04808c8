"""The embedded default's node: the NVIDIA GPUs ``nvidia-smi`` finds, else 8 simulated ones."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from ffdl.core.allocator import Node

SIMULATED_GPUS = 8


def _nvidia_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_type_label(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the form GPU types take in manifests and node labels."""
    return "-".join(name.lower().split())


def detect_local_node() -> Node:
    host = socket.gethostname() or "local"
    names = _nvidia_gpus()
    cpus = float(os.cpu_count() or 1)
    if names:
        return Node(host, len(names), gpu_type_label(names[0]), cpus=cpus)
    return Node(host, SIMULATED_GPUS, "simulated", cpus=max(cpus, 64.0))
