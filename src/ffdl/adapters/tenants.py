"""Tenants and their API tokens: a JSON file of names, roles, SHA-256 hashes of the tokens and
priority ceilings (``max_priority``: the highest priority a tenant's jobs may have; admins have none).

A token is shown once, when ``ffdl tenants add`` creates it; only its hash is stored. The file is
written whole to a temporary file, fsynced, renamed over the old one and the directory fsynced, so
it is always either the old file or the new one, also after a crash.

Fail closed: the API runs open (every request acts as the admin of the tenant ``default``) only
when it was started so on purpose (``ffdl up --open``, ``ffdl demo``: ``allow_open``) and the file
names no tenant. Otherwise a missing or empty file lets nobody in, and ``ffdl up`` refuses to serve
the API at all (:meth:`TenantRegistry.unservable`). A file that cannot be read or parsed never
opens the API, even with ``--open``: it lets nobody in until it is fixed. The registry re-reads the
file when it changes, so a tenant added while the platform runs can call it at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ffdl.core import authorization
from ffdl.core.tenancy import DEFAULT_MAX_PRIORITY

log = structlog.get_logger(__name__)

DEFAULT_TENANT = "default"
_NAME = re.compile(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: a tenant, and whether it may see every tenant (SREs)."""

    tenant: str
    admin: bool

    def may_see(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant

    def on_the_log(self) -> authorization.Principal:
        """Whom the commands of this caller's requests are sent for: an admin, or its tenant."""
        if self.admin:
            return authorization.Principal.admin(self.tenant)
        return authorization.Principal.tenant(self.tenant)


OPEN = Principal(DEFAULT_TENANT, admin=True)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TenantError(ValueError):
    pass


class TenantRegistry:
    def __init__(self, path: Path, *, allow_open: bool = False) -> None:
        self.path = path
        self._allow_open = allow_open
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, Principal] = {}
        self._records: dict[str, dict[str, object]] = {}
        self._problem: str | None = None

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._by_hash, self._records, self._problem = None, {}, {}, None
            return
        except OSError as error:
            self._fail(None, f"cannot read {self.path}: {error}")
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            records = _records(json.loads(self.path.read_text() or "{}"))
        except (OSError, ValueError) as error:
            self._fail(stamp, f"cannot read {self.path}: {error}")
            return
        self._records, self._problem = records, None
        self._by_hash = {
            str(record["token_sha256"]): Principal(name, bool(record.get("admin", False)))
            for name, record in records.items()
        }
        self._stamp = stamp

    def _fail(self, stamp: tuple[int, int] | None, problem: str) -> None:
        """An unreadable file: nobody is let in (never open) until it can be read again."""
        if problem != self._problem:
            log.error("tenants file unreadable: no request is let in until it is fixed", problem=problem)
        self._stamp, self._by_hash, self._records, self._problem = stamp, {}, {}, problem

    @property
    def open(self) -> bool:
        """Whether every request acts as the open default: only when allowed and no tenant exists."""
        with self._lock:
            self._reload()
            return self._allow_open and not self._records and self._problem is None

    def unservable(self) -> str | None:
        """Why the API may not be served with these tenants, or None when it may."""
        with self._lock:
            self._reload()
            if self._problem is not None:
                return f"{self._problem}; the API never runs open for a tenants file it cannot read"
            if not self._records and not self._allow_open:
                return (
                    f"no tenant in {self.path}: the API would be open to anyone who reaches it. Add one "
                    "with `ffdl tenants add NAME --admin`, or start with --open on purpose (a laptop)"
                )
            return None

    def names(self) -> list[str]:
        with self._lock:
            self._reload()
            return sorted(self._records)

    def authenticate(self, token: str) -> Principal | None:
        digest = _hash(token)
        with self._lock:
            self._reload()
            for known, principal in self._by_hash.items():
                if hmac.compare_digest(known, digest):
                    return principal
        return None

    def max_priority(self, name: str) -> int | None:
        """The highest priority the tenant ``name``'s jobs may have: its record's ``max_priority``,
        else :data:`~ffdl.core.tenancy.DEFAULT_MAX_PRIORITY` (also for a tenant the file does not
        name, one writing its own commands topic); None for an admin (no ceiling). A file that
        cannot be read gives every tenant the default: it never lifts a ceiling."""
        with self._lock:
            self._reload()
            record = self._records.get(name, {})
        if record.get("admin", False):
            return None
        ceiling = record.get("max_priority")
        return ceiling if isinstance(ceiling, int) and not isinstance(ceiling, bool) else DEFAULT_MAX_PRIORITY

    def add(self, name: str, *, admin: bool = False, max_priority: int | None = None) -> str:
        """Create a tenant and return its token (the only time it is ever shown); ``max_priority``:
        its jobs' priority ceiling (default :data:`~ffdl.core.tenancy.DEFAULT_MAX_PRIORITY`)."""
        if not _NAME.match(name):
            raise TenantError(f"tenant name {name!r} must be a DNS label (lower-case letters, digits, '-')")
        token = f"ffdl_{secrets.token_urlsafe(32)}"
        record: dict[str, object] = {"token_sha256": _hash(token), "admin": admin}
        if max_priority is not None:
            record["max_priority"] = _ceiling(max_priority)
        with self._lock:
            self._reload()
            if self._problem is not None:
                raise TenantError(f"{self._problem}: fix it before adding a tenant")
            if name in self._records:
                raise TenantError(f"tenant {name!r} exists already")
            self._write({**self._records, name: record})
        return token

    def set_max_priority(self, name: str, max_priority: int) -> None:
        """Set the tenant ``name``'s priority ceiling (an admin's decision: the CLI, not the API)."""
        with self._lock:
            self._reload()
            if self._problem is not None:
                raise TenantError(f"{self._problem}: fix it before changing a tenant")
            if name not in self._records:
                raise TenantError(f"no tenant {name!r}")
            record = {**self._records[name], "max_priority": _ceiling(max_priority)}
            self._write({**self._records, name: record})

    def _write(self, records: dict[str, dict[str, object]]) -> None:
        _write_durably(self.path, json.dumps(records, indent=2, sort_keys=True))
        self._stamp = None


def _ceiling(max_priority: int) -> int:
    """A priority ceiling within the priorities a job may have (-1000 to 1000)."""
    if not -1000 <= max_priority <= 1000:
        raise TenantError(f"a priority ceiling is from -1000 to 1000, not {max_priority}")
    return max_priority


def _records(loaded: Any) -> dict[str, dict[str, object]]:
    """The tenants of a parsed file, or ValueError for a file that is not a tenants file."""
    if not isinstance(loaded, dict) or not all(
        isinstance(record, dict) and isinstance(record.get("token_sha256"), str) for record in loaded.values()
    ):
        raise ValueError(
            "not a tenants file: an object of {name: {token_sha256, admin, max_priority}} is expected"
        )
    return {str(name): dict(record) for name, record in loaded.items()}


def _write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably: a temporary file in the same directory,
    fsynced, renamed over ``path``, and the directory fsynced so the rename itself survives a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:  # mkstemp: mode 0600, created exclusively
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
