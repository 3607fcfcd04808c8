"""What a fresh machine installs is what the code needs, at the versions locked.

* Every third-party module the tests and benchmarks import is provided by a distribution that
  pyproject.toml declares (no test works only because something else happened to pull it in).
* requirements.lock pins every dependency of the project and of each extra, at a version the
  declaration allows (``make lock`` writes it again; the venv and the image install from it).
* Every manifest a document tells a user to submit exists.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = project.get("optional-dependencies", {})
    return [
        Requirement(text) for text in [*project["dependencies"], *(r for e in extras.values() for r in e)]
    ]


def imported_modules(*folders: str) -> dict[str, set[str]]:
    """Top-level modules imported by the Python files under ``folders``, with who imports each."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_module_the_tests_import_is_declared() -> None:
    names = {canonicalize_name(requirement.name) for requirement in declared()}
    providers = importlib.metadata.packages_distributions()
    local = {path.stem for path in (ROOT / "tests").rglob("*.py")} | {"ffdl", "tests", "bench"}
    undeclared = {}
    for module, users in imported_modules("tests", "bench").items():
        if module in sys.stdlib_module_names or module in local or module == "__future__":
            continue
        distributions = {canonicalize_name(d) for d in providers.get(module, [module])}
        if not distributions & names:
            undeclared[module] = sorted(users)[:3]
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"


def locked() -> dict[str, str]:
    """The lock's pins by name (a name pinned per Python version keeps each: any must satisfy)."""
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if match:
            pins.setdefault(canonicalize_name(match.group(1)), match.group(2))
    return pins


def test_the_lock_pins_every_declared_dependency_within_its_bounds() -> None:
    pins = locked()
    stale = [
        str(requirement)
        for requirement in declared()
        if canonicalize_name(requirement.name) not in pins
        or not requirement.specifier.contains(pins[canonicalize_name(requirement.name)], prereleases=True)
    ]
    assert stale == [], f"requirements.lock is stale for {stale}: run `make lock`"


def test_the_install_and_the_image_install_from_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "-c $(LOCK) -e" in makefile and "LOCK := requirements.lock" in makefile
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"pip install -c requirements\.lock '?\.", dockerfile), dockerfile


def test_every_manifest_a_document_submits_exists() -> None:
    documents = [ROOT / "README.md", ROOT / "deploy" / "compose.yaml", *ROOT.glob("docs/*.md")]
    documents += [*(ROOT / "src").rglob("README.md"), ROOT / "deploy" / "README.md"]
    named = {
        (str(document.relative_to(ROOT)), path)
        for document in documents
        for path in re.findall(r"ffdl submit (\S+\.ya?ml)\b", document.read_text())
    }
    assert named, "the documents name manifests"
    # the README's quickstart submits the manifest it shows, saved as manifest.yaml (tests/e2e/test_readme.py)
    missing = [(doc, path) for doc, path in named if path != "manifest.yaml" and not (ROOT / path).is_file()]
    assert missing == []
