"""The layering holds: import-linter's contracts from pyproject.toml are kept, and would catch a breach.

The contracts (docs/architecture.md explains them) run against ``src/`` as it is laid out, so a
module added since the last editable install is checked too. A copy of ``src/`` with one forbidden
import planted per contract shows that every contract is enforced, stdlib I/O modules included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = [contract["name"] for contract in PYPROJECT["tool"]["importlinter"]["contracts"]]

#: One forbidden import per contract: (module file in the package, line to plant, what the report names).
BREACHES = {
    "layers: entry points, wiring, adapters, roles, read models, domain, contract": (
        "handlers/owner.py",
        "import ffdl.adapters.bus",
        "ffdl.handlers.owner -> ffdl.adapters.bus",
    ),
    "core and events are pure: no I/O, no clock, no client library": (
        "core/restart.py",
        "import time",
        "ffdl.core.restart -> time",
    ),
    "roles reach the world only through ports": (
        "handlers/reactor.py",
        "import aiokafka",
        "ffdl.handlers.reactor -> aiokafka",
    ),
    "the monitor's heartbeat state machine is pure: no I/O, no clock, no logging": (
        "handlers/heartbeat_tracker.py",
        "import time",
        "ffdl.handlers.heartbeat_tracker -> time",
    ),
    "the scheduler's planning state has no I/O but its log, and no clock of its own": (
        "handlers/outstanding.py",
        "import asyncio",
        "ffdl.handlers.outstanding -> asyncio",
    ),
    "adapters of different ports are independent": (
        "adapters/heartbeats/keys.py",
        "import ffdl.adapters.bus.partitioning",
        "ffdl.adapters.heartbeats.keys -> ffdl.adapters.bus.partitioning",
    ),
}


def copy_source(into: Path) -> Path:
    shutil.copytree(SOURCE, into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into / "src"


def lint_imports(source: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contracts_cover_every_layer() -> None:
    assert sorted(CONTRACTS) == sorted(BREACHES)
    assert PYPROJECT["tool"]["importlinter"].get("include_external_packages") is True
    packages = {path.name for path in (SOURCE / "ffdl").iterdir() if (path / "__init__.py").exists()}
    layered = {
        name.removeprefix("ffdl.")
        for contract in PYPROJECT["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers"
        for layer in contract["layers"]
        for name in layer.replace(":", "|").split("|")
        for name in [name.strip()]
    }
    assert packages == layered, "every subpackage of ffdl belongs to a layer"


def test_every_import_contract_is_kept() -> None:
    result = lint_imports(SOURCE)

    assert result.returncode == 0, result.stdout + result.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in result.stdout


def test_a_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    source = copy_source(tmp_path)
    for module, line, _ in BREACHES.values():
        path = source / "ffdl" / module
        path.write_text(f"{path.read_text()}\n{line}\n")

    result = lint_imports(source)

    assert result.returncode != 0
    for name, (_, _, reported) in BREACHES.items():
        assert f"{name} BROKEN" in result.stdout
        assert reported in result.stdout
