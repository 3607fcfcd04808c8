"""Where a record sits in the log, and the ``PARTITION:OFFSET`` token that names it outside.

The token is part of the contract: a write through the API returns it (for read-your-writes), the
history rows of the read models and the exported log files carry it, and reports cite it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Position:
    """A record's place: its topic, its partition and its offset there."""

    topic: str
    partition: int
    offset: int

    @property
    def token(self) -> str:
        return self.format_token(self.partition, self.offset)

    @staticmethod
    def format_token(partition: int, offset: int) -> str:
        return f"{partition}:{offset}"

    @staticmethod
    def parse_token(token: object) -> tuple[int, int]:
        """The partition and offset a ``PARTITION:OFFSET`` token names; ValueError for anything else."""
        if isinstance(token, str):
            partition, _, offset = token.partition(":")
            if partition.isdigit() and offset.isdigit():
                return int(partition), int(offset)
        raise ValueError(f"position must look like PARTITION:OFFSET, got {token!r}")

    @classmethod
    def parse(cls, topic: str, token: str) -> Position:
        return cls(topic, *cls.parse_token(token))
