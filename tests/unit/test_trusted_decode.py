"""The trusted path decodes the events topic without validating again, and is validation's equal.

What it makes must equal what validation makes (the same values, types and fields set), for every
event type, and it must never take a record validation refuses: such a record goes through
validation, which refuses it with the reason. Proved over every event of the golden logs, over
generated events of every type, and over generated events with one part damaged or rewritten.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import AllowInfNan, BaseModel
from pydantic.fields import FieldInfo

from ffdl.events import job_events as ev
from ffdl.events.codec import (
    AnyEvent,
    DecodeError,
    any_event_from_dict,
    any_event_from_json,
    built_event,
    built_line,
    event_to_dict,
    event_to_json,
    trusted_any_event_from_json,
)
from ffdl.events.envelope import Event, NodeEvent
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.model import JobSpec
from ffdl.events.nodes import NODE_EVENT_TYPES
from ffdl.projections.documents import dumps
from ffdl.projections.store import LoggedEvent
from ffdl.tools.log_files import decode_line, encode_line, read_line, split_line
from tests.golden.record import GOLDEN_DIR

GOLDEN_LINES = [
    (path.name, number, text)
    for path in sorted(GOLDEN_DIR.glob("*.events.jsonl"))
    for number, text in enumerate(path.read_text().splitlines(), start=1)
]


def same(built: AnyEvent, validated: AnyEvent) -> None:
    """Equal, and alike in what equality does not compare: types, the fields set, field order."""
    assert built == validated
    assert type(built.data) is type(validated.data)
    for mine, theirs in ((built, validated), (built.data, validated.data)):
        assert mine.model_fields_set == theirs.model_fields_set
        assert list(mine.__dict__) == list(theirs.__dict__)
    assert repr(built) == repr(validated)
    assert event_to_json(built) == event_to_json(validated)


@pytest.mark.parametrize(("log", "number", "text"), GOLDEN_LINES, ids=lambda value: str(value)[:40])
def test_every_golden_event_is_built_equal_to_its_validated_decoding(
    log: str, number: int, text: str
) -> None:
    raw, _ = split_line(text, number)
    validated = any_event_from_dict(dict(raw))
    record = dumps(raw)

    built = built_event(record)
    line = built_line(text)

    if raw.get("schema_version", 1) != validated.schema_version:  # an older version: upcast by validation
        assert built is None and line is None
        assert trusted_any_event_from_json(record) == validated
        return
    assert built is not None and line is not None
    same(built, validated)
    same(line[0], validated)
    partition, offset = line[1].split(":")
    assert decode_line(text, number) == LoggedEvent(validated, int(partition), int(offset))
    assert read_line(text, number).event_json == record


# -- generated events -----------------------------------------------------------------------------

ZONES = st.sampled_from((UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5, minutes=30))))
TEXT = st.text(max_size=12)
JOB_SPECS = st.builds(
    JobSpec,
    name=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True),
    command=st.text(min_size=1, max_size=20),
    learners=st.integers(1, 8),
    labels=st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), TEXT, max_size=2),
)


def strategy(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values of ``annotation`` within the field's declared bounds, lengths and pattern."""
    if get_origin(annotation) is Annotated:  # an item's own rules (finite metric values)
        inner, *rules = get_args(annotation)
        flat = [
            rule for given in rules for rule in (given.metadata if isinstance(given, FieldInfo) else (given,))
        ]
        return strategy(inner, [*metadata, *flat])
    bounds: dict[str, Any] = {}
    pattern = None
    for rule in metadata:
        match rule:
            case AllowInfNan():
                pass  # floats are finite here anyway
            case annotated_types.Ge(ge=bound) | annotated_types.Gt(gt=bound):
                bounds["min_value"] = bound
                bounds["exclude_min"] = isinstance(rule, annotated_types.Gt)
            case annotated_types.Le(le=bound):
                bounds["max_value"] = bound
            case annotated_types.MinLen(min_length=bound):
                bounds["min_size"] = bound
            case annotated_types.MaxLen(max_length=bound):
                bounds["max_size"] = min(bound, 12)
            case _:
                pattern = rule.__dict__["pattern"]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, UnionType) and NoneType in args:
        (inner,) = (arg for arg in args if arg is not NoneType)
        return st.none() | strategy(inner, metadata)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        ints = {key: value for key, value in bounds.items() if key in ("min_value", "max_value")}
        if bounds.get("exclude_min"):
            ints["min_value"] += 1
        return st.integers(**{"min_value": -(2**40), "max_value": 2**40, **ints})
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=64, **bounds)
    if annotation is str:
        if pattern is not None:
            return st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?", fullmatch=True)
        return st.text(**{"max_size": 12, **bounds})
    if annotation is uuid.UUID:
        return st.uuids()
    if annotation is datetime:
        return st.datetimes(timezones=ZONES)
    if annotation is JobSpec:
        return JOB_SPECS
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return st.sampled_from(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation)
    if origin is tuple:
        return st.lists(strategy(args[0], []), max_size=min(bounds.get("max_size", 3), 3)).map(tuple)
    if origin is dict:
        return st.dictionaries(TEXT, strategy(args[1], []), max_size=3)
    if origin is Literal:
        return st.sampled_from(args)
    raise AssertionError(f"no strategy for {annotation!r}")


