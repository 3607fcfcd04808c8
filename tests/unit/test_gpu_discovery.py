"""The local inventory's GPUs: what nvidia-smi lists, else simulated ones (which are no CUDA devices)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ffdl.adapters.gpus import SIMULATED_GPUS, detect_local_node


def fake_nvidia_smi(directory: Path, script: str) -> None:
    program = directory / "nvidia-smi"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)


def test_the_gpus_nvidia_smi_lists_make_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, 'printf "NVIDIA H200\\nNVIDIA H200\\n"')
    monkeypatch.setenv("PATH", str(tmp_path))
    node = detect_local_node()
    assert (node.gpus, node.gpu_type) == (2, "nvidia-h200")


@pytest.mark.parametrize("script", ["exit 9", "true"])
def test_without_a_working_nvidia_smi_the_node_has_simulated_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    fake_nvidia_smi(tmp_path, script)
    monkeypatch.setenv("PATH", str(tmp_path))
    node = detect_local_node()
    assert (node.gpus, node.gpu_type) == (SIMULATED_GPUS, "simulated")
