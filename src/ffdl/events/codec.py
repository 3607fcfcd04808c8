"""The wire format: JSON values, CloudEvents Kafka-binding headers, and upcasting of old versions.

Decoding picks the payload class by the envelope's ``type`` and brings an older ``schema_version``
up to the current one through the registered upcasters. Anything that cannot be decoded raises
:class:`DecodeError` with a reason, which the bus turns into a dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from ffdl.events.envelope import Command, Event, NodeCommand, NodeEvent, Payload
from ffdl.events.job_commands import COMMAND_TYPES
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.nodes import NODE_COMMAND_TYPES, NODE_EVENT_TYPES

JsonObject = dict[str, Any]
#: Anything on the events topic: a job's event or a node's.
AnyEvent = Event | NodeEvent
#: Anything on the commands topic: a command to a job or to a node.
AnyCommand = Command | NodeCommand
Upcaster = Callable[[JsonObject], JsonObject]


def _not_requeued(data: JsonObject) -> JsonObject:
    """v1 -> v2 of ``HaltJob`` and ``HaltRequested``: a halt before preemption existed never requeued."""
    return {**data, "requeue": False}


#: (type, version) -> function that turns that version's payload into version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("HaltJob", 1): _not_requeued,
    ("HaltRequested", 1): _not_requeued,
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
    return json.dumps(event_to_dict(event), separators=(",", ":"), sort_keys=True).encode()


def command_to_json(command: AnyCommand) -> bytes:
    head = command.model_dump(mode="json", exclude={"data"})
    body = {"type": command.type, "schema_version": command.schema_version, **head}
    body["data"] = command.data.model_dump(mode="json")
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


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
