"""Heartbeat stores (DESIGN §6): which adapter a URL names, and the key layout they hold.

* ``embedded:///abs/path/heartbeats.sqlite``: :class:`EmbeddedHeartbeatStore`, a SQLite file shared
  by the platform and its learner agents on one machine;
* ``etcd://HOST:PORT``: :class:`EtcdHeartbeatStore`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from ffdl.adapters.heartbeats.embedded import EmbeddedHeartbeatStore
from ffdl.adapters.heartbeats.etcd import EtcdHeartbeatStore
from ffdl.adapters.heartbeats.keys import JOBS_PREFIX, ParsedKey, exit_key, learner_key, parse_key
from ffdl.handlers.ports import HeartbeatStore

__all__ = [
    "JOBS_PREFIX",
    "EmbeddedHeartbeatStore",
    "EtcdHeartbeatStore",
    "ParsedKey",
    "exit_key",
    "learner_key",
    "open_store",
    "parse_key",
]

_ACCEPTED = "embedded:///ABSOLUTE/PATH.sqlite or etcd://HOST:PORT"


def open_store(url: str) -> HeartbeatStore:
    """The heartbeat store that ``url`` names; nothing is connected or opened until first use."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"heartbeat store URL {url!r} takes no query or fragment; use {_ACCEPTED}")
    if parts.scheme == "embedded" and not parts.netloc and parts.path.startswith("/"):
        return EmbeddedHeartbeatStore(Path(parts.path))
    if parts.scheme == "etcd" and parts.path in ("", "/"):
        try:
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise ValueError(f"heartbeat store URL {url!r} has a bad port; use {_ACCEPTED}") from error
        if host and port:
            return EtcdHeartbeatStore(host, port)
    raise ValueError(f"unsupported heartbeat store URL {url!r}; use {_ACCEPTED}")