def model_strategy(cls: type[BaseModel], **given: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    fields = {name: strategy(field.annotation, field.metadata) for name, field in cls.model_fields.items()}
    return st.builds(cls, **{**fields, **given})


EVENTS: st.SearchStrategy[AnyEvent] = st.one_of(
    *(model_strategy(Event, data=model_strategy(cls)) for cls in EVENT_TYPES.values()),
    *(model_strategy(NodeEvent, data=model_strategy(cls)) for cls in NODE_EVENT_TYPES.values()),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=EVENTS)
def test_a_generated_event_of_any_type_is_built_equal_to_its_validated_decoding(event: AnyEvent) -> None:
    record = event_to_json(event)
    line = encode_line(LoggedEvent(event, 3, 17), "ffdl.events")

    built, from_line = built_event(record), built_line(line)

    assert built is not None and from_line is not None
    same(built, any_event_from_json(record))
    same(from_line[0], any_event_from_json(record))
    assert from_line[1:] == ("3:17", "ffdl.events")
    assert read_line(line, 1).event_json == record.decode()


# -- damaged or rewritten events ------------------------------------------------------------------

ODD_VALUES = st.one_of(
    st.sampled_from(
        [
            *(None, True, False, 0, 1, -1, 1.0, 0.5, -0.0, 2**53 + 1, 2**64, 10**30, "", "1", "x" * 3000),
            *([], {}, [1], {"a": 1}, "node-a\n", "Node.A", "C100", "quota", "expired", "operator", "pack"),
            *("2024-05-01T12:00:00", "2024-05-01T12:00:00+24:00", "2024-05-01T12:00:00.123Z"),
            *("2024-05-01 12:00:00Z", "2024-W18-3T12:00:00Z", "2024-05-01T12:00:00z", "0000-01-01T00:00:00Z"),
            *("2024-05-01T24:00:00Z", "2024-05-01T12:00:60Z", "2024-05-01T12:00:00.000000-00:00"),
            *("B5D6BCDC-708E-522E-92F3-88D8FBBE9E1B", "b5d6bcdc708e522e92f388d8fbbe9e1b"),
            *("{b5d6bcdc-708e-522e-92f3-88d8fbbe9e1b}", "urn:uuid:b5d6bcdc-708e-522e-92f3-88d8fbbe9e1b"),
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: the keys and indices that lead to it."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


@st.composite
def damaged(draw: st.DrawFn) -> str:
    """A generated event's JSON with one place replaced, removed or given an unknown neighbour."""
    raw = event_to_dict(draw(EVENTS))
    where = draw(st.sampled_from(paths(raw)[1:]))
    parent: Any = raw
    for step in where[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(("replace", "remove", "add")))
    if action == "replace":
        parent[where[-1]] = draw(ODD_VALUES)
    elif action == "remove":
        del parent[where[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.sampled_from(("extra", "Type", "position")))] = draw(ODD_VALUES)
    else:
        parent.append(draw(ODD_VALUES))
    sort = draw(st.booleans())
    return json.dumps(raw, sort_keys=sort, separators=(",", ":"), allow_nan=True)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=damaged())
def test_the_trusted_path_takes_no_record_validation_refuses_and_builds_only_its_equal(record: str) -> None:
    built = built_event(record)
    try:
        validated = any_event_from_json(record)
    except DecodeError as refused:
        event("refused by validation")
        assert built is None
        with pytest.raises(DecodeError) as again:
            trusted_any_event_from_json(record)
        assert again.value.reason == refused.reason
        return
    event("taken by validation, built" if built is not None else "taken by validation only")
    if built is not None:
        same(built, validated)
    assert trusted_any_event_from_json(record) == validated


def test_a_record_that_is_no_json_or_nested_too_deep_is_refused_with_validation_s_reason() -> None:
    submitted = next(text for _, _, text in GOLDEN_LINES if "JobSubmitted" in text)
    nested = dumps(split_line(submitted, 1)[0]).replace('"env":{}', '"env":' + "[" * 100_000 + "]" * 100_000)
    not_utf8 = (
        dumps(split_line(submitted, 1)[0]).encode().replace(b'"submitted_by":"', b'"submitted_by":"\xff')
    )
    for record in (b"", b"{", b"[]", b'{"type": 3}', b"\xff\xfe", '{"type":"JobQueued"', nested, not_utf8):
        with pytest.raises(DecodeError) as refused:
            any_event_from_json(record)
        assert built_event(record) is None
        with pytest.raises(DecodeError) as again:
            trusted_any_event_from_json(record)
        assert again.value.reason == refused.value.reason


def test_a_golden_log_line_of_an_older_version_is_upcast_by_validation() -> None:
    old = next(
        text for _, _, text in GOLDEN_LINES if '"schema_version":1' in text and "HaltRequested" in text
    )

    assert built_line(old) is None
    assert decode_line(old).event.schema_version == ev.HaltRequested.VERSION
