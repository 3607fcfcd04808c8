"""The embedded default's node: the NVIDIA GPUs ``nvidia-smi`` finds, else 8 simulated ones, and the
host's memory less what the platform keeps for itself."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

from ffdl.core.allocator import Node

SIMULATED_GPUS = 8
#: What the embedded default keeps of the host's memory for the platform's own processes.
PLATFORM_RESERVE_MB = 2048


def host_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The host's memory (``MemTotal``) in MiB, or None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemTotal":
                return int(value.split()[0]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


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
    # Learners are placed by their memory: the node never offers more than the host has (CPU time
    # may be overcommitted, as simulated GPUs ask: it is shared, where memory runs out).
    total = host_memory_mb()
    node = (
        Node(host, len(names), gpu_type_label(names[0]), cpus=cpus)
        if names
        else Node(host, SIMULATED_GPUS, "simulated", cpus=max(cpus, 64.0))
    )
    if total is None:
        return node
    return replace(node, memory_mb=max(total - PLATFORM_RESERVE_MB, total // 2))
