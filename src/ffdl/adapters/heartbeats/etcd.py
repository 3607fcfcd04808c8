"""The heartbeat store on etcd v3, through ``aetcd`` (an asyncio gRPC client).

The port is etcd's own model, so the mapping is direct: leases are etcd leases (TTLs rounded up to
whole seconds, as etcd counts them, and never below etcd's own minimum), keys are bound to them with
``put(lease=...)``, a snapshot is a prefix range read with the revision from its response header,
and a watch is an etcd prefix watch from a start revision (inclusive).

Failures are told apart, because the monitor must never take an outage for a death:

* the request was wrong (bad argument, failed precondition, no permission): aetcd's error as it is;
* etcd says the lease does not exist: ``keepalive`` returns False, ``revoke`` is a no-op, ``put``
  raises :class:`LookupError`;
* anything else (refused, timed out, stream broken, compacted revision, an auth token that expired
  or an auth change racing the request, :mod:`~ffdl.adapters.heartbeats.etcd_auth`):
  :class:`StoreUnavailable`.

With ``credentials`` the store logs in to an etcd whose auth is on (the platform's user, or a
learner's per-job user) and logs in again when its token expires.

Concurrency: one aetcd client, that is one gRPC channel, per store, shared by every coroutine on
the event loop that first uses it; gRPC multiplexes their calls and every call carries a deadline of
``timeout_s``, so a frozen or partitioned etcd shows up as :class:`StoreUnavailable` after that
long, never as a hang. A frozen etcd keeps its TCP connection open, so a watch stream on it just
goes quiet, which looks like "no changes"; a watch therefore probes etcd with a read whenever it has
been idle for ``timeout_s`` and raises :class:`StoreUnavailable` when the probe fails. Its caller
resyncs with ``snapshot`` and watches again from the snapshot's revision + 1.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Awaitable
from contextlib import suppress
from typing import Any, NoReturn

import aetcd
import structlog
from aetcd import rpc

from ffdl.adapters.heartbeats.etcd_auth import EtcdCredentials, etcd_client, forget_expired_token
from ffdl.handlers.ports import Snapshot, StoreUnavailable, WatchEvent, WatchKind

log = structlog.get_logger(__name__)

# Codes that mean the request itself was wrong: retrying cannot help, so they are not outages.
_CALLER_ERRORS = frozenset(
    {
        rpc.StatusCode.INVALID_ARGUMENT,
        rpc.StatusCode.FAILED_PRECONDITION,
        rpc.StatusCode.UNAUTHENTICATED,
        rpc.StatusCode.PERMISSION_DENIED,
    }
)

_WATCH_KINDS = {"PUT": WatchKind.PUT, "DELETE": WatchKind.DELETE}
#: etcd refuses a request that raced a change of its users or roles; the same request then succeeds.
_AUTH_CHANGED = "revision of auth store is old"


def _text_key(raw: bytes) -> str | None:
    """A key as the port's text, or None for one that is not UTF-8. The platform writes text keys
    only, so such a key is a learner's (on Kubernetes a job's login writes under its job's prefix,
    :mod:`~ffdl.adapters.heartbeats.etcd_auth`) and names nothing the platform reads: it is left
    out, where decoding it would fail every reader of the prefix, every tenant's included."""
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        log.warning("etcd key that is not UTF-8 ignored", key=repr(bytes(raw)[-200:]))
        return None


def _raise_port_error(operation: str, error: Exception) -> NoReturn:
    """Raise what the port promises for an aetcd error (see the module docstring)."""
    cause = error.__cause__
    code = cause.code() if isinstance(cause, rpc.AioRpcError) else None
    if code == rpc.StatusCode.NOT_FOUND:
        raise LookupError(f"etcd {operation}: {error}") from error
    if code in _CALLER_ERRORS and _AUTH_CHANGED not in str(error):
        raise error
    raise StoreUnavailable(f"etcd {operation} failed: {type(error).__name__}: {error}") from error


class EtcdHeartbeatStore:
    """A :class:`~ffdl.handlers.ports.HeartbeatStore` on the etcd at ``host:port``."""

    def __init__(
        self, host: str, port: int, *, timeout_s: float = 2.0, credentials: EtcdCredentials | None = None
    ) -> None:
        self._endpoint = f"{host}:{port}"
        self._timeout_s = timeout_s
        self._client = etcd_client(host, port, timeout_s, credentials)
        self._closed = False

    async def grant(self, ttl_s: float) -> int:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive TTL, got {ttl_s}")
        lease = await self._call("lease grant", self._client.lease(max(1, math.ceil(ttl_s))))
        return int(lease.id)

    async def keepalive(self, lease: int) -> bool:
        try:
            reply = await self._call("lease keepalive", self._client.refresh_lease(lease))
        except LookupError:
            return False
        if reply is None:
            raise StoreUnavailable(f"etcd at {self._endpoint} closed the keepalive stream without an answer")
        # etcd answers a keepalive for an unknown (expired, revoked) lease with a TTL of 0.
        return int(reply.TTL) > 0

    async def revoke(self, lease: int) -> None:
        with suppress(LookupError):
            await self._call("lease revoke", self._client.revoke_lease(lease))

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        """Set ``key``; raises :class:`LookupError` when ``lease`` does not exist (any more)."""
        await self._call("put", self._client.put(key.encode(), value, lease=lease))

    async def delete(self, key: str) -> None:
        await self._call("delete", self._client.delete(key.encode()))

    async def snapshot(self, prefix: str) -> Snapshot:
        response = await self._call("range", self._client.get_prefix(prefix.encode()))
        values = {key: bytes(kv.value) for kv in response if (key := _text_key(kv.key)) is not None}
        return Snapshot(values=values, revision=int(response.header.revision))

    async def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        if start_revision < 1:
            raise ValueError(f"revisions start at 1, got {start_revision}")
        stream = await self._call(
            "watch", self._client.watch_prefix(prefix.encode(), start_revision=start_revision)
        )
        events = aiter(stream)
        next_event: asyncio.Future[Any] = asyncio.ensure_future(anext(events))
        try:
            while True:
                done, _ = await asyncio.wait({next_event}, timeout=self._timeout_s)
                if not done:
                    await self._call("watch probe", self._client.get(prefix.encode()))
                    continue
                try:
                    event = next_event.result()
                except StopAsyncIteration:
                    if self._closed:
                        return
                    raise StoreUnavailable(
                        f"etcd at {self._endpoint} ended the watch on {prefix!r}"
                    ) from None
                except aetcd.ClientError as error:
                    log.info("etcd watch broken", prefix=prefix, error=str(error))
                    _raise_port_error("watch", error)
                next_event = asyncio.ensure_future(anext(events))
                key = _text_key(event.kv.key)
                if key is None:
                    continue
                yield WatchEvent(
                    kind=_WATCH_KINDS[event.kind],
                    key=key,
                    value=bytes(event.kv.value),
                    revision=int(event.kv.mod_revision),
                )
        finally:
            next_event.cancel()
            if not self._closed:
                with suppress(TimeoutError, aetcd.ClientError):
                    async with asyncio.timeout(self._timeout_s):
                        await stream.cancel()

    async def close(self) -> None:
        self._closed = True
        await self._client.close()

    async def _call(self, operation: str, request: Awaitable[Any]) -> Any:
        try:
            return await request
        except aetcd.ClientError as error:
            if await forget_expired_token(self._client, error):
                raise StoreUnavailable(
                    f"etcd {operation}: the auth token expired; logging in again"
                ) from error
            _raise_port_error(operation, error)
