"""The API server's HTTP/1.1 protocol: uvicorn's (httptools where it is installed, as uvicorn itself
would choose, else h11) with a deadline for request headers and a cap on open connections, which
uvicorn does not enforce.

uvicorn closes a connection that idles *between* requests (``timeout_keep_alive``), but not one that
has begun a request and never finishes its headers: any byte received cancels the keep-alive timer,
and nothing arms it again until a response is complete. A client that opens connections and sends a
header line now and then (slowloris) holds them, and the process's file descriptors, forever.
``limit_concurrency`` does not help either: it answers 503 to a *complete* request past the limit,
and counts nothing for a connection still sending its headers.

So each connection gets ``header_timeout_s`` to send a request's headers whole, from the moment it
opens or from the first byte of its next request; past it the connection is closed. Once the headers
are in, the deadline is off: a body is bounded by the body limit (:class:`ffdl.api.app.BodyLimit`),
a response stream by the followers' caps. And a process keeps at most ``max_connections`` open
connections: one more is closed as soon as it is accepted, before it costs a parser.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Literal

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger(__name__)


class _Guard(asyncio.Protocol):
    """What both protocols add (a mixin before uvicorn's protocol class): the connection cap and the
    header deadline. A subclass says when a request's headers are awaited (:meth:`_awaiting_headers`)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    _headers_due: asyncio.TimerHandle | None = None

    def _awaiting_headers(self) -> bool:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        protocol: Any = self  # uvicorn's protocol, which this class is mixed into
        if len(protocol.connections) > self.max_connections:
            limit = self.max_connections
            log.warning("connection refused: too many open", client=_client(protocol), limit=limit)
            transport.close()
            return
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Arm the deadline while a request's headers are awaited, and take it off once they are in."""
        protocol: Any = self
        if self._awaiting_headers() and not protocol.transport.is_closing():
            if self._headers_due is None:
                self._headers_due = protocol.loop.call_later(self.header_timeout_s, self._headers_late)
        else:
            self._stop_watching()

    def _stop_watching(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        protocol: Any = self
        if self._awaiting_headers() and not protocol.transport.is_closing():
            log.warning(
                "connection closed: request headers not sent in time",
                client=_client(protocol),
                timeout_s=self.header_timeout_s,
            )
            protocol.transport.close()


class _GuardedH11(_Guard, H11Protocol):
    def _awaiting_headers(self) -> bool:
        # h11 keeps the peer IDLE until a request's headers are parsed whole
        return self.conn.their_state is h11.IDLE


def _httptools_protocol() -> type[asyncio.Protocol] | None:
    """The guarded httptools protocol, where httptools is installed."""
    if importlib.util.find_spec("httptools") is None:
        return None
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415

    class GuardedHttpTools(_Guard, HttpToolsProtocol):
        #: A request has begun (or the connection is new) and its headers are not all in.
        _awaiting = True

        def _awaiting_headers(self) -> bool:
            return self._awaiting

        def on_message_begin(self) -> None:
            self._awaiting = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._awaiting = False
            super().on_headers_complete()

    return GuardedHttpTools


def guarded_protocol(
    header_timeout_s: float, max_connections: int, *, parser: Literal["auto", "h11"] = "auto"
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (its ``http`` setting) with these bounds; ``parser``: httptools where
    installed (``auto``, uvicorn's own choice), or h11."""
    base = (_httptools_protocol() if parser == "auto" else None) or _GuardedH11
    bounds = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
    return type(f"{base.__name__}Bounded", (base,), bounds)


def _client(protocol: Any) -> str:
    client = protocol.client
    return f"{client[0]}:{client[1]}" if client else "unknown"
