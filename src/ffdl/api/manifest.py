"""Manifests: our own (the fields of ``JobSpec``) and FfDL's YAML, both turned into a ``JobSpec``.

FfDL's manifest (``name, learners, gpus, cpus, memory, framework{name,version,command},
data_stores``) is recognised by its ``framework.command``; its memory strings ("8Gb", "512MiB")
become megabytes and its data stores' training data and result containers become the data and
result places. Any problem is a :class:`ManifestError` naming the field, which the API answers
with a 422 and the CLI prints.

A manifest comes from anyone who holds a token, so parsing it is bounded: YAML anchors and aliases
are refused (eight levels of aliases to nine-element lists make a 400-byte body stand for 9^8
values), as are manifests nested deeper than :data:`MAX_DEPTH` or with more than
:data:`MAX_NODES` values, and a number of more than :data:`MAX_DIGITS` digits reads as infinite
(which every numeric field refuses, naming itself) instead of costing a quadratic conversion.

What is left costs time in proportion to the text: PyYAML's pure-Python reader takes up to about
1.2 us a byte (a scalar of one-letter words), 0.3 s for the API's default 256 KiB. So a parse is
given a ``deadline`` too, and stops there (:class:`OutOfTime`): the reader checks the clock as it
moves on through the text and the composer at each value, so a parse outlives its deadline by at
most the scan of one word or line. (libyaml, PyYAML's C parser, reads that manifest about 170 times
faster, but reads another language: it refuses YAML's ``"\\uD800"`` and JSON's ``"\\ud800"``
outright, where the API names the field they are in, and takes text this reader refuses or reads
otherwise, such as a tab between tokens or an empty value tagged ``!``: see docs/security.md.)
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import ValidationError

from ffdl.events.model import JobSpec

_MEMORY = re.compile(r"\A\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*\Z", re.IGNORECASE)
_UNIT_MB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
#: How deep a manifest may nest (ours nests two levels, FfDL's three) and how many values it may hold.
MAX_DEPTH = 16
MAX_NODES = 5000
#: The most digits a number may have; a longer one reads as infinite.
MAX_DIGITS = 64


class ManifestError(ValueError):
    """A manifest that cannot become a job; ``problems`` lists (field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))
        self.problems = problems


class OutOfTime(ManifestError):
    """A manifest whose parse ran past its deadline: it was stopped there, or, ``started`` False,
    the deadline had passed before its parse could start."""

    def __init__(self, *, started: bool = True) -> None:
        super().__init__([("(body)", "the manifest took too long to read")])
        self.started = started


class _ManifestLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded for untrusted text: no anchors or aliases, at most
    :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES` values (checked as the text is
    composed, so a refused manifest costs no more than its first :data:`MAX_NODES` values), and
    stopped at ``deadline`` (by ``clock``) as it reads on through the text and composes each value."""

    def __init__(
        self, stream: str | bytes, deadline: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._deadline = math.inf if deadline is None else deadline
        self._clock = clock
        if self._clock() > self._deadline:
            raise OutOfTime(started=False)
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def _in_time(self) -> None:
        if self._clock() > self._deadline:
            raise OutOfTime

    def forward(self, length: int = 1) -> None:
        """Move on ``length`` characters (the reader's every step past a token, a word or a space)."""
        if self._clock() > self._deadline:
            raise OutOfTime
        yaml.reader.Reader.forward(self, length)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._in_time()
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in PyYAML's stubs
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ManifestError([("(body)", "YAML anchors and aliases (&, *) are not accepted")])
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ManifestError([("(body)", f"a manifest holds at most {MAX_NODES} values")])
        if self._depth >= MAX_DEPTH:
            raise ManifestError([("(body)", f"a manifest nests at most {MAX_DEPTH} levels deep")])
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int | float:
        """An integer, or an infinity for one of more than :data:`MAX_DIGITS` digits."""
        text = str(node.value)
        if sum(c.isdigit() for c in text) > MAX_DIGITS:
            return -math.inf if text.lstrip().startswith("-") else math.inf
        return self.construct_yaml_int(node)


_ManifestLoader.add_constructor("tag:yaml.org,2002:int", _ManifestLoader.construct_bounded_int)


def parse_manifest(
    text: str | bytes, deadline: float | None = None, clock: Callable[[], float] = time.monotonic
) -> JobSpec:
    """A ``JobSpec`` from JSON or YAML text in either manifest format (bounded: see the module);
    :class:`OutOfTime` once ``clock`` is past ``deadline`` (None: no deadline)."""
    try:
        loader = _ManifestLoader(text, deadline, clock)  # a SafeLoader, bounded further
        try:
            raw = loader.get_single_data()
        finally:
            loader.dispose()
    except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError([("(body)", f"not valid YAML or JSON: {yaml_problem(exc)}")]) from exc
    if deadline is not None and clock() > deadline:
        raise OutOfTime
    return spec_from_mapping(raw)


def yaml_problem(exc: Exception) -> str:
    """A YAML error on one line, with where it is: ``line 3, column 7: mapping values are not
    allowed here`` (PyYAML's own text spans lines and quotes the document)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context or 'malformed'}"
    return " ".join(str(exc).split())


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
        megabytes = float(value)
    else:
        match = _MEMORY.match(str(value))
        if not match:
            raise ManifestError(
                [("memory", f"cannot read {str(value)[:100]!r} as a size like '8Gb' or '512MiB'")]
            )
        number, unit, _ = match.groups()
        megabytes = float(number) * _UNIT_MB[unit.lower()]
    if not math.isfinite(megabytes):
        raise ManifestError([("memory", "must be a finite size")])
    return max(1, int(megabytes))


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
