"""Bus adapters and the factory that picks one from a URL."""

from __future__ import annotations

from pathlib import Path

from ffdl.handlers.ports import Bus


def open_bus(url: str, partitions: int) -> Bus:
    """``embedded:///DIR`` (a SQLite log in DIR) or ``kafka://HOST:PORT[,HOST:PORT...]``."""
    if url.startswith("embedded://"):
        from ffdl.adapters.bus.embedded import EmbeddedBus  # noqa: PLC0415 - load only the chosen adapter

        directory = Path(url.removeprefix("embedded://"))
        directory.mkdir(parents=True, exist_ok=True)
        return EmbeddedBus(directory / "log.sqlite", partitions)
    raise ValueError(f"unsupported bus URL {url!r}: use embedded:///DIR or kafka://HOST:PORT")
