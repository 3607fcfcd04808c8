"""The wire format: JSON values, CloudEvents Kafka-binding headers, and upcasting of old versions.

Decoding picks the payload class by the envelope's ``type`` and brings an older ``schema_version``
up to the current one through the registered upcasters. Anything that cannot be decoded raises
:class:`DecodeError` with a reason, which the bus turns into a dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from ffdl.events.builders import wire_decoder
from ffdl.events.envelope import Command, Event, NodeCommand, NodeEvent, Payload
from ffdl.events.job_commands import COMMAND_TYPES
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.nodes import NODE_COMMAND_TYPES, NODE_EVENT_TYPES
from ffdl.events.reports import bound_metrics

JsonObject = dict[str, Any]
#: Anything on the events topic: a job's event or a node's.
AnyEvent = Event | NodeEvent
#: Anything on the commands topic: a command to a job or to a node.
AnyCommand = Command | NodeCommand
Upcaster = Callable[[JsonObject], JsonObject]


def _not_requeued(data: JsonObject) -> JsonObject:
    """v1 -> v2 of ``HaltJob`` and ``HaltRequested``: a halt before preemption existed never requeued."""
    return {**data, "requeue": False}


def _for_another_tenant(data: JsonObject) -> JsonObject:
    """v2 -> v3 of ``HaltJob`` and ``HaltRequested``: a preemption before v3 is counted as one for
    another tenant's job (towards the loop guard), as every preemption then was."""
    return {**data, "for_own_tenant": False}


def _spec_defaults(data: JsonObject) -> JsonObject:
    """v1 -> v2 of ``SubmitJob`` and ``JobSubmitted``: a v1 spec knew no launcher, nproc_per_node,
    keep_checkpoints nor stop_grace_s; their defaults are what a v1 job meant (its command as it is,
    checkpoints kept as the platform keeps them, the platform's grace)."""
    return data


def _bounded_progress(data: JsonObject) -> JsonObject:
    """v1 -> v2 of ``ReportProgress`` and ``LearnerProgressed``: the metrics brought inside the bounds
    (a v1 log may hold a ``NaN`` loss), each drop with its reason in ``dropped``."""
    bounded = bound_metrics(data.get("metrics"))
    return {**data, "metrics": bounded.metrics, "dropped": list(bounded.dropped)}


def _bounded_result(data: JsonObject) -> JsonObject:
    """v1 -> v2 of ``FinishStoring`` and ``JobCompleted``: the result's metrics inside the bounds."""
    result = data.get("result")
    if not isinstance(result, dict):
        return data  # validation says why
    return {**data, "result": {**result, "metrics": bound_metrics(result.get("metrics")).metrics}}


#: (type, version) -> function that turns that version's payload into version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("HaltJob", 1): _not_requeued,
    ("HaltRequested", 1): _not_requeued,
    ("HaltJob", 2): _for_another_tenant,
    ("HaltRequested", 2): _for_another_tenant,
    ("SubmitJob", 1): _spec_defaults,
    ("JobSubmitted", 1): _spec_defaults,
    ("ReportProgress", 1): _bounded_progress,
    ("LearnerProgressed", 1): _bounded_progress,
    ("FinishStoring", 1): _bounded_result,
    ("JobCompleted", 1): _bounded_result,
}

CE_SPECVERSION = "1.0"

P = TypeVar("P", bound=Payload)


