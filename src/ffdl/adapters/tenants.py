"""Tenants and their API tokens: a JSON file of names, roles and SHA-256 hashes of the tokens.

A token is shown once, when ``ffdl tenants add`` creates it; only its hash is stored. While the
file names no tenant the platform runs open (every request acts as the admin of the tenant
``default``), and says so when it starts. The registry re-reads the file when it changes, so a
tenant added while the platform runs can call it at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TENANT = "default"
_NAME = re.compile(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: a tenant, and whether it may see every tenant (SREs)."""

    tenant: str
    admin: bool

    def may_see(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


OPEN = Principal(DEFAULT_TENANT, admin=True)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TenantError(ValueError):
    pass


class TenantRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, Principal] = {}
        self._records: dict[str, dict[str, object]] = {}

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._by_hash, self._records = None, {}, {}
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        records: dict[str, dict[str, object]] = json.loads(self.path.read_text() or "{}")
        self._records = records
        self._by_hash = {
            str(record["token_sha256"]): Principal(name, bool(record.get("admin", False)))
            for name, record in records.items()
        }
        self._stamp = stamp

    @property
    def open(self) -> bool:
        with self._lock:
            self._reload()
            return not self._records

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

    def add(self, name: str, *, admin: bool = False) -> str:
        """Create a tenant and return its token (the only time it is ever shown)."""
        if not _NAME.match(name):
            raise TenantError(f"tenant name {name!r} must be a DNS label (lower-case letters, digits, '-')")
        token = f"ffdl_{secrets.token_urlsafe(32)}"
        with self._lock:
            self._reload()
            if name in self._records:
                raise TenantError(f"tenant {name!r} exists already")
            records = {**self._records, name: {"token_sha256": _hash(token), "admin": admin}}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(records, handle, indent=2, sort_keys=True)
            tmp.replace(self.path)
            self._stamp = None
        return token
