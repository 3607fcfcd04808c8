"""The bounds on what a learner may report, and how a report is brought inside them (DESIGN §6a).

Everything a training program reports (its step, its metrics) is input from a tenant who may lie,
and on Kubernetes even the agent that relays it runs in the tenant's pod. So the one definition of
what a report may hold lives here, in the contract, and is applied at every place a report crosses
a boundary: the learner agent (what the program sent it), the monitor (what a heartbeat holds) and
the event models (what the log may carry).

A report is never refused whole for a bad metric: what exceeds a bound is dropped, each drop with a
reason the caller logs (and, where it concerns a job, records), so a diverging loss (``NaN``) or a
program that logs ten thousand metrics still reports its step. Non-finite numbers never reach JSON:
they cannot be encoded as JSON numbers, and a browser's ``JSON.parse`` rejects the ``NaN`` token.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AllowInfNan, Field

#: The most bytes one report (one JSON line) may take; a longer line is dropped unread.
MAX_REPORT_BYTES = 16 * 1024
#: The most metrics a learner's progress may carry; beyond it, the names last in order are dropped.
MAX_METRICS = 64
#: The longest metric name.
MAX_METRIC_NAME_LENGTH = 64
#: The largest step: JSON readers (a browser) hold integers exactly up to 2**53.
MAX_STEP = 2**53 - 1
#: The most drop reasons one report keeps; the rest are counted in one more reason.
MAX_DROP_REASONS = 8

#: A metric's value as the log carries it: a finite number (JSON has no NaN or infinity).
FiniteFloat = Annotated[float, AllowInfNan(False)]
#: Metrics as an event declares them: finite, at most :data:`MAX_METRICS` (their names were checked
#: on the command the event was decided from).
Metrics = Annotated[dict[str, FiniteFloat], Field(max_length=MAX_METRICS)]
#: A metric's name as a command declares it.
MetricName = Annotated[str, Field(min_length=1, max_length=MAX_METRIC_NAME_LENGTH)]
#: Metrics as a command declares them: what :class:`Metrics` holds, with names of bounded length.
ReportedMetrics = Annotated[dict[MetricName, FiniteFloat], Field(max_length=MAX_METRICS)]
#: Why metrics of a report were dropped, as a model declares them.
DropReasons = Annotated[tuple[Annotated[str, Field(max_length=200)], ...], Field(max_length=MAX_DROP_REASONS)]


@dataclass(frozen=True, slots=True)
class BoundedMetrics:
    """Metrics brought inside the bounds, and one reason per metric (or group of them) dropped."""

    metrics: dict[str, float]
    dropped: tuple[str, ...] = ()


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return f"metric name {name!r:.80} is not a string"
    if not name or len(name) > MAX_METRIC_NAME_LENGTH:
        return f"metric name {name[:80]!r} is not 1 to {MAX_METRIC_NAME_LENGTH} characters long"
    if not name.isprintable():
        return f"metric name {name!r:.80} has unprintable characters"
    return None


def _value_problem(name: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"metric {name!r} is not a number: {value!r:.80}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"metric {name!r} is not finite ({value})"
    if isinstance(value, int) and abs(value) > MAX_STEP:
        return f"metric {name!r} is too large to be exact in JSON"
    return None


def bound_metrics(raw: object) -> BoundedMetrics:
    """Keep the metrics of ``raw`` that are well named and finite, at most :data:`MAX_METRICS` of them.

    Which ones are kept is deterministic (the first in name order), so two readers of one report
    agree on it.
    """
    if raw is None:
        return BoundedMetrics({})
    if not isinstance(raw, Mapping):
        return BoundedMetrics({}, (f"metrics are not a mapping: {type(raw).__name__}",))
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for name, value in raw.items():
        problem = _name_problem(name) or _value_problem(name, value)
        if problem is None:
            kept[name] = float(value)
        else:
            dropped.append(problem)
    if len(kept) > MAX_METRICS:
        names = sorted(kept)
        dropped.append(f"{len(names) - MAX_METRICS} metrics over the limit of {MAX_METRICS} dropped")
        kept = {name: kept[name] for name in names[:MAX_METRICS]}
    return BoundedMetrics(dict(sorted(kept.items())), few_reasons(dropped))


def few_reasons(reasons: list[str]) -> tuple[str, ...]:
    """At most :data:`MAX_DROP_REASONS` reasons, each at most 200 characters: a report that drops ten
    thousand metrics must not carry ten thousand reasons."""
    if len(reasons) > MAX_DROP_REASONS:
        more = len(reasons) - (MAX_DROP_REASONS - 1)
        reasons = [*reasons[: MAX_DROP_REASONS - 1], f"and {more} more dropped"]
    return tuple(reason[:200] for reason in reasons)


def bound_step(raw: object) -> int:
    """The step a report names, or :class:`ValueError` saying why it is not one."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"step is not an integer: {raw!r:.80}")
    if not 0 <= raw <= MAX_STEP:
        raise ValueError(f"step {raw} is out of range 0..{MAX_STEP}")
    return raw


def finite_or_null(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every non-finite float made ``None``.

    What the read side applies to everything it emits, so a record written before the bounds (a
    ``NaN`` loss in an old log) is still served as JSON that a strict parser accepts.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, dict | list | tuple):
        return value
    # without recursion: a value nested deeper than the stack (tenants write some of what is read)
    # raised RecursionError, which no caller expects
    root: list[Any] = [None]
    pending: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, where its copy goes, at)
    while pending:
        item, into, at = pending.pop()
        if isinstance(item, float):
            into[at] = item if math.isfinite(item) else None
        elif isinstance(item, dict):
            copy: dict[Any, Any] = dict.fromkeys(item)
            into[at] = copy
            pending.extend((inner, copy, key) for key, inner in item.items())
        elif isinstance(item, list | tuple):
            listed: list[Any] = [None] * len(item)
            into[at] = listed
            pending.extend((inner, listed, index) for index, inner in enumerate(item))
        else:
            into[at] = item
    return root[0]


def loads_finite(text: str | bytes) -> Any:
    """JSON parsed with the non-finite tokens Python writes (``NaN``, ``Infinity``) read as ``None``:
    how a reader takes a record or document that an older platform wrote with them."""
    return json.loads(text, parse_constant=_null)


def _null(_: str) -> None:
    return None


def strict_dumps(value: Any, **options: Any) -> str:
    """JSON of ``value`` that a strict parser accepts: non-finite numbers as ``null``, never as tokens."""
    return json.dumps(finite_or_null(value), allow_nan=False, **options)
