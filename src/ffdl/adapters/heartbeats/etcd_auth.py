"""etcd with authentication: the platform's credentials, token expiry, and a user per job.

With etcd's auth on, a client logs in with a name and password and gets a token that it sends with
every request. The token expires when unused for etcd's ``--auth-token-ttl`` (five minutes by
default), which an idle platform (a monitor waiting on a watch, an API nobody asks) easily is; aetcd
does not log in again by itself, so :func:`forget_expired_token` closes the client on "invalid auth
token", the next call logs in again, and the caller sees a passing outage it already retries.

:class:`EtcdJobUsers` gives each job its own etcd user, whose only role grants read and write on the
job's own learner and exit keys (``/ffdl/jobs/<job>/learners/``, ``/ffdl/jobs/<job>/exits/``): what a
learner's agent writes. Training code that reads the credentials out of its pod can therefore write
its own job's heartbeats and exits and nothing else: not another job's keys, not the leader keys.
Managing users needs etcd's ``root`` role, so only the platform's workers hold such credentials.
Users and roles are created idempotently (an existing one is updated), so a repeated launch is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aetcd
from aetcd import rpc
from aetcd.exceptions import UnauthenticatedError
from pydantic import BaseModel, SecretStr

from ffdl.adapters.heartbeats.keys import JOBS_PREFIX

# gRPC backs off reconnecting up to two minutes by default; an etcd that is back should be used
# again within a second.
MAX_RECONNECT_BACKOFF_MS = 1000
JOB_USER_PREFIX = "ffdl-job-"


@dataclass(frozen=True, slots=True)
class EtcdCredentials:
    """A name and password etcd knows (``repr`` keeps the password out of logs)."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"EtcdCredentials(username={self.username!r})"


class EtcdConfig(BaseModel):
    """The platform's etcd login, when etcd's auth is on: ``FFDL_ETCD__USERNAME``, ``FFDL_ETCD__PASSWORD``."""

    username: str | None = None
    password: SecretStr | None = None

    def credentials(self) -> EtcdCredentials | None:
        if self.username is None or self.password is None:
            return None
        return EtcdCredentials(self.username, self.password.get_secret_value())


def etcd_client(host: str, port: int, timeout_s: float, credentials: EtcdCredentials | None) -> aetcd.Client:
    """An aetcd client that logs in with ``credentials`` (if any) when it connects."""
    return aetcd.Client(
        host,
        port,
        username=credentials.username if credentials else None,
        password=credentials.password if credentials else None,
        timeout=timeout_s,
        options={"grpc.max_reconnect_backoff_ms": MAX_RECONNECT_BACKOFF_MS},
    )


async def forget_expired_token(client: aetcd.Client, error: aetcd.ClientError) -> bool:
    """True when ``error`` says the client's token expired; the client then logs in again on its next call."""
    if not isinstance(error, UnauthenticatedError) or "invalid auth token" not in str(error):
        return False
    await client.close()
    return True


def job_username(job_id: str) -> str:
    """The etcd user (and role) of one job's learners."""
    return f"{JOB_USER_PREFIX}{job_id}"


def job_key_ranges(job_id: str) -> list[tuple[bytes, bytes]]:
    """The ``[key, range_end)`` ranges a job's learners may write: their heartbeats and their exits."""
    prefixes = [f"{JOBS_PREFIX}{job_id}/learners/", f"{JOBS_PREFIX}{job_id}/exits/"]
    return [(prefix.encode(), _prefix_end(prefix.encode())) for prefix in prefixes]


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's end of the range of every key starting with ``prefix`` (a prefix ending in '/': '0')."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdJobUsers:
    """Creates and removes the per-job etcd users, logged in as a user with etcd's ``root`` role."""

    def __init__(self, host: str, port: int, credentials: EtcdCredentials, *, timeout_s: float = 2.0) -> None:
        self._client = etcd_client(host, port, timeout_s, credentials)
        self._timeout_s = timeout_s

    async def grant(self, job_id: str, password: str) -> str:
        """Make (or update) the job's user with ``password`` and its role; returns the user's name."""
        name = job_username(job_id)
        await self._auth("RoleAdd", rpc.AuthRoleAddRequest(name=name), exists_ok=True)
        for key, range_end in job_key_ranges(job_id):
            permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=key, range_end=range_end)
            await self._auth(
                "RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=name, perm=permission)
            )
        added = await self._auth(
            "UserAdd", rpc.AuthUserAddRequest(name=name, password=password), exists_ok=True
        )
        if not added:
            await self._auth(
                "UserChangePassword", rpc.AuthUserChangePasswordRequest(name=name, password=password)
            )
        await self._auth("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=name, role=name))
        return name

    async def revoke(self, job_id: str) -> None:
        """Remove the job's user and role (what is already gone is fine)."""
        name = job_username(job_id)
        await self._auth("UserDelete", rpc.AuthUserDeleteRequest(name=name), missing_ok=True)
        await self._auth("RoleDelete", rpc.AuthRoleDeleteRequest(role=name), missing_ok=True)

    async def close(self) -> None:
        await self._client.close()

    async def _auth(
        self, method: str, request: Any, *, exists_ok: bool = False, missing_ok: bool = False
    ) -> bool:
        """One call of etcd's Auth service, logged in again once if the token expired; False when it
        found the thing already there (``exists_ok``) or already gone (``missing_ok``)."""
        try:
            return await self._auth_once(method, request, exists_ok=exists_ok, missing_ok=missing_ok)
        except rpc.AioRpcError as error:
            if "invalid auth token" not in (error.details() or ""):
                raise
            await self._client.close()
        return await self._auth_once(method, request, exists_ok=exists_ok, missing_ok=missing_ok)

    async def _auth_once(self, method: str, request: Any, *, exists_ok: bool, missing_ok: bool) -> bool:
        await self._client.connect()
        stub = rpc.AuthStub(self._client.channel)
        try:
            await getattr(stub, method)(request, timeout=self._timeout_s, metadata=self._client.metadata)
        except rpc.AioRpcError as error:
            details = error.details() or ""
            if (exists_ok and "already exists" in details) or (missing_ok and "not found" in details):
                return False
            raise
        return True
