"""Leader election for singleton roles on etcd, with fencing tokens (architecture §5).

A role is led by whoever holds the key ``/ffdl/leaders/<role>``. The key is bound to the leader's
lease and is created by a transaction that succeeds only while the key is absent (its
``create_revision`` is 0), so there is at most one holder at a time; it disappears when the leader
resigns (revokes its lease) or stops renewing it for a TTL (dies, hangs, loses etcd).

The fencing token of a term is the key's ``create_revision``: etcd's revision grows with every
write to the cluster, and a new key can only be created after the previous one was deleted, so
every new leader's token is larger than every earlier one. ``current_token`` is a linearizable read
of it, which is what a job's owner compares a fenced command's token with. Tokens only grow for as
long as the etcd cluster keeps its data: an etcd rebuilt from nothing starts its revisions again.

A candidate tries the transaction; when the key is held it watches the key from the revision it
saw and tries again as soon as the key is deleted (and at least every TTL, so a lost watch event
cannot keep it waiting). While it leads, a keeper task renews the lease every third of the TTL and
checks that the key is still its own. Leadership is judged conservatively, from this process's
side: ``is_leader`` is true only until a safety margin before the lease could have expired in etcd
(the time the last successful renewal was *sent*, plus the TTL etcd granted, less a quarter of the
TTL). So a leader that cannot reach etcd stops believing it leads before etcd can expire its lease
and elect another; a term, once lost, stays lost, and the role campaigns for a new one.

Concurrency: one aetcd client (one gRPC channel) per election object, used from the event loop
that first uses it; one keeper task per role led. Every etcd call carries a deadline, so a frozen
etcd raises :class:`ElectionUnavailableError` after ``timeout_s`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

import aetcd
import structlog
from aetcd import rpc
from aetcd.rtypes import EventKind

from ffdl.adapters.heartbeats.etcd_auth import EtcdCredentials, etcd_client, forget_expired_token
from ffdl.handlers.aio import Backoff

log = structlog.get_logger(__name__)

LEADERS_PREFIX = "/ffdl/leaders/"
_RETRY_MAX_S = 2.0

_Value = TypeVar("_Value")


class ElectionUnavailableError(ConnectionError):
    """etcd cannot be reached now: nobody can tell who leads; callers retry."""


def leader_key(role: str) -> str:
    return f"{LEADERS_PREFIX}{role}"


@dataclass(slots=True)
class _Term:
    """One term of leadership of one role held by this process."""

    lease: int
    token: int
    valid_until: float
    keeper: asyncio.Task[None] | None = None
    lost: bool = False

    def lapsed(self, now: float) -> bool:
        """Whether the term is over; once over it stays over, whatever a late renewal says."""
        if now >= self.valid_until:
            self.lost = True
        return self.lost


class EtcdElection:
    """The :class:`~ffdl.handlers.ports.Election` port on the etcd at ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        ttl_s: float = 10.0,
        *,
        timeout_s: float = 2.0,
        identity: str | None = None,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a leader lease needs a positive TTL, got {ttl_s}")
        self._endpoint = f"{host}:{port}"
        self._ttl_s = max(1, math.ceil(ttl_s))
        self._timeout_s = timeout_s
        self._identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self._client = etcd_client(host, port, timeout_s, credentials)
        self._terms: dict[str, _Term] = {}

    # -- the port -------------------------------------------------------------------------------

    async def campaign(self, role: str) -> int:
        term = self._terms.get(role)
        if term is not None and not term.lapsed(time.monotonic()):
            return term.token
        if term is not None:
            await self.resign(role)
        backoff = Backoff(0.1, _RETRY_MAX_S)
        while True:
            try:
                held_at = await self._try_to_lead(role)
                if role in self._terms:
                    return self._terms[role].token
                await self._await_vacancy(role, held_at)
                backoff.reset()
            except ElectionUnavailableError as error:
                delay = backoff.next_delay()
                log.warning(
                    "etcd unreachable while campaigning", role=role, error=str(error), retry_in_s=delay
                )
                await asyncio.sleep(delay)

    async def current_token(self, role: str) -> int | None:
        found = await self._call("get leader", self._client.get(leader_key(role).encode()))
        return None if found is None else int(found.create_revision)

    async def is_leader(self, role: str, token: int) -> bool:
        term = self._terms.get(role)
        return term is not None and term.token == token and not term.lapsed(time.monotonic())

    async def resign(self, role: str) -> None:
        term = self._terms.pop(role, None)
        if term is None:
            return
        if term.keeper is not None:
            term.keeper.cancel()
            await asyncio.gather(term.keeper, return_exceptions=True)
        # Revoking deletes the key at once; when etcd is unreachable the lease expires on its own.
        with suppress(ElectionUnavailableError, LookupError):
            await self._call("revoke", self._client.revoke_lease(term.lease))
        log.info("resigned leadership", role=role, fencing_token=term.token)

    async def close(self) -> None:
        for role in list(self._terms):
            await self.resign(role)
        await self._client.close()

    # -- campaigning ------------------------------------------------------------------------------

    async def _try_to_lead(self, role: str) -> int:
        """One attempt: lead ``role`` (recorded in ``_terms``), or return the revision the key was seen at."""
        key = leader_key(role).encode()
        sent_at = time.monotonic()
        lease = await self._call("lease grant", self._client.lease(self._ttl_s))
        txn = self._client.transactions
        try:
            won, responses = await self._call(
                "campaign",
                self._client.transaction(
                    compare=[txn.create(key) == 0],
                    success=[txn.put(key, self._identity.encode(), lease=lease.id)],
                    failure=[txn.get(key)],
                ),
            )
        except BaseException:
            with suppress(ElectionUnavailableError, LookupError):
                await self._call("revoke", self._client.revoke_lease(lease.id))
            raise
        if won:
            token = int(responses[0].response_put.header.revision)
            term = _Term(
                lease=int(lease.id), token=token, valid_until=self._valid_until(sent_at, int(lease.ttl))
            )
            self._terms[role] = term
            term.keeper = asyncio.create_task(self._keep(role, term), name=f"ffdl-leader-keeper:{role}")
            log.info(
                "elected leader", role=role, fencing_token=token, ttl_s=self._ttl_s, identity=self._identity
            )
            return token
        with suppress(ElectionUnavailableError, LookupError):
            await self._call("revoke", self._client.revoke_lease(lease.id))
        held = responses[0]
        if not held:  # deleted between the comparison and the read: try again at once
            return 0
        _, current = held[0]
        log.debug(
            "role is led by another",
            role=role,
            leader=bytes(current.value).decode(errors="replace"),
            fencing_token=int(current.create_revision),
        )
        return int(current.header.revision)

    async def _await_vacancy(self, role: str, seen_at: int) -> None:
        """Return once the key was deleted after revision ``seen_at``, or after a TTL at most."""
        if seen_at == 0:
            return
        key = leader_key(role).encode()
        with suppress(TimeoutError):
            async with asyncio.timeout(self._ttl_s):
                watch = await self._call("watch leader", self._client.watch(key, start_revision=seen_at + 1))
                try:
                    async for event in watch:
                        if event.kind == EventKind.DELETE:
                            return
                except aetcd.ClientError as error:
                    raise ElectionUnavailableError(f"etcd watch of {key!r} broke: {error}") from error
                finally:
                    with suppress(aetcd.ClientError):
                        await watch.cancel()

    # -- leading ----------------------------------------------------------------------------------

    async def _keep(self, role: str, term: _Term) -> None:
        """Renew the lease every TTL/3 and check the key is still ours; mark the term lost otherwise."""
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            reason = await self._renew(role, term)
            if reason or term.lapsed(time.monotonic()):
                term.lost = True
                log.warning(
                    "leadership lost", role=role, fencing_token=term.token, reason=reason or "not renewed"
                )
                return

    async def _renew(self, role: str, term: _Term) -> str:
        """One renewal, bounded by the term's validity; returns why the term is lost, or ''."""
        sent_at = time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, term.valid_until - sent_at)):
                reply = await self._call("lease keepalive", self._client.refresh_lease(term.lease))
                if reply is None or int(reply.TTL) <= 0:
                    return "the lease expired"
                held = await self._call("get leader", self._client.get(leader_key(role).encode()))
        except TimeoutError:
            return "the lease could not be renewed in time"
        except LookupError:
            return "the lease expired"
        except ElectionUnavailableError as error:
            log.info("leader lease not renewed; retrying", role=role, error=str(error))
            return ""
        if held is None or int(held.create_revision) != term.token:
            return "the leader key is gone or another's"
        term.valid_until = self._valid_until(sent_at, int(reply.TTL))
        return ""

    def _valid_until(self, sent_at: float, granted_ttl_s: int) -> float:
        """Until when this process may believe it leads: well before etcd may expire the lease."""
        return sent_at + granted_ttl_s - self._ttl_s / 4

    async def _call(self, operation: str, request: Awaitable[_Value]) -> _Value:
        try:
            return await request
        except aetcd.ClientError as error:
            await forget_expired_token(self._client, error)  # then unavailable for now: callers retry
            cause = error.__cause__
            code = cause.code() if isinstance(cause, rpc.AioRpcError) else None
            if code == rpc.StatusCode.NOT_FOUND:
                raise LookupError(f"etcd {operation}: {error}") from error
            raise ElectionUnavailableError(f"etcd {operation} at {self._endpoint} failed: {error}") from error