class DecodeError(ValueError):
    """Bytes that are not a valid event or command; ``reason`` says why, for the dead-letter record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _upcast(type_name: str, version: int, current: int, data: JsonObject) -> JsonObject:
    if version > current:
        raise DecodeError(f"{type_name} schema_version {version} is newer than this platform's {current}")
    while version < current:
        upcaster = UPCASTERS.get((type_name, version))
        if upcaster is None:
            raise DecodeError(f"no upcaster for {type_name} schema_version {version}")
        data = upcaster(data)
        version += 1
    return data


def _decode_payload(registry: Mapping[str, type[P]], raw: JsonObject) -> P:
    type_name = raw.pop("type", None)
    version = raw.pop("schema_version", 1)
    if not isinstance(type_name, str):
        raise DecodeError("missing 'type'")
    cls = registry.get(type_name)
    if cls is None:
        raise DecodeError(f"unknown type {type_name!r}")
    if not isinstance(version, int):
        raise DecodeError("'schema_version' must be an integer")
    data = raw.get("data", {})
    if not isinstance(data, dict):
        raise DecodeError("'data' must be an object")
    try:
        return cls.model_validate(_upcast(type_name, version, cls.VERSION, data))
    except ValidationError as exc:
        raise DecodeError(f"invalid {type_name}: {_first_error(exc)}") from exc


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "(root)"
    return f"{where}: {error['msg']}"


#: How deeply a record's JSON may nest (objects and arrays): the deepest payload has 5 levels, so a
#: deeper record is damage or an attack on every reader's stack, refused before it reaches a model.
MAX_DEPTH = 32


def _loads(value: bytes | str) -> JsonObject:
    try:
        raw = json.loads(value)
    except RecursionError as exc:  # nested beyond the parser's own stack
        raise DecodeError(f"not JSON this platform reads: nested deeper than {MAX_DEPTH} levels") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DecodeError("not a JSON object")
    if _depth_exceeds(raw, MAX_DEPTH):
        raise DecodeError(f"not JSON this platform reads: nested deeper than {MAX_DEPTH} levels")
    return raw


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (walked without recursion of ours)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                pending.append((child, depth + 1))
    return False


def _type_of(raw: JsonObject) -> str | None:
    """The record's ``type`` (None when absent: the payload decoder says so); anything but a string
    is refused here, before it is looked up in a registry."""
    type_name = raw.get("type")
    if type_name is not None and not isinstance(type_name, str):
        raise DecodeError(f"'type' must be a string, got {type(type_name).__name__}")
    return type_name


def any_event_from_dict(raw: JsonObject) -> AnyEvent:
    """Decode one job or node event from its JSON object form (as in an exported log line)."""
    raw = dict(raw)
    if _type_of(raw) in NODE_EVENT_TYPES:
        raw["data"] = _decode_payload(NODE_EVENT_TYPES, raw)
        return _envelope(NodeEvent, raw, "node event")
    raw["data"] = _decode_payload(EVENT_TYPES, raw)
    return _envelope(Event, raw, "event")


def event_from_dict(raw: JsonObject) -> Event:
    """Decode one job event; a node event is a :class:`DecodeError` here."""
    event = any_event_from_dict(raw)
    if not isinstance(event, Event):
        raise DecodeError(f"{event.type} is a node event, not a job event")
    return event


def any_event_from_json(value: bytes | str) -> AnyEvent:
    return any_event_from_dict(_loads(value))


# -- the trusted path: events as their owners wrote them ------------------------------------------

#: The wire decoder of each event type, for a record and for a log line (with position and topic).
_RECORD_DECODERS: dict[str, Callable[[bytes | str], tuple[Any, Any]]] = {}
_LINE_DECODERS: dict[str, Callable[[bytes | str], tuple[Any, Any]]] = {}
for _envelope_cls, _registry in ((Event, EVENT_TYPES), (NodeEvent, NODE_EVENT_TYPES)):
    for _name, _payload_cls in _registry.items():
        _RECORD_DECODERS[_name] = wire_decoder(_envelope_cls, _payload_cls, _payload_cls.VERSION)
        _LINE_DECODERS[_name] = wire_decoder(
            _envelope_cls, _payload_cls, _payload_cls.VERSION, extra=("position", "topic")
        )


def _written_type(value: bytes | str) -> str:
    """The event type a record names where the codec writes it, the last key (keys are sorted); "" if none."""
    if isinstance(value, bytes):
        start = value.rfind(b'"type":"') + 8
        end = value.find(b'"', start)
        return value[start:end].decode("ascii", errors="replace") if start >= 8 and end > 0 else ""
    start = value.rfind('"type":"') + 8
    end = value.find('"', start)
    return value[start:end] if start >= 8 and end > 0 else ""


def _built(
    decoders: dict[str, Callable[[bytes | str], tuple[Any, Any]]], value: bytes | str
) -> tuple[Any, Any] | None:
    """The event of ``value`` and its decoded struct, made without validation, when ``value`` is an event
    of the current schema version as the codec writes it; None for anything else, which only validation
    may decide on (see :mod:`ffdl.events.builders`)."""
    decode = decoders.get(_written_type(value))
    if decode is None:
        return None
    try:
        return decode(value)
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors; nested beyond the stack
        return None


def built_event(value: bytes | str) -> AnyEvent | None:
    """The event of a record as its owner wrote it (current schema version, the codec's JSON), made
    without validating it again; None for a record only validation may decide on."""
    built = _built(_RECORD_DECODERS, value)
    return None if built is None else cast(AnyEvent, built[0])


def built_line(text: str) -> tuple[AnyEvent, str, str] | None:
    """The event of a log line as ``ffdl export`` writes it, with the line's ``position`` and
    ``topic``, made without validation; None for a line only validation may decide on."""
    built = _built(_LINE_DECODERS, text)
    if built is None:
        return None
    event, wire = built
    return cast(AnyEvent, event), wire.position, wire.topic


def trusted_any_event_from_json(value: bytes | str) -> AnyEvent:
    """:func:`any_event_from_json` for a trusted record (the events topic, written only by owners, who
    validated what they appended): made without validating again when it is of the current version
    as the codec writes it, else decoded through validation (upcast, or refused with the reason)."""
    return built_event(value) or any_event_from_json(value)


def event_from_json(value: bytes | str) -> Event:
    return event_from_dict(_loads(value))


def any_command_from_json(value: bytes | str) -> AnyCommand:
    raw = _loads(value)
    if _type_of(raw) in NODE_COMMAND_TYPES:
        raw["data"] = _decode_payload(NODE_COMMAND_TYPES, raw)
        return _envelope(NodeCommand, raw, "node command")
    raw["data"] = _decode_payload(COMMAND_TYPES, raw)
    return _envelope(Command, raw, "command")


def command_from_json(value: bytes | str) -> Command:
    """Decode one command to a job; a node command is a :class:`DecodeError` here."""
    command = any_command_from_json(value)
    if not isinstance(command, Command):
        raise DecodeError(f"{command.type} is a node command, not a job command")
    return command


E = TypeVar("E", Event, NodeEvent, Command, NodeCommand)


def _envelope(cls: type[E], raw: JsonObject, what: str) -> E:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise DecodeError(f"invalid {what} envelope: {_first_error(exc)}") from exc


def event_to_dict(event: AnyEvent) -> JsonObject:
    head = event.model_dump(mode="json", exclude={"data"})
    return {
        "type": event.type,
        "schema_version": event.schema_version,
        **head,
        "data": event.data.model_dump(mode="json"),
    }


def event_to_json(event: AnyEvent) -> bytes:
    """The event as the log holds it; a non-finite number (which the models refuse) raises ValueError
    here rather than reaching the log as a ``NaN`` token."""
    return json.dumps(event_to_dict(event), separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def command_to_json(command: AnyCommand) -> bytes:
    head = command.model_dump(mode="json", exclude={"data"})
    body = {"type": command.type, "schema_version": command.schema_version, **head}
    body["data"] = command.data.model_dump(mode="json")
    return json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def cloudevent_headers(event: AnyEvent, source: str) -> list[tuple[str, bytes]]:
    """CloudEvents Kafka protocol binding, binary mode attributes (``ce_*`` headers)."""
    return [
        ("ce_specversion", CE_SPECVERSION.encode()),
        ("ce_id", str(event.event_id).encode()),
        ("ce_type", f"io.ffdl.{event.type}.v{event.schema_version}".encode()),
        ("ce_source", source.encode()),
        ("ce_time", event.occurred_at.isoformat().encode()),
        ("ce_subject", event.key.encode()),
        ("content-type", b"application/json"),
    ]


def command_headers(command: AnyCommand, source: str) -> list[tuple[str, bytes]]:
    return [
        ("ce_specversion", CE_SPECVERSION.encode()),
        ("ce_id", str(command.command_id).encode()),
        ("ce_type", f"io.ffdl.command.{command.type}.v{command.schema_version}".encode()),
        ("ce_source", source.encode()),
        ("ce_time", command.issued_at.isoformat().encode()),
        ("ce_subject", command.key.encode()),
        ("content-type", b"application/json"),
    ]
