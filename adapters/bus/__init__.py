"""Bus adapters and the factory that picks one from a URL."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ffdl.handlers.ports import Bus

if TYPE_CHECKING:
    from ffdl.adapters.config import KafkaConfig


def open_bus(
    url: str, partitions: int, *, kafka: KafkaConfig | None = None, topics: Sequence[str] = ()
) -> Bus:
    """``embedded:///DIR`` (a SQLite log in DIR) or ``kafka://HOST:PORT[,HOST:PORT...]``.

    For Kafka, ``kafka`` is how to talk to the brokers (``None``: as this process is configured, by
    the ``FFDL_CONFIG`` file and ``FFDL_KAFKA__*`` variables) and ``topics`` are created at start
    when missing; the embedded log needs neither.
    """
    if url.startswith("embedded://"):
        from ffdl.adapters.bus.embedded import EmbeddedBus  # noqa: PLC0415 - load only the chosen adapter

        directory = Path(url.removeprefix("embedded://"))
        directory.mkdir(parents=True, exist_ok=True)
        return EmbeddedBus(directory / "log.sqlite", partitions)
    if url.startswith("kafka://"):
        from ffdl.adapters.bus.kafka import KafkaBus  # noqa: PLC0415
        from ffdl.adapters.config import Settings  # noqa: PLC0415

        bootstrap = url.removeprefix("kafka://")
        brokers = bootstrap.split(",")
        if not all(host and port.isdigit() for host, _, port in (b.rpartition(":") for b in brokers)):
            raise ValueError(f"bus URL {url!r} must list brokers as kafka://HOST:PORT[,HOST:PORT...]")
        return KafkaBus(bootstrap, partitions, settings=kafka or Settings().kafka, topics=topics)
    raise ValueError(f"unsupported bus URL {url!r}: use embedded:///DIR or kafka://HOST:PORT")
