"""JSON Schemas of every event and command, one file per type and version under ``schemas/``.

A schema file, once written for a version, never changes: a payload change needs a version bump
(and an upcaster from the old version), which the test suite enforces. After a bump, run
``python -m ffdl.events.schema_export`` to write the new version's file next to the old ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from ffdl.events.envelope import Payload
from ffdl.events.job_commands import COMMAND_TYPES
from ffdl.events.job_events import EVENT_TYPES
from ffdl.events.nodes import NODE_COMMAND_TYPES, NODE_EVENT_TYPES

SCHEMA_DIR = Path(__file__).resolve().with_name("schemas")


def all_payload_types() -> dict[str, type[Payload]]:
    return {
        **{f"event.{k}": v for k, v in EVENT_TYPES.items()},
        **{f"command.{k}": v for k, v in COMMAND_TYPES.items()},
        **{f"event.{k}": v for k, v in NODE_EVENT_TYPES.items()},
        **{f"command.{k}": v for k, v in NODE_COMMAND_TYPES.items()},
    }


def schema_filename(key: str, cls: type[Payload]) -> str:
    return f"{key}.v{cls.VERSION}.json"


def render_schema(cls: type[Payload]) -> str:
    schema = cls.model_json_schema()
    schema["x-ffdl-type"] = cls.type_name()
    schema["x-ffdl-schema-version"] = cls.VERSION
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def export_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write the current schema of every type; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for key, cls in all_payload_types().items():
        path = directory / schema_filename(key, cls)
        path.write_text(render_schema(cls))
        written.append(path)
    return written


if __name__ == "__main__":
    for written in export_schemas():
        print(written)
