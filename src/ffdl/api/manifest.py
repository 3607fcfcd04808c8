"""Manifests: our own (the fields of ``JobSpec``) and FfDL's YAML, both turned into a ``JobSpec``.

FfDL's manifest (``name, learners, gpus, cpus, memory, framework{name,version,command},
data_stores``) is recognised by its ``framework.command``; its memory strings ("8Gb", "512MiB")
become megabytes and its data stores' training data and result containers become the data and
result places. Any problem is a :class:`ManifestError` naming the field, which the API answers
with a 422 and the CLI prints.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from pydantic import ValidationError

from ffdl.events.model import JobSpec

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*$", re.IGNORECASE)
_UNIT_MB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


class ManifestError(ValueError):
    """A manifest that cannot become a job; ``problems`` lists (field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))
        self.problems = problems


def parse_manifest(text: str | bytes) -> JobSpec:
    """A ``JobSpec`` from JSON or YAML text in either manifest format."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError([("(body)", f"not valid YAML or JSON: {exc}")]) from exc
    return spec_from_mapping(raw)


def spec_from_mapping(raw: Any) -> JobSpec:
    if not isinstance(raw, dict):
        raise ManifestError([("(body)", "a manifest must be a mapping")])
    framework = raw.get("framework")
    if isinstance(framework, dict) and "command" in framework:
        raw = _from_ffdl(raw, framework)
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        problems = [
            (".".join(str(p) for p in error["loc"]) or "(body)", error["msg"]) for error in exc.errors()
        ]
        raise ManifestError(problems) from exc
    if problems := spec.submission_problems():
        raise ManifestError(problems)
    return spec


def _memory_mb(value: Any) -> Any:
    if isinstance(value, int | float):
        return int(value)
    match = _MEMORY.match(str(value))
    if not match:
        raise ManifestError([("memory", f"cannot read {value!r} as a size like '8Gb' or '512MiB'")])
    number, unit, _ = match.groups()
    return max(1, int(float(number) * _UNIT_MB[unit.lower()]))


def _dns_name(name: Any) -> Any:
    if not isinstance(name, str):
        return name
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")[:63] or name


def _container(store: dict[str, Any], part: str) -> str | None:
    section = store.get(part)
    if isinstance(section, dict) and isinstance(section.get("container"), str):
        return str(section["container"])
    return None


def _from_ffdl(raw: dict[str, Any], framework: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": _dns_name(raw.get("name")),
        "command": framework.get("command"),
        "framework": framework.get("name"),
        "framework_version": str(framework["version"]) if "version" in framework else None,
    }
    for field in ("learners", "gpus", "cpus"):
        if field in raw:
            spec[field] = raw[field]
    if "memory" in raw:
        spec["memory_mb"] = _memory_mb(raw["memory"])
    stores = raw.get("data_stores") or []
    if isinstance(stores, list) and stores and isinstance(stores[0], dict):
        spec["data_dir"] = _container(stores[0], "training_data")
        spec["result_dir"] = _container(stores[0], "training_results")
    if isinstance(raw.get("description"), str):
        spec["labels"] = {"description": raw["description"][:200]}
    return {k: v for k, v in spec.items() if v is not None}


def spec_to_json(spec: JobSpec) -> str:
    return json.dumps(spec.model_dump(mode="json", exclude_defaults=True), indent=2)
