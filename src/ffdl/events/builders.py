"""Trusted decoding: an event made from its JSON without pydantic validating it again.

The events topic is written only by the owners, which validated every event they appended, so a
reader of the log need not validate each record again: a replay spent most of its decode there.
A *wire decoder* here parses one event type's JSON with msgspec (in C) into structs generated
from the pydantic models, checking on the way every rule the models declare (types, bounds,
lengths, patterns, no unknown field), and then makes the very model instances validation would
make: the same field values of the same types, the same fields set.

It takes only input it knows validation accepts unchanged: JSON types exactly (an ``int`` where an
int is due, never ``1.0`` or ``"1"``), an instant as pydantic writes it (seconds, six-digit
microseconds or none, ``Z`` or an offset), the current schema version. Anything else raises
:class:`msgspec.ValidationError` or :class:`msgspec.DecodeError`, and the caller decodes the record
through validation, which accepts it (upcast, or written some other valid way) or says why not. So
the wire decoder never accepts what validation refuses, and what it makes equals what validation
yields (``tests/unit/test_trusted_decode.py`` proves both over generated events, over
perturbed ones and over every golden log).

The structs are generated once per model class from its fields (as ``dataclasses`` generates
``__init__``). A class whose rules are not all in its field declarations (a field or model
validator, a config other than frozen and extra-forbidding, a type not listed here) is parsed as
raw JSON and validated by pydantic, as the whole of it (``JobSpec``, once per job).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import msgspec
from pydantic import AllowInfNan, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, TzInfo

#: An instant as pydantic writes it: seconds, microseconds in six digits or none, ``Z`` or an offset.
_INSTANT = r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?(Z|[+-][0-9]{2}:[0-9]{2})\Z"
_ZONES: dict[str, TzInfo] = {}
#: What the generated converters refer to by name.
_RUNTIME: dict[str, object] = {
    "new": object.__new__,
    "set_dict": object.__setattr__,
    "set_fields": BaseModel.__dict__["__pydantic_fields_set__"].__set__,
    "set_extra": BaseModel.__dict__["__pydantic_extra__"].__set__,
    "set_private": BaseModel.__dict__["__pydantic_private__"].__set__,
    "UNSET": msgspec.UNSET,
    "loads": json.loads,
}


class _Unsupported(TypeError):
    """A field whose rules the wire structs cannot express: its class is validated by pydantic."""


def instant(text: str) -> datetime:
    """The datetime of an instant as pydantic writes it (the struct's pattern checked the form), with
    pydantic's own time zone object."""
    if text[-1] == "Z":
        local, zone = text[:-1], _UTC
    else:
        local, suffix = text[:-6], text[-6:]
        zone = _ZONES.get(suffix) or _ZONES.setdefault(suffix, _zone(suffix))
    moment = _naive(local)  # with the zone through the constructor: ``replace`` costs three times more
    return datetime(
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
        zone,
    )


def _zone(suffix: str) -> TzInfo:
    """Pydantic's time zone of an offset ``+HH:MM`` (an offset of a day or more is no time zone)."""
    minutes = int(suffix[1:3]) * 60 + int(suffix[4:6])
    if minutes >= 24 * 60:
        raise msgspec.ValidationError(f"no time zone is {suffix}")
    return TzInfo((-60 if suffix[0] == "-" else 60) * minutes)


_UTC = TzInfo(0)
_naive = datetime.fromisoformat
_RUNTIME["instant"] = instant


def _meta(metadata: Iterable[Any]) -> msgspec.Meta | None:
    """The field's bounds, lengths and pattern as msgspec constraints (None: it has none)."""
    rules: dict[str, Any] = {}
    for rule in metadata:
        match rule:
            case annotated_types.Ge(ge=bound):
                rules["ge"] = bound
            case annotated_types.Gt(gt=bound):
                rules["gt"] = bound
            case annotated_types.Le(le=bound):
                rules["le"] = bound
            case annotated_types.Lt(lt=bound):
                rules["lt"] = bound
            case annotated_types.MinLen(min_length=bound):
                rules["min_length"] = bound
            case annotated_types.MaxLen(max_length=bound):
                rules["max_length"] = bound
            case AllowInfNan(allow_inf_nan=False):
                pass  # msgspec's JSON decoder never yields NaN or an infinity ("1e999" is out of range)
            case annotated_types.BaseMetadata() if set(getattr(rule, "__dict__", ())) == {"pattern"}:
                # msgspec searches; validation matches the whole string, so the struct's pattern must too
                rules["pattern"] = rf"\A(?:{rule.__dict__['pattern']})\Z"
            case _:
                raise _Unsupported(f"no wire rule for {rule!r}")
    return msgspec.Meta(**rules) if rules else None


#: How a converter turns a decoded value into what validation gives: an expression in which ``{v}``
#: stands for the value; None where the decoded value is that already.
Conversion = str | None


class _Names:
    """The names a generated converter's code refers to."""

    def __init__(self) -> None:
        self.names: dict[str, object] = dict(_RUNTIME)

    def __call__(self, value: object) -> str:
        name = f"n{len(self.names)}"
        self.names[name] = value
        return name


def _wire_type(annotation: Any, metadata: list[Any], names: _Names) -> tuple[Any, Conversion]:
    """The msgspec type of a field of ``annotation``, and the conversion of what it decodes."""
    if get_origin(annotation) is Annotated:  # an item's own rules (a map's finite values)
        inner, *rules = get_args(annotation)
        flat = [
            rule for given in rules for rule in (given.metadata if isinstance(given, FieldInfo) else (given,))
        ]
        return _wire_type(inner, [*metadata, *flat], names)
    meta = _meta(metadata)
    origin, args = get_origin(annotation), get_args(annotation)
    conversion: Conversion = None
    if origin in (Union, UnionType) and len(args) == 2 and NoneType in args:
        (inner,) = (arg for arg in args if arg is not NoneType)
        wire, convert_inner = _wire_type(inner, metadata, names)
        if convert_inner is not None:
            conversion = f"(None if {{v}} is None else {convert_inner})"
        return wire | None, conversion
    if annotation in (bool, int, float, str, uuid.UUID) or (
        isinstance(annotation, type) and issubclass(annotation, Enum) and issubclass(annotation, str)
    ):
        wire = annotation
    elif annotation is datetime:
        if meta is not None:
            raise _Unsupported("a constrained datetime")
        return Annotated[str, msgspec.Meta(pattern=_INSTANT)], "instant({v})"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if meta is not None:
            raise _Unsupported("a constrained model")
        struct, convert = wire_model(annotation)
        return struct, f"{names(convert)}({{v}})"
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        wire_item, convert_item = _wire_type(args[0], [], names)
        if convert_item is not None:
            conversion = f"tuple([{convert_item.format(v='x')} for x in {{v}}])"
        wire = tuple[wire_item, ...]  # type: ignore[valid-type]
    elif origin is dict and args[0] is str:
        wire_item, convert_item = _wire_type(args[1], [], names)
        if convert_item is not None:
            raise _Unsupported("a map of values to convert")
        wire = dict[str, wire_item]  # type: ignore[valid-type]
    else:
        raise _Unsupported(f"no wire type for {annotation!r}")
    return (Annotated[wire, meta] if meta is not None else wire), conversion


def _buildable(cls: type[BaseModel]) -> bool:
    """Whether every rule of ``cls`` is in its field declarations (no validators, no other config)."""
    decorators = cls.__pydantic_decorators__
    config = {key: value for key, value in cls.model_config.items() if key != "frozen"}
    validators = (
        decorators.validators,
        decorators.field_validators,
        decorators.root_validators,
        decorators.model_validators,
    )
    return (
        config == {"extra": "forbid"}
        and not any(validators)
        and all(field.alias is None and field.validation_alias is None for field in cls.model_fields.values())
    )


def _generate(
    cls: type[BaseModel],
    *,
    payload: tuple[str, type[BaseModel]] | None = None,
    tag: str | None = None,
    version: int | None = None,
    extra: Iterable[str] = (),
) -> tuple[type[msgspec.Struct], Callable[[Any], Any]]:
    """The struct of ``cls`` and the converter of its instances to ``cls``.

    Each optional field decodes to ``UNSET`` when absent, so the converter knows the fields set, as
    validation does. For an envelope: ``payload`` is its payload field and the payload's class,
    ``tag`` its type's name (the struct's tag, under ``type``), ``version`` the schema version it
    must carry, and ``extra`` names string fields the input also has (a log line's ``position`` and
    ``topic``), which the converter leaves out.
    """
    names = _Names()
    names.names["cls"] = cls
    struct_fields: list[tuple[Any, ...]] = []
    values: list[str] = []
    optional: list[tuple[str, str]] = []
    for name, field in cls.model_fields.items():
        if payload is not None and name == payload[0]:
            wire, convert_payload = wire_model(payload[1])
            conversion: Conversion = f"{names(convert_payload)}({{v}})"
        else:
            wire, conversion = _wire_type(field.annotation, field.metadata, names)
        if field.is_required():
            struct_fields.append((name, wire))
            value = f"wire.{name}"
            values.append(f"{name!r}: {conversion.format(v=value) if conversion else value}")
            continue
        struct_fields.append((name, wire | msgspec.UnsetType, msgspec.UNSET))
        if field.default_factory is not None:
            default = f"{names(field.default_factory)}()"
        else:
            assert field.default is not PydanticUndefined
            default = names(field.default)
        value = f"o{len(optional)}"
        optional.append((name, value))
        converted = conversion.format(v=value) if conversion else value
        values.append(f"{name!r}: {default} if {value} is UNSET else {converted}")
    if version is not None:  # an absent version is 1, as validation reads it; any other must be written
        struct_fields.append(
            ("schema_version", Literal[version], 1) if version == 1 else ("schema_version", Literal[version])
        )
    struct_fields += [(name, str) for name in extra]
    lines = ["def convert(wire):"]
    lines += [f"    {value} = wire.{name}" for name, value in optional]
    lines.append(f"    values = {{{', '.join(values)}}}")
    lines.append(f"    given = {set(cls.model_fields)!r}" if cls.model_fields else "    given = set()")
    lines += [f"    if {value} is UNSET: given.discard({name!r})" for name, value in optional]
    lines += [
        "    model = new(cls)",
        "    set_dict(model, '__dict__', values)",
        "    set_fields(model, given)",
        "    set_extra(model, None)",
        "    set_private(model, None)",
        "    return model",
    ]
    exec("\n".join(lines), names.names)
    convert: Callable[[Any], Any] = names.names["convert"]  # type: ignore[assignment]
    options: dict[str, Any] = {"forbid_unknown_fields": True, "kw_only": True}
    if tag is not None:
        options |= {"tag_field": "type", "tag": tag}
    struct = msgspec.defstruct(f"Wire{tag or cls.__name__}", struct_fields, **options)
    return struct, convert


_MODELS: dict[type[BaseModel], tuple[Any, Callable[[Any], Any]]] = {}


def _validated(cls: type[BaseModel]) -> tuple[Any, Callable[[Any], Any]]:
    """A model whose rules are not all declared: its JSON kept raw, then validated by pydantic."""

    def convert(raw: msgspec.Raw) -> BaseModel:
        return cls.model_validate(json.loads(bytes(raw)))

    return msgspec.Raw, convert


def wire_model(cls: type[BaseModel]) -> tuple[Any, Callable[[Any], Any]]:
    """The msgspec type that decodes ``cls``'s JSON, and the converter of what it decodes to ``cls``."""
    found = _MODELS.get(cls)
    if found is None:
        try:
            found = _generate(cls) if _buildable(cls) else _validated(cls)
        except _Unsupported:
            found = _validated(cls)
        _MODELS[cls] = found
    return found


def wire_decoder(
    envelope: type[BaseModel], payload: type[BaseModel], version: int, extra: Iterable[str] = ()
) -> Callable[[bytes | str], tuple[Any, Any]]:
    """``decode(json) -> (model, struct)`` for one event type: the envelope with its payload, made
    without validation (see the module's docstring), and the decoded struct (for ``extra`` fields).

    Raises ``msgspec.ValidationError`` or ``msgspec.DecodeError`` for input it does not take, and
    ``TypeError`` at once for an envelope with rules it cannot check.
    """
    if not _buildable(envelope):
        raise TypeError(f"{envelope.__name__} has rules a wire decoder cannot check")
    struct, convert = _generate(
        envelope, payload=("data", payload), tag=payload.__name__, version=version, extra=tuple(extra)
    )
    decode = msgspec.json.Decoder(struct).decode

    def decoded(value: bytes | str) -> tuple[Any, Any]:
        wire = decode(value)
        return convert(wire), wire

    return decoded
