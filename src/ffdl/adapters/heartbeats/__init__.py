"""Heartbeat stores (architecture §6): which adapter a URL names, and the key layout they hold.

* ``embedded:///abs/path/heartbeats.sqlite``: :class:`EmbeddedHeartbeatStore`, a SQLite file shared
  by the platform and its learner agents on one machine;
* ``etcd://HOST:PORT``: :class:`EtcdHeartbeatStore`, logged in with ``credentials`` when etcd's auth is on.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from ffdl.adapters.heartbeats.embedded import EmbeddedHeartbeatStore
from ffdl.adapters.heartbeats.etcd import EtcdHeartbeatStore
from ffdl.adapters.heartbeats.etcd_auth import EtcdCredentials, EtcdJobUsers
from ffdl.adapters.heartbeats.keys import JOBS_PREFIX, ParsedKey, exit_key, learner_key, parse_key
from ffdl.handlers.ports import HeartbeatStore

__all__ = [
    "JOBS_PREFIX",
    "EmbeddedHeartbeatStore",
    "EtcdCredentials",
    "EtcdHeartbeatStore",
    "EtcdJobUsers",
    "ParsedKey",
    "exit_key",
    "learner_key",
    "open_job_logins",
    "open_store",
    "parse_key",
]

_ACCEPTED = "embedded:///ABSOLUTE/PATH.sqlite or etcd://HOST:PORT"


def open_store(url: str, credentials: EtcdCredentials | None = None) -> HeartbeatStore:
    """The heartbeat store that ``url`` names; nothing is connected or opened until first use."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"heartbeat store URL {url!r} takes no query or fragment; use {_ACCEPTED}")
    if parts.scheme == "embedded" and not parts.netloc and parts.path.startswith("/"):
        return EmbeddedHeartbeatStore(Path(parts.path))
    host, port = _etcd_address(url)
    return EtcdHeartbeatStore(host, port, credentials=credentials)


def open_job_logins(url: str, credentials: EtcdCredentials | None) -> EtcdJobUsers | None:
    """Per-job logins for learners' agents, where the store at ``url`` authenticates (an etcd the
    platform logs in to with ``credentials``); None where it does not."""
    if credentials is None or not url.startswith("etcd://"):
        return None
    host, port = _etcd_address(url)
    return EtcdJobUsers(host, port, credentials)


def _etcd_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme == "etcd" and parts.path in ("", "/") and not parts.query and not parts.fragment:
        try:
            host, port = parts.hostname, parts.port
        except ValueError as error:
            raise ValueError(f"heartbeat store URL {url!r} has a bad port; use {_ACCEPTED}") from error
        if host and port:
            return host, port
    raise ValueError(f"unsupported heartbeat store URL {url!r}; use {_ACCEPTED}")
