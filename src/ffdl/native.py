"""The planner's modules compiled to C with mypyc, and how an interpreter picks them up.

A planning step is pure Python over dicts, tuples and small classes: the simulator runs hundreds of
thousands of them (Philly's replay, 181,796), and the interpreter's dispatch is most of their cost.
mypyc compiles the same sources, typed as they are for ``mypy --strict``, to a C extension that
decides exactly as they do (``tests/unit/test_native.py`` holds it; the benchmark compares every
job's outcome) in about half the time: Philly's replay 21.3 s against 36.5 s, 100,000 generated
jobs at load 1.3 81.0 s against 158.1 s (docs/benchmarks.md). Compiled code still runs Python
where the sources call it: a dataclass's or a named tuple's constructor, an enum member looked up
on its class (3.11's ``EnumType.__getattr__``); the planner's hot paths avoid them.

``make native`` (``make test`` runs it) builds the modules of
:data:`COMPILED` into ``ffdl/compiled/``, beside this file, with a manifest of the sources they were
built from: every module of ``ffdl.core`` and ``ffdl.events``, all the compiled code can import
(the layers' contracts), since mypyc inlines what it can see of them. :func:`install` (run by
``import ffdl``) puts a finder first on ``sys.meta_path`` that imports a compiled module in place of
its source only while the manifest matches the sources byte for byte: an edited source is run as
it is, never an older build of it. ``FFDL_COMPILED=0`` runs the sources whatever is built (the
baseline a benchmark measures against, or a debugger stepping through the planner).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

#: the modules compiled: a planning step and the simulator's loop run through nothing else of ffdl's
COMPILED = (
    "ffdl.core.allocator",
    "ffdl.core.cluster",
    "ffdl.core.preemption",
    "ffdl.core.scheduling",
    "ffdl.core.service",
    "ffdl.core.simulation",
    "ffdl.core.tenancy",
)
#: the shared library the compiled modules live in (each module's own extension only forwards to it)
GROUP = "ffdl.core.planner"
PACKAGE = Path(__file__).resolve().parent
BUILT = PACKAGE / "compiled"
MANIFEST = BUILT / "manifest.json"
#: the environment variable that, set to 0, keeps the sources running whatever is built
SWITCH = "FFDL_COMPILED"


def sources_digest(package: Path = PACKAGE) -> str:
    """What a build rests on: every source of ``ffdl.core`` and ``ffdl.events``, by path and content."""
    digest = hashlib.sha256()
    for layer in ("core", "events"):
        for path in sorted((package / layer).rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _abi() -> str:
    """What an extension built here needs of the interpreter that loads it."""
    return f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"


def _extension(name: str, built: Path = BUILT) -> Path:
    *package, module = name.split(".")
    return built.joinpath(*package, module + importlib.machinery.EXTENSION_SUFFIXES[0])


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds a compiled module's extension in the build, once the build is found to be of the
    sources there are (checked at the first compiled module asked for, not at ``import ffdl``)."""

    def __init__(self, built: Path, package: Path) -> None:
        self._built = built
        self._package = package
        self._fresh: bool | None = None
        self._names = {*COMPILED, GROUP + "__mypyc"}

    def fresh(self) -> bool:
        if self._fresh is None:
            try:
                manifest = json.loads((self._built / MANIFEST.name).read_text())
            except (OSError, ValueError):
                manifest = None
            self._fresh = (
                isinstance(manifest, dict)
                and manifest.get("abi") == _abi()
                and manifest.get("modules") == list(COMPILED)
                # all or none: a module's extension without the shared library fails to import
                and all(_extension(name, self._built).is_file() for name in self._names)
                and manifest.get("sources") == sources_digest(self._package)
            )
        return self._fresh

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self._names or not self.fresh():
            return None
        return importlib.util.spec_from_file_location(fullname, _extension(fullname, self._built))


def install() -> None:
    """Import the compiled modules in place of their sources from now on, where a build of these
    very sources is there and ``FFDL_COMPILED`` is not 0 (see the module's docstring)."""
    if os.environ.get(SWITCH) == "0" or not MANIFEST.is_file():
        return
    if not any(isinstance(finder, _CompiledFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CompiledFinder(BUILT, PACKAGE))


def active() -> bool:
    """Whether the planner runs compiled in this process (imports it to find out)."""
    from ffdl.core import scheduling  # noqa: PLC0415 (what was imported is the question)

    return not (scheduling.__file__ or "").endswith(".py")


def build() -> Path:
    """Compile :data:`COMPILED` into ``ffdl/compiled/`` (mypyc, then the C compiler); where it went.
    The old build is removed first, so a failed build leaves the sources running."""
    from mypyc.build import mypycify  # noqa: PLC0415 (a build tool, not what the platform runs)
    from setuptools import Distribution  # noqa: PLC0415

    shutil.rmtree(BUILT, ignore_errors=True)
    digest = sources_digest()
    sources = [str(PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")) for name in COMPILED]
    with tempfile.TemporaryDirectory(prefix="ffdl-compile-") as work:
        extensions = mypycify(
            ["--config-file", str(_config()), *sources], group_name=GROUP, target_dir=f"{work}/c"
        )
        distribution = Distribution({"name": "ffdl-compiled", "ext_modules": extensions})
        command = distribution.get_command_obj("build_ext")
        command.build_lib = f"{work}/lib"
        command.build_temp = f"{work}/temp"
        command.parallel = os.cpu_count() or 1
        distribution.run_command("build_ext")
        staged = Path(work) / "staged"
        for name in (*COMPILED, GROUP + "__mypyc"):
            target = _extension(name, staged)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(_extension(name, Path(work) / "lib"), target)
        manifest = {"abi": _abi(), "modules": list(COMPILED), "sources": digest}
        (staged / MANIFEST.name).write_text(json.dumps(manifest, indent=2) + "\n")
        if sources_digest() != digest:  # edited while it compiled: the build would be of neither
            raise RuntimeError("the sources changed while they were compiled; build again")
        shutil.copytree(staged, BUILT)
    return BUILT


def _config() -> Path:
    """The mypy settings the sources are checked with (the project's), else mypy's defaults."""
    for directory in PACKAGE.parents:
        if (directory / "pyproject.toml").is_file():
            return directory / "pyproject.toml"
    return Path(os.devnull)
