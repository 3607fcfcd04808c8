"""The layering holds: import-linter's contracts from pyproject.toml are kept, and would catch a breach.

The contracts (events imports nothing of ours; core imports only events and no I/O module; handlers
never import adapters or projections; projections never import adapters or handlers) run against
the source folders laid out as the ``ffdl`` package by pyproject's ``package-dir`` map, so a module
added since the last editable install is checked too. A copy with one forbidden import planted per
contract shows that every contract is enforced, stdlib I/O modules included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = [contract["name"] for contract in PYPROJECT["tool"]["importlinter"]["contracts"]]

#: One forbidden import per contract: (module file in the package, line to plant, what the report names).
BREACHES = {
    "events is the contract: it imports nothing of ours": (
        "events/model.py",
        "import ffdl.core.job",
        "ffdl.core.job",
    ),
    "core is pure: only events, no I/O": ("core/restart.py", "import time", "ffdl.core.restart -> time"),
    "handlers see core, events and ports, never an adapter": (
        "handlers/__init__.py",
        "from ffdl.adapters import bus",
        "ffdl.adapters",
    ),
    "projections fold events with core, and touch no adapter or handler": (
        "projections/__init__.py",
        "import ffdl.handlers.ports",
        "ffdl.handlers.ports",
    ),
}


def lay_out_package(into: Path) -> Path:
    """Copy the source folders into ``into/ffdl/...`` as pyproject's package-dir maps them."""
    package_dirs: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(package_dirs.items()):  # parents before their subpackages
        shutil.copytree(
            ROOT / folder,
            into.joinpath(*package.split(".")),
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
    return into


def lint_imports(package_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
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


def test_every_import_contract_is_kept(tmp_path: Path) -> None:
    result = lint_imports(lay_out_package(tmp_path))

    assert result.returncode == 0, result.stdout + result.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in result.stdout


def test_a_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    package = lay_out_package(tmp_path)
    for module, line, _ in BREACHES.values():
        path = package / "ffdl" / module
        path.write_text(f"{path.read_text()}\n{line}\n")

    result = lint_imports(package)

    assert result.returncode != 0
    for name, (_, _, reported) in BREACHES.items():
        assert f"{name} BROKEN" in result.stdout
        assert reported in result.stdout
