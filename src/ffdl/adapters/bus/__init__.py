"""Bus adapters and the factory that picks one from a URL."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ffdl.handlers.ports import Bus

if TYPE_CHECKING:
    from ffdl.adapters.bus.kafka_config import KafkaConfig


def open_bus(
    url: str, partitions: int, *, kafka: KafkaConfig | None = None, topics: Sequence[str] = ()
) -> Bus:
    """``embedded:///DIR`` (a SQLite log in DIR) or ``kafka://HOST:PORT[,HOST:PORT...]``.

    For Kafka, ``kafka`` is how to talk to the brokers (``None``: the defaults, one local broker
    with no security; the composition root passes the configured ``Settings.kafka``) and
    ``topics`` are created at start when missing; the embedded log needs neither.
    """
    if url.startswith("embedded://"):
        from ffdl.adapters.bus.embedded import EmbeddedBus  # noqa: PLC0415 - load only the chosen adapter

        directory = Path(url.removeprefix("embedded://"))
        directory.mkdir(parents=True, exist_ok=True)
        return EmbeddedBus(directory / "log.sqlite", partitions)
    if url.startswith("kafka://"):
        from ffdl.adapters.bus.kafka import KafkaBus  # noqa: PLC0415

        bootstrap = url.removeprefix("kafka://")
        brokers = bootstrap.split(",")
        if not all(host and port.isdigit() for host, _, port in (b.rpartition(":") for b in brokers)):
            raise ValueError(f"bus URL {url!r} must list brokers as kafka://HOST:PORT[,HOST:PORT...]")
        return KafkaBus(bootstrap, partitions, settings=kafka, topics=topics)
    raise ValueError(f"unsupported bus URL {url!r}: use embedded:///DIR or kafka://HOST:PORT")
